import TandemWire

extension ServerCore {
    /// Whether the session's user may read the collection, and the documents that decided it.
    /// Always allowed on an open server.
    func mayRead(_ collection: CollectionPath, _ session: Session) throws -> (
        allowed: Bool, dependencies: Set<DocumentKey>
    ) {
        guard let access = configuration.access else { return (true, []) }
        var dependencies: Set<DocumentKey> = []
        let allowed = try access.allows(.read, in: collection, user: session.user) { collection, id in
            dependencies.insert(DocumentKey(collection: collection, id: id))
            return try store.document(in: collection, id: id).flatMap { $0.deleted ? nil : try $0.fields }
        }
        return (allowed, dependencies)
    }

    /// Decides whether the listener may read its collection, and follows the documents the
    /// decision depends on, so that a change to one of them decides again.
    ///
    /// When following a document's collection begins only now, the decision is made once more
    /// after: a change committed between the first decision and the start of following (by
    /// another node) is then either seen by the second decision or read by the feed.
    ///
    /// - Returns: Whether the listener may read.
    func decideAccess(for listener: Listener) throws -> Bool {
        var decision = try mayRead(listener.collection, listener.session)
        if try track(listener, dependencies: decision.allowed ? decision.dependencies : []) {
            decision = try mayRead(listener.collection, listener.session)
            try track(listener, dependencies: decision.allowed ? decision.dependencies : [])
        }
        return decision.allowed
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
        for listener in affected.values where !listener.isCancelled {
            let allowed: Bool
            do { allowed = try decideAccess(for: listener) } catch {
                listener.session.send(internalError(error, target: listener.target))
                allowed = false
            }
            if allowed { continue }
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
