import TandemWire

extension ServerCore {
    /// How much of the collection the session's user may read, and the documents that decided
    /// it. Everything on an open server.
    func readScope(_ collection: CollectionPath, _ session: Session) throws -> (
        scope: AccessControl.ReadScope, dependencies: Set<DocumentKey>
    ) {
        guard let access = configuration.access else { return (.all, []) }
        var dependencies: Set<DocumentKey> = []
        let scope = try access.readScope(in: collection, identity: session.identity) { collection, id in
            dependencies.insert(DocumentKey(collection: collection, id: id))
            return try liveFields(collection, id)
        }
        if scope == .perDocument {
            // What the rules that look at each document read besides it (`doc(…)`): a change
            // to one of those may change which documents the user may read.
            for (collection, id) in access.documentsRead(byPerDocumentRulesOf: collection) {
                dependencies.insert(DocumentKey(collection: collection, id: id))
            }
        }
        return (scope, dependencies)
    }

    /// Whether the session's user may read a live document with these fields, under rules that
    /// look at each document.
    ///
    /// - Parameter reads: Remembers the documents the rules read with `doc(…)`, so that a view
    ///   of many documents reads each of them once (see ``decideAccess(for:)``).
    func mayRead(
        _ fields: JSONObject, in collection: CollectionPath, _ session: Session, reads: DocumentReads? = nil
    ) throws -> Bool {
        guard let access = configuration.access else { return true }
        return try access.allows(.read, in: collection, identity: session.identity, resource: fields) {
            collection, id in
            guard let reads else { return try liveFields(collection, id) }
            return try reads.fields(DocumentKey(collection: collection, id: id)) { try liveFields(collection, id) }
        }
    }

    private func liveFields(_ collection: CollectionPath, _ id: DocumentID) throws -> JSONObject? {
        try store.document(in: collection, id: id).flatMap { $0.deleted ? nil : try $0.fields }
    }

    /// Decides how much of its collection the listener may read and follows the documents the
    /// decision depends on, so that a change to one of them decides again. A listener on a
    /// query may read a collection document by document: its view then holds only the ones its
    /// user may read. A listener on a whole collection may not (it has no way to hear that a
    /// document left it).
    ///
    /// When following a document's collection begins only now, the decision is made once more
    /// after: a change committed between the first decision and the start of following (by
    /// another node) is then either seen by the second decision or read by the feed.
    ///
    /// - Returns: The scope; whether it lets this listener read, ``Listener/may(read:)`` says.
    func decideAccess(for listener: Listener) throws -> AccessControl.ReadScope {
        func decide() throws -> AccessControl.ReadScope {
            let (scope, dependencies) = try readScope(listener.collection, listener.session)
            return try track(listener, dependencies: listener.may(read: scope) ? dependencies : []) ? decide() : scope
        }
        let scope = try decide()
        if let view = listener.view {
            // The documents the rules read with `doc(…)` are the listener's dependencies: a change
            // to one decides again, with a new closure. Until then they are read once.
            let (collection, session, reads) = (listener.collection, listener.session, DocumentReads())
            view.readable =
                scope == .perDocument
                ? { [unowned self] in try mayRead($0, in: collection, session, reads: reads) } : nil
        }
        return scope
    }

    /// How errors name the caller.
    func who(_ session: Session) -> String {
        AccessControl.describe(session.user)
    }

    /// Records what a listener's permission depends on.
    ///
    /// - Returns: True when the node started following a collection for it.
    @discardableResult
    func track(_ listener: Listener, dependencies: Set<DocumentKey>) throws -> Bool {
        for key in listener.accessDependencies.subtracting(dependencies) {
            guard let follower = followed[key.collection] else { continue }
            follower.watching[key.id]?[ObjectIdentifier(listener)] = nil
            if follower.watching[key.id]?.isEmpty == true { follower.watching[key.id] = nil }
            unfollowIfIdle(key.collection)
        }
        var started = false
        for key in dependencies.subtracting(listener.accessDependencies) {
            if try follow(key.collection) { started = true }
            followed[key.collection]!.watching[key.id, default: [:]][ObjectIdentifier(listener)] = listener
        }
        listener.accessDependencies = dependencies
        return started
    }

    /// Decides again for the listeners whose permission depended on a document that changed;
    /// a listener no longer allowed gets `permission-denied` and hears nothing more. Runs before
    /// the feed round that brought the change sends anything, so that it does not hear the
    /// commit that revoked it either.
    func recheckAccess(after changed: [DocumentKey]) {
        guard configuration.access != nil else { return }
        var affected: [ObjectIdentifier: Listener] = [:]
        for key in changed {
            guard let watchers = followed[key.collection]?.watching[key.id] else { continue }
            affected.merge(watchers) { first, _ in first }
        }
        redecide(Array(affected.values))
    }

    /// Decides again for each listener; one no longer allowed gets `permission-denied` and
    /// hears nothing more, one whose documents may have changed reads its view again.
    func redecide(_ listeners: [Listener]) {
        for listener in listeners where !listener.isCancelled {
            let wasPerDocument = listener.view?.readable != nil
            let scope: AccessControl.ReadScope
            do { scope = try decideAccess(for: listener) } catch {
                listener.session.send(internalError(error, target: listener.target))
                scope = .none
            }
            if !listener.may(read: scope) {
                listener.session.send(
                    WireError(
                        .permissionDenied,
                        "\(who(listener.session)) may no longer read \(listener.collection); the listener was stopped",
                        target: listener.target))
                listener.session.listeners[listener.target] = nil
                remove(listener)
            } else if scope == .perDocument || wasPerDocument {
                // Which documents the user may read may have changed: the view is read again.
                refreshView(of: listener)
            }
        }
    }
}

/// The documents read rules read with `doc(…)`, each read once: for one decision about a
/// listener. Confined to the core queue.
final class DocumentReads {
    private var known: [DocumentKey: JSONObject?] = [:]

    func fields(_ key: DocumentKey, read: () throws -> JSONObject?) rethrows -> JSONObject? {
        if let fields = known[key] { return fields }
        let fields = try read()
        known[key] = fields
        return fields
    }
}
