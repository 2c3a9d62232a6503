import Dispatch
import TandemWire

extension ServerCore {
    /// Starts a listener: checks its resume token, then catches it up page by page.
    func listen(_ session: Session, _ listen: ClientMessage.Listen) {
        let target = listen.target
        guard session.listeners[target] == nil else {
            session.send(
                WireError(.badMessage, "target '\(target)' is already listening on this connection", target: target))
            return
        }
        let limit = configuration.limits.maxListenersPerConnection
        guard session.listeners.count < limit else {
            session.send(
                WireError(
                    .tooManyListeners, "a connection may hold at most \(limit) listeners; unlisten one first",
                    target: target))
            return
        }

        var position: Int64 = 0
        if let tokenText = listen.resumeToken {
            guard let token = ResumeToken(tokenText) else {
                session.send(
                    WireError(
                        .badMessage,
                        "resumeToken '\(tokenText.prefix(80))' is not a token this server issued; listen without one",
                        target: target))
                return
            }
            let bounds: (last: Int64, horizon: Int64)
            do { bounds = try store.feedBounds(of: listen.collection) } catch {
                session.send(internalError(error, target: target))
                return
            }
            if let reason = Self.resetReason(token, epoch: store.epoch, bounds: bounds) {
                session.send(.reset(.init(target: target, reason: reason)))
            } else {
                position = token.sequence
            }
        }

        let dependencies: Set<String>
        do {
            let decision = try mayRead(listen.collection, session)
            guard decision.allowed else {
                session.send(
                    WireError(
                        .permissionDenied, "\(who(session)) may not read \(listen.collection)", target: target))
                return
            }
            dependencies = decision.dependencies
        } catch {
            session.send(internalError(error, target: target))
            return
        }

        let listener = Listener(session: session, target: target, collection: listen.collection, position: position)
        track(listener, dependencies: dependencies)
        session.listeners[target] = listener
        listeners[listen.collection, default: []].append(listener)
        advance(listener)
    }

    /// Why a token cannot resume, or nil when it can.
    static func resetReason(_ token: ResumeToken, epoch: String, bounds: (last: Int64, horizon: Int64)) -> String? {
        if token.epoch != epoch {
            return "the resume token is from another database; the full snapshot follows"
        }
        if token.sequence > bounds.last {
            return
                "the resume token is ahead of this collection (was the database restored?); the full snapshot follows"
        }
        if token.sequence < bounds.horizon {
            return
                "deletes after the resume token were purged (past the tombstone retention); the full snapshot follows"
        }
        return nil
    }

    func unlisten(_ session: Session, _ target: String) {
        guard let listener = session.listeners.removeValue(forKey: target) else { return }
        remove(listener)
    }

    func remove(_ listener: Listener) {
        listener.isCancelled = true
        track(listener, dependencies: [])
        listeners[listener.collection]?.removeAll { $0 === listener }
        if listeners[listener.collection]?.isEmpty == true { listeners[listener.collection] = nil }
    }

    /// Sends the next catch-up page, then either goes live or schedules the page after it.
    ///
    /// Between pages the server waits for the connection's queue to drain to one page, so a
    /// new client loading a large collection holds at most a couple of pages in memory.
    func advance(_ listener: Listener) {
        guard !listener.isCancelled, !listener.isLive, !listener.session.isClosed else { return }
        let page: FeedPage
        do {
            page = try store.page(
                of: listener.collection, after: listener.position, for: listener.session.clientId?.rawValue,
                limit: configuration.snapshotPageSize, maxBytes: configuration.snapshotPageBytes)
        } catch {
            listener.session.send(internalError(error, target: listener.target))
            return
        }
        if listener.isResuming && listener.position < page.horizon {
            // Tombstones this client needs were purged while it caught up: start over.
            listener.session.send(
                .reset(
                    .init(
                        target: listener.target,
                        reason: "deletes were purged while catching up; the full snapshot follows")))
            listener.position = 0
            listener.isResuming = false
            advance(listener)
            return
        }
        listener.position = page.position
        listener.isLive = page.isLast
        listener.session.send(
            .snapshot(
                .init(
                    target: listener.target, changes: page.changes, resumeToken: token(page.position), initial: true,
                    hasMore: !page.isLast)))
        guard !page.isLast else { return }
        if listener.session.connection.notifyWhenDrained(below: configuration.snapshotPageBytes) {
            listener.awaitsDrain = true
        } else {
            queue.async { [self] in advance(listener) }
        }
    }

    /// Sends committed changes to every live listener of their collections, in commit order.
    func fanOut(_ changes: [CommittedChange]) {
        var start = 0
        while start < changes.count {
            let collection = changes[start].collection
            var end = start + 1
            while end < changes.count && changes[end].collection == collection { end += 1 }
            if let audience = listeners[collection] {
                for chunk in chunks(of: changes[start..<end]) {
                    let position = chunk.last!.sequence
                    let entries = chunk.map(\.change)
                    for listener in audience where listener.isLive {
                        delayIfInjected(listener.session)
                        listener.position = position
                        listener.session.send(
                            .snapshot(
                                .init(
                                    target: listener.target, changes: entries, resumeToken: token(position),
                                    initial: false)))
                    }
                }
            }
            start = end
        }
    }

    /// Splits one commit's changes of a collection into frames of at most about
    /// `snapshotPageBytes`, so that a large write still reaches clients in frames they accept.
    private func chunks(of changes: ArraySlice<CommittedChange>) -> [ArraySlice<CommittedChange>] {
        var chunks: [ArraySlice<CommittedChange>] = []
        var start = changes.startIndex
        var bytes = 0
        for index in changes.indices {
            let size = changes[index].size
            if index > start && bytes + size > configuration.snapshotPageBytes {
                chunks.append(changes[start..<index])
                start = index
                bytes = 0
            }
            bytes += size
        }
        chunks.append(changes[start..<changes.endIndex])
        return chunks
    }

    /// Holds a connection's outgoing messages before a delivery, when tests hold deliveries
    /// or the fault plan delays this one.
    private func delayIfInjected(_ session: Session) {
        if holdsDeliveries {
            session.hold()
            return
        }
        guard let faults, !session.isHolding, faults.delaysDelivery() else { return }
        session.hold()
        let delay = DispatchTimeInterval.milliseconds(Int(faults.plan.deliveryDelay.milliseconds))
        queue.asyncAfter(deadline: .now() + delay) { [self, weak session] in
            if !holdsDeliveries { session?.release() }
        }
    }

    func token(_ sequence: Int64) -> String {
        ResumeToken(epoch: store.epoch, sequence: sequence).description
    }
}
