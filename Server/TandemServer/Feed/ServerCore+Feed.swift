import Dispatch
import TandemSocket
import TandemWire

extension ServerCore {
    /// Starts a listener: checks its resume token and the user's right to read, then catches
    /// it up page by page.
    func listen(_ session: Session, _ listen: ClientMessage.Listen) {
        Confinement.check(queue)
        let target = listen.target
        if let refusal = refusal(of: listen, on: session) {
            session.send(refusal)
            return
        }
        // Checked in `refusal(of:on:)`: a token this server issued, or none.
        let token = listen.resumeToken.flatMap(ResumeToken.init)

        // Access first: a user who may not read the collection learns nothing of it, not even
        // whether a token is current.
        let listener = Listener(session: session, target: target, collection: listen.collection, position: 0)
        listener.view = listen.query.map { QueryView(query: $0, collection: listen.collection) }
        listener.excludesOwnWrites = listen.excludesOwnWrites && listener.view == nil
        listener.catchUpLeavesOutOwnWrites = listener.excludesOwnWrites
        do {
            let scope = try decideAccess(for: listener)
            guard listener.may(read: scope) else {
                let message =
                    scope == .perDocument
                    ? "\(who(session)) may read only some documents of \(listen.collection) (its read rule looks "
                        + "at each one): listen with a query (\"query\": {} selects every document the user may read)"
                    : "\(who(session)) may not read \(listen.collection)"
                session.send(WireError(.permissionDenied, message, target: target))
                return
            }
            if let token { try resume(listener, from: token, view: listen.view) }
            try follow(listener.collection)
            followed[listener.collection]!.add(listener)
        } catch {
            _ = try? track(listener, dependencies: [])
            session.send(internalError(error, target: target))
            return
        }
        session.listeners[target] = listener
        advance(listener)
    }

    /// Why a listen cannot start, before anything about its collection is looked at: its
    /// target already listens, the connection holds its most listeners, an injected fault, or
    /// a resume token this server did not issue.
    private func refusal(of listen: ClientMessage.Listen, on session: Session) -> WireError? {
        let target = listen.target
        guard session.listeners[target] == nil else {
            return WireError(.badMessage, "target '\(target)' is already listening on this connection", target: target)
        }
        let limit = configuration.limits.maxListenersPerConnection
        guard session.listeners.count < limit else {
            return WireError(
                .tooManyListeners, "a connection may hold at most \(limit) listeners; unlisten one first",
                target: target)
        }
        if let faults, faults.failsListen() {
            logger.warning("injected fault: listen failed", metadata: ["tandem.session": "\(session.id)"])
            return WireError(
                .internal, "injected fault: the listener failed and was not opened; listen again", target: target)
        }
        if let tokenText = listen.resumeToken, ResumeToken(tokenText) == nil {
            return WireError(
                .badMessage,
                "resumeToken '\(tokenText.prefix(80))' is not a token this server issued; listen without one",
                target: target)
        }
        return nil
    }

    /// Where a listener with a resume token starts: after the token, or (told with a `reset`)
    /// from the whole collection, when the feed no longer reaches back to the token or a query
    /// listener resumes without the ids of its view.
    private func resume(_ listener: Listener, from token: ResumeToken, view: [DocumentID]?) throws {
        let bounds = try store.feedBounds(of: listener.collection)
        // A query listener that sends its view needs no tombstones: a document of the view that
        // is gone altogether is removed from it all the same.
        let needsTombstones = listener.view == nil || view == nil
        if let reason = Self.resetReason(token, epoch: store.epoch, bounds: bounds, needsTombstones: needsTombstones) {
            listener.session.send(.reset(.init(target: listener.target, reason: reason)))
            listener.catchUpLeavesOutOwnWrites = false
        } else if listener.view == nil {
            listener.position = token.sequence
        } else if let view {
            listener.position = token.sequence
            listener.resumedView = view
        } else {
            // Without the ids of its view, the server cannot tell which documents left it.
            listener.session.send(
                .reset(
                    .init(
                        target: listener.target,
                        reason: "a query listener resumes exactly with the ids of its view (\"view\"); "
                            + "the whole view follows")))
        }
    }

    /// Why a token cannot resume, or nil when it can.
    static func resetReason(_ token: ResumeToken, epoch: String, bounds: FeedBounds, needsTombstones: Bool = true)
        -> String?
    {
        if token.epoch != epoch {
            return "the resume token is from another database; the full snapshot follows"
        }
        if token.sequence > bounds.last {
            return
                "the resume token is ahead of this collection (was the database restored?); the full snapshot follows"
        }
        if needsTombstones && token.sequence < bounds.horizon {
            return
                "deletes after the resume token were purged (past the tombstone retention); the full snapshot follows"
        }
        return nil
    }

    func unlisten(_ session: Session, _ target: String) {
        Confinement.check(queue)
        guard let listener = session.listeners.removeValue(forKey: target) else { return }
        remove(listener)
    }

    func remove(_ listener: Listener) {
        Confinement.check(queue)
        listener.isCancelled = true
        _ = try? track(listener, dependencies: [])
        followed[listener.collection]?.remove(listener)
        unfollowIfIdle(listener.collection)
    }

    /// Starts following a collection's feed from its current end, unless this node follows it
    /// already.
    ///
    /// - Returns: True when the node started following it now.
    @discardableResult
    func follow(_ collection: CollectionPath) throws -> Bool {
        guard followed[collection] == nil else { return false }
        followed[collection] = FeedFollower(head: try store.feedBounds(of: collection).last)
        return true
    }

    func unfollowIfIdle(_ collection: CollectionPath) {
        if followed[collection]?.isIdle == true { followed[collection] = nil }
    }

    // MARK: - Catching up

    /// Sends the next catch-up page, then either goes live or schedules the page after it.
    ///
    /// Between pages the server waits for the connection's queue to drain to one page, so a
    /// new client loading a large collection holds at most a couple of pages in memory.
    ///
    /// The listener goes live once a page reaches the end of the feed and the node's own
    /// reading of the feed (its follower's head) is not ahead of it; from then on every feed
    /// round sends it what comes after its position, so nothing falls between the two.
    func advance(_ listener: Listener) {
        Confinement.check(queue)
        guard !listener.isCancelled, !listener.isLive, !listener.session.isClosed else { return }
        if let view = listener.view {
            catchUp(listener, view)
            return
        }
        let page: FeedPage
        do {
            page = try store.page(
                of: listener.collection, after: listener.position, limit: configuration.snapshotPageSize,
                maxBytes: configuration.snapshotPageBytes)
        } catch {
            fail(listener, error)
            return
        }
        let startHorizon = listener.catchUpHorizon ?? page.bounds.horizon
        if listener.catchUpHorizon == nil { listener.catchUpHorizon = startHorizon }
        if listener.position > 0 && page.bounds.horizon > startHorizon && listener.position < page.bounds.horizon {
            // Deletes this client needs were purged (expired tombstones, or a reset) while it
            // caught up: start over. (A horizon that was there from the start is no reason:
            // a resume token behind it got its reset at `listen`, and a fresh listener
            // holds nothing from before it.)
            restart(listener, reason: "deletes were purged while catching up; the full snapshot follows")
            return
        }
        let follower = followed[listener.collection]
        let reachesHead = page.isLast && page.position >= (follower?.head ?? 0)
        let changes = encodeChanges(
            leavingOutAnswered(page.rows, listener), after: listener.position, for: listener.clientId,
            cutIntoFrames: false)
        listener.position = page.position
        // A listener that fell behind while live hears these pages as live snapshots.
        listener.session.send(
            frame: snapshotFrame(
                target: listener.target, changes: changes.json, resumeToken: token(page.position),
                initial: !listener.fellBehind, hasMore: !reachesHead && !listener.fellBehind))
        if reachesHead {
            wentLive(listener)
            return
        }
        if holdByHook(listener) { return }
        if listener.session.connection.notifyWhenDrained(below: configuration.snapshotPageBytes) {
            listener.awaitsDrain = true
        } else {
            queue.async { [self] in advance(listener) }
        }
    }

    /// ``ServerHooks/holdsCatchUp``: true when a test holds the listener's catch-up here; it
    /// goes on, as after a drain, when the test says so (a drain meanwhile does not end it).
    private func holdByHook(_ listener: Listener) -> Bool {
        guard let hook = configuration.hooks.holdsCatchUp else { return false }
        listener.holds += 1
        let hold = listener.holds
        let held = hook { [self] in
            queue.async { [self] in
                guard listener.heldByHook == hold else { return }
                listener.heldByHook = nil
                advance(listener)
            }
        }
        if held { listener.heldByHook = hold }
        return held
    }

    /// A catch-up page's rows without those at a state this connection's own writes were
    /// answered with (``Session/answered``), tombstones excepted (as in live snapshots).
    private func leavingOutAnswered(_ rows: [StoredDocument], _ listener: Listener) -> [StoredDocument] {
        guard listener.catchUpLeavesOutOwnWrites, let runs = listener.session.answered[listener.collection] else {
            return rows
        }
        return rows.filter { $0.deleted || !runs.contains($0.sequence) }
    }

    /// A listener caught up: from here on each commit reaches it by fan-out, and unless a
    /// listener of its connection that leaves out its own writes still catches up on the
    /// collection, what was noted of the connection's writes there for catch-up pages goes.
    private func wentLive(_ listener: Listener) {
        listener.isLive = true
        listener.fellBehind = false
        listener.catchUpHorizon = nil
        if !listener.session.notesAnswers(in: listener.collection) {
            listener.session.forgetAnswered(in: listener.collection)
        }
    }

    /// Catches a query listener up: reads each document's latest row, sends the view as
    /// additions in frames of about a page (waiting for the connection to drain between them,
    /// as a collection's catch-up does), then what was committed meanwhile, and goes live.
    private func catchUp(_ listener: Listener, _ view: QueryView) {
        do {
            if !listener.viewLoaded { try loadView(of: listener, view) }
            while !listener.pendingFrames.isEmpty {
                listener.session.send(frame: listener.pendingFrames.removeFirst())
                guard !listener.pendingFrames.isEmpty else { break }
                if holdByHook(listener) { return }
                if listener.session.connection.notifyWhenDrained(below: configuration.snapshotPageBytes) {
                    listener.awaitsDrain = true
                    return
                }
            }
            // What was committed while the frames drained; then live, with nothing between.
            guard try sendCommittedMeanwhile(to: listener, view) else { return }
        } catch {
            fail(listener, error)
            return
        }
        wentLive(listener)
    }

    /// Reads the query's view and queues its frames: the whole view, or, for a listener that
    /// resumes with the ids of its view, how it changed since its token.
    private func loadView(of listener: Listener, _ view: QueryView) throws {
        let (rows, position) = try latestRows(of: listener.collection)
        var changes: [QueryView.Change]?
        if let old = listener.resumedView {
            // What changed in the view since the token: documents written after it may have
            // moved, left it or come into it.
            let since = listener.position
            changes = try view.replace(with: rows, old: old, changed: { $0.sequence > since })
            if changes == nil {
                listener.session.send(
                    .reset(
                        .init(
                            target: listener.target,
                            reason: "the view sent is not in the query's order at the resume token; "
                                + "the whole view follows")))
            }
            listener.resumedView = nil
        }
        let since = changes == nil ? 0 : listener.position
        listener.position = position
        listener.pendingFrames = viewFrames(try changes ?? view.load(rows), for: listener, initial: true, since: since)
        listener.viewLoaded = true
    }

    /// Sends how the view changed with what was committed after it was read, page by page.
    /// Returns false when the listener waits (for the connection to drain, or restarts).
    private func sendCommittedMeanwhile(to listener: Listener, _ view: QueryView) throws -> Bool {
        while true {
            let page = try store.page(
                of: listener.collection, after: listener.position, limit: configuration.snapshotPageSize,
                maxBytes: configuration.snapshotPageBytes)
            if listener.position < page.bounds.horizon {
                restart(listener, reason: Self.resetByAdmin)
                return false
            }
            let changes = try view.apply(page.rows.map(FeedRow.init))
            let since = listener.position
            listener.position = page.position
            for frame in viewFrames(changes, for: listener, initial: false, since: since) {
                listener.session.send(frame: frame)
            }
            if page.isLast { return true }
            if listener.session.connection.notifyWhenDrained(below: configuration.snapshotPageBytes) {
                listener.awaitsDrain = true
                return false
            }
        }
    }

    /// Each document's latest row in a collection (tombstones included) and the feed position
    /// they reach. Read page by page: a document written again between two pages (by another
    /// node) shows up twice, and the later row is kept; a horizon that moves meanwhile (a
    /// reset) starts the reading over.
    private func latestRows(of collection: CollectionPath) throws -> ([FeedRow], Int64) {
        var latest: [DocumentID: StoredDocument] = [:]
        var position: Int64 = 0
        var horizon: Int64?
        while true {
            let page = try store.page(
                of: collection, after: position, limit: configuration.snapshotPageSize,
                maxBytes: configuration.snapshotPageBytes)
            if let known = horizon, page.bounds.horizon > known {
                (latest, position, horizon) = ([:], 0, page.bounds.horizon)
                continue
            }
            horizon = horizon ?? page.bounds.horizon
            for row in page.rows { latest[row.id] = row }
            position = page.position
            if page.isLast { return (try latest.values.map(FeedRow.init), position) }
        }
    }

    /// A query listener's changes as snapshot frames of about a page each; every frame but the
    /// last says `hasMore`. Nothing when a live commit left the view as it was.
    ///
    /// The last frame carries the listener's position; the ones before it carry `since`, where
    /// the listener was before these changes: a client that stores the token of a frame and is
    /// cut off before the last one resumes from before them all, and hears again of what it
    /// missed (a token of the end on a first frame would claim changes the client never got).
    func viewFrames(_ changes: [QueryView.Change], for listener: Listener, initial: Bool, since: Int64)
        -> [OutboundMessage]
    {
        var encoded = EncodedChanges(pageBytes: configuration.snapshotPageBytes)
        for change in changes {
            encoded.append(change.document, change.kind, indices: (change.oldIndex, change.newIndex))
        }
        var arrays = encoded.chunks(lastPosition: listener.position).map(\.json)
        if arrays.isEmpty {
            // An empty first view still gets its snapshot: the client learns it is current.
            guard initial else { return [] }
            arrays = [Array("[]".utf8)]
        }
        let (partial, whole) = (token(since), token(listener.position))
        return arrays.enumerated().map { index, changes in
            let hasMore = index < arrays.count - 1
            return snapshotFrame(
                target: listener.target, changes: changes, resumeToken: hasMore ? partial : whole, initial: initial,
                hasMore: hasMore)
        }
    }

    /// Ends a listener that met an error it cannot go on from (the store failed while reading
    /// for it): its client gets `error` with the target, and, as for every listener error, the
    /// listener is gone; the client listens again.
    func fail(_ listener: Listener, _ error: any Error) {
        listener.session.send(internalError(error, target: listener.target))
        if listener.session.listeners[listener.target] === listener {
            listener.session.listeners[listener.target] = nil
        }
        remove(listener)
    }

    /// Why a listener behind a horizon that moved while it was live gets a `reset`.
    static let resetByAdmin = "the collection was reset (its documents were removed); the full snapshot follows"

    /// Sends `reset` and catches the listener up again from the start of the feed.
    func restart(_ listener: Listener, reason: String) {
        listener.session.send(.reset(.init(target: listener.target, reason: reason)))
        listener.position = 0
        listener.isLive = false
        listener.fellBehind = false
        listener.catchUpHorizon = nil
        listener.heldByHook = nil
        listener.catchUpLeavesOutOwnWrites = false
        if listener.view != nil {
            listener.viewLoaded = false
            listener.pendingFrames = []
            listener.resumedView = nil
        }
        advance(listener)
    }

    // MARK: - Feed rounds

    /// Reads what is new in the feeds of `collections` (those this node follows), checks again
    /// the listeners whose access depends on a changed document, then sends the changes to
    /// every live listener. With nil, reads every followed feed (after the store's connection
    /// came back, or on a periodic check).
    ///
    /// All feeds of a round are read at one moment, and access is decided before anything of
    /// the round is sent: a listener whose permission a commit revoked hears nothing of that
    /// commit or of any later one, whichever collection they touched.
    ///
    /// - Parameter measuring: Whether the round's deliveries count in the delivery latency
    ///   (not for an import, whose documents keep the times they were written at elsewhere).
    func runFeedRound(_ collections: Set<CollectionPath>?, measuring: Bool = true) {
        Confinement.check(queue)
        let targets = collections.map { $0.filter { followed[$0] != nil } } ?? Set(followed.keys)
        guard !targets.isEmpty else { return }
        let positions = Dictionary(uniqueKeysWithValues: targets.map { ($0, followed[$0]!.head) })
        let pages: [CollectionPath: FeedPage]
        do {
            pages = try store.readFeeds(
                after: positions, limit: configuration.snapshotPageSize, maxBytes: configuration.snapshotPageBytes)
        } catch {
            logger.error("reading the change feed failed", metadata: ["tandem.error": "\(error)"])
            scheduleFeedRound(targets, after: .milliseconds(500))
            return
        }
        guard !pages.isEmpty else { return }
        var changed = pages.values.flatMap { $0.rows.map(\.key) }
        for (collection, page) in pages where page.bounds.horizon > positions[collection] ?? 0 {
            // Documents went without a tombstone (a reset): whoever's access hung on one of
            // them is decided again.
            changed +=
                (followed[collection]?.watching.keys).map { $0.map { DocumentKey(collection: collection, id: $0) } }
                ?? []
        }
        recheckAccess(after: changed)
        var unfinished: Set<CollectionPath> = []
        for collection in pages.keys.sorted() {
            guard let page = pages[collection], let follower = followed[collection] else { continue }
            deliver(page, to: follower, measuring: measuring)
            follower.head = max(follower.head, page.position)
            follower.forgetOwnWrites()
            if !page.isLast { unfinished.insert(collection) }
        }
        if !unfinished.isEmpty { scheduleFeedRound(unfinished) }
    }

    /// Runs a feed round for `collections` soon, once for all the calls that come before it.
    func scheduleFeedRound(_ collections: Set<CollectionPath>, after delay: DispatchTimeInterval? = nil) {
        pendingRound.formUnion(collections)
        guard !roundScheduled else { return }
        roundScheduled = true
        let run: @Sendable () -> Void = { [self] in
            roundScheduled = false
            let due = pendingRound
            pendingRound = []
            if !isStopped { runFeedRound(due) }
        }
        if let delay { queue.asyncAfter(deadline: .now() + delay, execute: run) } else { queue.async(execute: run) }
    }

    /// Sends a page of new changes to the collection's live listeners.
    ///
    /// Listeners at the same position hear the same changes, so those are encoded once per
    /// position (the stored JSON spliced in, not parsed), except for a client that created a
    /// document deleted since: it alone hears of that delete.
    ///
    /// A live listener behind the feed's horizon lost documents it holds without hearing of
    /// their deletes (the collection was reset through the admin API, on any node): it gets a
    /// `reset` and the full snapshot instead.
    private func deliver(_ page: FeedPage, to follower: FeedFollower, measuring: Bool) {
        let committed = measuring ? page.rows.last?.updateTime : nil
        deliverToQueries(page, follower, committed: committed)
        let ownWrites = follower.ownWrites(in: page.rows)
        var byPosition: [Int64: [Listener]] = [:]
        for listener in follower.listeners where listener.isLive && !listener.session.isClosed {
            if listener.position < page.bounds.horizon {
                restart(listener, reason: Self.resetByAdmin)
                continue
            }
            if fallsBehind(listener) { continue }
            byPosition[listener.position, default: []].append(listener)
        }
        for (position, listeners) in byPosition {
            let rows = page.rows.filter { $0.sequence > position }
            let creators = Set(
                rows.lazy.filter { $0.deleted && $0.createSequence > position }.compactMap(\.createClient))
            let shared = encodeChanges(rows, after: position, for: nil)
            for listener in listeners {
                // A listener that leaves out its connection's own writes: without them, and
                // with the new resume token alone when nothing else changed.
                let mine = listener.excludesOwnWrites ? ownWrites[listener.session.id] : nil
                let others = mine.map { mine in rows.filter { !mine.contains($0.id) } } ?? rows
                let changes =
                    others.count < rows.count || listener.clientId.map(creators.contains) == true
                    ? encodeChanges(others, after: position, for: listener.clientId) : shared
                listener.position = max(listener.position, page.position)
                var chunks = changes.chunks(lastPosition: page.position)
                if let committed, !chunks.isEmpty {
                    metrics.delivered(afterMilliseconds: configuration.clock() - committed)
                }
                if chunks.isEmpty && others.count < rows.count { chunks = [(Array("[]".utf8), page.position)] }
                for chunk in chunks {
                    delayIfInjected(listener.session)
                    listener.session.send(
                        frame: snapshotFrame(
                            target: listener.target, changes: chunk.json, resumeToken: token(chunk.position),
                            initial: false, hasMore: false))
                }
            }
        }
    }

    /// Sends a page of new changes to the live query listeners it concerns (found through the
    /// collection's ``QueryIndex``): how they change each one's view.
    ///
    /// A listener the page does not concern keeps its position: it has seen the feed up to its
    /// follower's head all the same. When the horizon moved past that head (a reset), every
    /// live query listener behind it starts over.
    private func deliverToQueries(_ page: FeedPage, _ follower: FeedFollower, committed: Int64?) {
        guard !follower.queryListeners.isEmpty else { return }
        if page.bounds.horizon > follower.head {
            for listener in follower.queryListeners.values
            where listener.isLive && !listener.session.isClosed && listener.position < page.bounds.horizon {
                restart(listener, reason: Self.resetByAdmin)
            }
        }
        let rows: [FeedRow]
        do { rows = try page.rows.map(FeedRow.init) } catch {
            // The feed goes on past this page: each live view that could not see it ends, and
            // its client listens again from its token (to the same error while the row stays).
            logger.error("a stored document is not JSON", metadata: ["tandem.error": "\(error)"])
            for listener in follower.queryListeners.values
            where listener.isLive && !listener.isCancelled && !listener.session.isClosed {
                fail(listener, error)
            }
            return
        }
        for (listener, rows) in follower.queries.candidates(for: rows)
        where listener.isLive && !listener.isCancelled && !listener.session.isClosed {
            if fallsBehind(listener) { continue }
            deliver(rows.filter { $0.row.sequence > listener.position }, upTo: page.position, to: listener, committed)
        }
    }

    /// Past this many bytes waiting to be sent to a connection, its live listeners stop being
    /// pushed to (``fallsBehind(_:)``): an eighth of the most it may hold, or two pages when
    /// more, but never more than half of it.
    var fallingBehindBytes: Int {
        let most = configuration.maxQueuedBytesPerConnection
        return min(max(2 * configuration.snapshotPageBytes, most / 8), most / 2)
    }

    /// Whether a live listener's connection holds so much still to send that the listener
    /// stops hearing commits by fan-out: it then catches up from the feed by sequence, a page at
    /// a time as the connection drains, as a resume would, and is live again once it reaches
    /// the head. So a burst of large commits never piles up in a connection's send queue for a
    /// client that reads as fast as it can (the queue's limit is for a peer that stops reading,
    /// closed after ``ServerConfiguration/stallTimeout``); nothing is sent twice, nothing
    /// skipped, and the connection stays open.
    private func fallsBehind(_ listener: Listener) -> Bool {
        guard listener.session.connection.queuedBytes >= fallingBehindBytes else { return false }
        listener.isLive = false
        listener.fellBehind = true
        metrics.listenerFellBehind()
        if listener.session.connection.notifyWhenDrained(below: configuration.snapshotPageBytes) {
            listener.awaitsDrain = true
        } else {
            queue.async { [self] in advance(listener) }
        }
        return true
    }

    /// Sends a live query listener how rows of the feed change its view.
    private func deliver(_ rows: [FeedRow], upTo position: Int64, to listener: Listener, _ committed: Int64?) {
        guard let view = listener.view else { return }
        do {
            let changes = try view.apply(rows)
            let since = listener.position
            listener.position = max(listener.position, position)
            let frames = viewFrames(changes, for: listener, initial: false, since: since)
            if let committed, !frames.isEmpty {
                metrics.delivered(afterMilliseconds: configuration.clock() - committed)
            }
            for frame in frames {
                delayIfInjected(listener.session)
                listener.session.send(frame: frame)
            }
        } catch {
            fail(listener, error)
        }
    }

    /// Reads a query listener's view again and sends how it changed: after what its user may
    /// read changed. One still catching up starts over once its view was read.
    func refreshView(of listener: Listener) {
        guard let view = listener.view, !listener.isCancelled, !listener.session.isClosed else { return }
        guard listener.isLive else {
            if listener.viewLoaded {
                restart(
                    listener,
                    reason: "what this listener may read changed while its view loaded; the whole view follows")
            }
            return
        }
        // A live listener has seen its follower's head, whether or not a write concerned it.
        let seen = max(listener.position, followed[listener.collection]?.head ?? 0)
        do {
            let (rows, position) = try latestRows(of: listener.collection)
            guard let changes = try view.replace(with: rows, old: view.ids, changed: { $0.sequence > seen }) else {
                restart(listener, reason: "the view could not be brought up to date; the whole view follows")
                return
            }
            listener.position = max(seen, position)
            for frame in viewFrames(changes, for: listener, initial: false, since: seen) {
                delayIfInjected(listener.session)
                listener.session.send(frame: frame)
            }
        } catch {
            fail(listener, error)
        }
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
        let delay = faults.plan.deliveryDelay.dispatchInterval
        queue.asyncAfter(deadline: .now() + delay) { [self, weak session] in
            if !holdsDeliveries { session?.release() }
        }
    }

    func token(_ sequence: Int64) -> String {
        ResumeToken(epoch: store.epoch, sequence: sequence).description
    }

    // MARK: - Encoding

    /// The changes a listener at `position` of `client` sees among `rows`, encoded.
    func encodeChanges(
        _ rows: [StoredDocument], after position: Int64, for client: String?, cutIntoFrames: Bool = true
    ) -> EncodedChanges {
        var encoded = EncodedChanges(pageBytes: cutIntoFrames ? configuration.snapshotPageBytes : .max, rows: rows)
        for row in rows {
            guard let kind = row.changeKind(after: position, for: client) else { continue }
            encoded.append(row, kind)
        }
        return encoded
    }

    /// `{"type":"snapshot",…}` with the changes spliced in.
    func snapshotFrame(target: String, changes: [UInt8], resumeToken: String, initial: Bool, hasMore: Bool)
        -> OutboundMessage
    {
        // Written straight after the socket's headroom: the frame is sent without another copy.
        var writer = JSONWriter(
            capacity: changes.count + target.utf8.count + resumeToken.utf8.count + 128, prefix: OutboundMessage.headroom
        )
        writer.beginObject()
        writer.key("type")
        writer.string("snapshot")
        writer.key("target")
        writer.string(target)
        writer.key("changes")
        writer.raw(changes)
        writer.key("resumeToken")
        writer.string(resumeToken)
        writer.key("initial")
        writer.bool(initial)
        writer.key("hasMore")
        writer.bool(hasMore)
        writer.endObject()
        return OutboundMessage(textAfterHeadroom: writer.bytes)
    }
}

/// Snapshot changes encoded as JSON arrays, cut into chunks of about a page's bytes so that
/// a large commit still reaches clients in frames they accept.
struct EncodedChanges {
    let pageBytes: Int
    private(set) var chunks: [(json: [UInt8], position: Int64)] = []
    private var writer: JSONWriter
    private var count = 0
    private var lastSequence: Int64 = 0
    /// About how many bytes the changes still to come take: each chunk's buffer is reserved
    /// once for them (up to a page), not grown by doubling. Large buffers come fresh from the
    /// system, so every regrowth also faulted in and zeroed new pages.
    private var expectedBytes: Int

    /// - Parameter rows: The rows that may be appended, for the buffer's size (none: unknown).
    init(pageBytes: Int, rows: some Collection<StoredDocument> = [StoredDocument]()) {
        self.pageBytes = pageBytes
        expectedBytes = rows.reduce(0) { $0 + Self.estimatedBytes(of: $1) }
        writer = JSONWriter(capacity: Self.capacity(expectedBytes, pageBytes))
        writer.beginArray()
    }

    private static func estimatedBytes(of row: StoredDocument) -> Int { row.fieldsBytes + 192 }

    private static func capacity(_ expected: Int, _ pageBytes: Int) -> Int {
        max(256, min(expected, pageBytes) + 64)
    }

    /// - Parameter indices: For a query listener, the change's positions in its view.
    mutating func append(_ row: StoredDocument, _ kind: Change.Kind, indices: (old: Int, new: Int)? = nil) {
        let estimate = Self.estimatedBytes(of: row)
        if count > 0 && writer.bytes.count + estimate > pageBytes {
            closeChunk(at: lastSequence)
        }
        row.writeChange(kind, indices: indices, to: &writer)
        expectedBytes = max(0, expectedBytes - estimate)
        count += 1
        lastSequence = row.sequence
    }

    private mutating func closeChunk(at position: Int64) {
        writer.endArray()
        chunks.append((writer.bytes, position))
        writer = JSONWriter(capacity: Self.capacity(expectedBytes, pageBytes))
        writer.beginArray()
        count = 0
    }

    /// The whole list as one array (catch-up pages are already cut to a page).
    var json: [UInt8] {
        var copy = self
        copy.writer.endArray()
        precondition(copy.chunks.isEmpty, "a catch-up page is encoded in one frame")
        return copy.writer.bytes
    }

    /// The chunks to send, the last one reaching `lastPosition`; none when nothing is visible.
    func chunks(lastPosition: Int64) -> [(json: [UInt8], position: Int64)] {
        guard count > 0 || !chunks.isEmpty else { return [] }
        var copy = self
        if copy.count > 0 { copy.closeChunk(at: lastPosition) }
        var result = copy.chunks
        result[result.count - 1].position = lastPosition
        return result
    }
}
