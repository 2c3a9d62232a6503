import GRDB
import TandemWire

extension ServerCore {
    /// Whether the session's user may read the collection, and the documents that decided it
    /// ("collection/id"). Always allowed on an open server.
    func mayRead(_ collection: CollectionPath, _ session: Session) throws -> (allowed: Bool, dependencies: Set<String>)
    {
        guard let access = configuration.access else { return (true, []) }
        var dependencies: Set<String> = []
        let allowed = try access.allows(.read, in: collection, user: session.user) { collection, id in
            dependencies.insert("\(collection)/\(id)")
            return try store.document(in: collection, id: id).flatMap { $0.deleted ? nil : $0.fields }
        }
        return (allowed, dependencies)
    }

    /// How errors name the caller.
    func who(_ session: Session) -> String {
        session.user.map { "user '\($0)'" } ?? "an anonymous client"
    }

    /// The check each op of a write passes inside its transaction, before it is applied: on
    /// an open server, none.
    func writeAuthorization(for session: Session) -> DocumentStore.Authorization? {
        guard let access = configuration.access else { return nil }
        let user = session.user
        let who = who(session)
        return { index, op, stored, db in
            let operation: AccessControl.Operation =
                switch op.kind {
                case .create: .create
                case .update: .update
                case .delete: .delete
                }
            let resource = try stored.flatMap { $0.deleted ? nil : try $0.document.fields }
            let allowed = try access.allows(
                operation, in: op.collection, user: user, resource: resource,
                request: op.kind == .delete ? nil : op.fields ?? [:]
            ) { collection, id in
                try DocumentStore.fetchDocument(db, collection, id).flatMap {
                    $0.deleted ? nil : try $0.document.fields
                }
            }
            guard allowed else {
                throw WireError(
                    .permissionDenied, "ops[\(index)]: \(who) may not \(operation.rawValue) in \(op.collection)",
                    op: index)
            }
        }
    }

    /// Records what a listener's permission depends on.
    func track(_ listener: Listener, dependencies: Set<String>) {
        for key in listener.accessDependencies.subtracting(dependencies) {
            accessDependents[key]?[ObjectIdentifier(listener)] = nil
            if accessDependents[key]?.isEmpty == true { accessDependents[key] = nil }
        }
        for key in dependencies { accessDependents[key, default: [:]][ObjectIdentifier(listener)] = listener }
        listener.accessDependencies = dependencies
    }

    /// Decides again for the listeners whose permission depended on a document this commit
    /// changed; a listener no longer allowed gets `permission-denied` and hears nothing more.
    /// Runs before the commit's fan-out, so that it does not hear this commit either.
    func recheckAccess(after changes: [CommittedChange]) {
        guard configuration.access != nil, !accessDependents.isEmpty else { return }
        var affected: [ObjectIdentifier: Listener] = [:]
        for change in changes {
            let key = "\(change.collection)/\(change.change.document.id)"
            affected.merge(accessDependents[key] ?? [:]) { first, _ in first }
        }
        for listener in affected.values where !listener.isCancelled {
            let decision: (allowed: Bool, dependencies: Set<String>)
            do { decision = try mayRead(listener.collection, listener.session) } catch {
                listener.session.send(internalError(error, target: listener.target))
                decision = (false, [])
            }
            if decision.allowed {
                track(listener, dependencies: decision.dependencies)
                continue
            }
            listener.session.send(
                WireError(
                    .permissionDenied,
                    "\(who(listener.session)) may no longer read \(listener.collection); the listener was stopped",
                    target: listener.target))
            listener.session.listeners[listener.target] = nil
            remove(listener)
        }
    }
}
