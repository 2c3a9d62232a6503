import Foundation
import GRDB
import TandemWire

extension SyncService {
    // MARK: - Connection

    /// Opens a connection; on failure, tries again after a backoff.
    func connect() {
        let (generation, url) = state.withLock { state -> (Int, String) in
            state.generation += 1
            state.connecting = true
            return (state.generation, serverURLs[state.urlIndex % serverURLs.count])
        }
        Task { [weak self] in
            guard let self else { return }
            if let hook = configuration.hooks.beforeConnect { await onThreadOfItsOwn(hook) }
            do {
                let token = try await currentToken()
                let connection = try await ServerConnection.connect(
                    to: url, clientId: clientId, token: token, transport: configuration.transport,
                    trustedCertificates: configuration.trustedCertificates,
                    timeout: Self.connectTimeout, logger: logger,
                    onClose: { [weak self] event in self?.connectionClosed(generation: generation, reason: "\(event)") }
                )
                await connected(connection, generation: generation, url: url)
                scheduleTokenRefresh(for: token, on: connection, generation: generation)
            } catch {
                let retry = state.withLock { state -> Bool in
                    guard state.generation == generation else { return false }
                    state.connecting = false
                    state.urlIndex += 1  // the next node, if there are several
                    return state.running
                }
                if retry {
                    noteError(TandemError("cannot connect", error, otherwise: .unreachable))
                    scheduleReconnect()
                }
            }
        }
    }

    /// The token to connect with: the provider's, else the configured one.
    private func currentToken() async throws -> String? {
        guard let provider = configuration.tokenProvider else { return configuration.token }
        do { return try await provider() } catch {
            throw TandemError(.noToken, "the tokenProvider failed: \(error)")
        }
    }

    /// Before `token` expires, asks the provider for the next and gives it to the open
    /// connection (`auth`). A provider that fails is asked again, with the reconnect backoff,
    /// until the token has expired; the server then closes the connection, and the reconnect
    /// asks once more.
    func scheduleTokenRefresh(for token: String?, on connection: ServerConnection, generation: Int, attempt: Int = 0) {
        guard configuration.tokenProvider != nil, let token, let expires = JWTPayload.expiry(of: token) else { return }
        let untilExpiry = Duration.seconds(Double(expires) - Date().timeIntervalSince1970)
        var delay = untilExpiry - configuration.tokenRefreshMargin
        if attempt > 0 {
            let backoff = Backoff(initial: configuration.reconnectDelay, cap: configuration.maxReconnectDelay)
            delay = backoff.delay(attempt: attempt - 1, random: Double.random(in: 0...1))
            guard delay < untilExpiry else { return }
        }
        state.withLock { state in
            guard state.running, state.generation == generation else { return }
            state.tokenRefresh?.cancel()
            state.tokenRefresh = SyncTimer.after(delay) { [weak self, weak connection] in
                guard let self, let connection else { return }
                Task { await self.refreshToken(on: connection, generation: generation, attempt: attempt, old: token) }
            }
        }
    }

    private func refreshToken(on connection: ServerConnection, generation: Int, attempt: Int, old: String) async {
        guard state.withLock({ $0.running && $0.generation == generation }), connection.isOpen else { return }
        do {
            let token = try await currentToken() ?? old
            _ = try await connection.authenticate(token: token)
            logger.debug("token refreshed on the open connection", metadata: ["tandem.client": "\(clientId)"])
            scheduleTokenRefresh(for: token, on: connection, generation: generation)
        } catch let error as TandemError where error.serverError != nil {
            // The server refused the new token and closes the connection: the reconnect asks again.
            noteError(error)
        } catch {
            noteError(TandemError("cannot refresh the token", error, otherwise: .noToken))
            scheduleTokenRefresh(for: old, on: connection, generation: generation, attempt: attempt + 1)
        }
    }

    /// A connection attempt succeeded: the connection becomes the service's (unless the
    /// service stopped or tried again meanwhile), and its first push is queued.
    private func connected(_ connection: ServerConnection, generation: Int, url: String) async {
        let current = state.withLock { state -> Bool in
            guard state.running, state.generation == generation else { return false }
            state.connecting = false
            state.connection = connection
            state.listening = Listeners()
            state.resets = ResetWindow()
            state.listenFailures = [:]
            state.reconnectAttempt = state.droppedInARow
            state.connectedAt = .now
            state.status.isConnected = true
            return true
        }
        guard current else {
            connection.close()
            return
        }
        guard connection.isOpen else {
            connectionClosed(generation: generation, reason: "closed during the handshake")
            return
        }
        logger.debug("connected", metadata: ["tandem.client": "\(clientId)", "tandem.server": "\(url)"])
        publishStatus()
        if let hook = configuration.hooks.afterConnect { await onThreadOfItsOwn(hook) }
        // Push before pull: changes made offline (and creates whose answer was lost) go out
        // before the listeners bring the server's state. Until this push has run, no listener
        // opens on the connection (`refreshListeners()` waits for it): a refresh queued earlier,
        // by a local commit to a parent table, would otherwise start a reset's full snapshot
        // before the push, and its end would remove the rows the push had just given server ids.
        queue.addBarrier { [weak self] in
            guard let self else { return }
            _ = try? push()
            state.withLock { state in
                if state.generation == generation { state.pushedOnConnect = generation }
            }
            refreshListeners()
        }
    }

    /// Runs a hook that may hold the attempt (a test's checkpoint) on a thread of its own,
    /// never on one of the few the cooperative pool has.
    private func onThreadOfItsOwn(_ hook: @escaping @Sendable () -> Void) async {
        await withCheckedContinuation { continuation in
            Thread.detachNewThread {
                hook()
                continuation.resume()
            }
        }
    }

    /// How long a connection attempt may take, handshake and `hello` included.
    static let connectTimeout = Duration.seconds(10)

    /// Drops a connection at once and forgets the work it queued, then reconnects.
    func dropConnection(_ connection: ServerConnection) {
        let reconnect = state.withLock { state -> Bool in
            guard state.connection === connection else { return false }
            state.connection = nil
            state.listening = Listeners()
            state.generation += 1
            state.urlIndex += 1
            state.status.isConnected = false
            return state.running
        }
        connection.abort()
        guard reconnect else { return }
        publishStatus()
        scheduleReconnect()
    }

    private func connectionClosed(generation: Int, reason: String) {
        let reconnect = state.withLock { state -> Bool in
            guard state.generation == generation, let connection = state.connection else { return false }
            if connection.closedOnUnreadableMessage {
                state.countStartOver(afterQuiet: configuration.maxReconnectDelay)
            } else {
                state.noteConnectionLost(afterQuiet: configuration.maxReconnectDelay)
            }
            state.connection = nil
            state.listening = Listeners()
            state.urlIndex += 1
            state.status.isConnected = false
            return state.running
        }
        guard reconnect else { return }
        noteError(TandemError(.disconnected, "disconnected: \(reason)"))
        publishStatus()
        scheduleReconnect()
    }

    private func scheduleReconnect() {
        let backoff = Backoff(initial: configuration.reconnectDelay, cap: configuration.maxReconnectDelay)
        let attempt = state.withLock { state -> Int in
            defer { state.reconnectAttempt += 1 }
            return state.reconnectAttempt
        }
        let delay = backoff.delay(attempt: attempt, random: Double.random(in: 0...1))
        let timer = SyncTimer.after(delay) { [weak self] in
            guard let self, self.state.withLock({ $0.running }) else { return }
            self.connect()
        }
        state.withLock { $0.reconnect = timer }
    }

    // MARK: - Listeners

    /// Opens a listener for every collection that should be listened to and is not, closes
    /// those that should no longer be (a parent stopped being shared or went away), and opens
    /// again those whose parent row is not the one they were opened for.
    ///
    /// A parent row that comes back after it went (its document left the scope, then came
    /// back) is a new row (ids are `AUTOINCREMENT`, never reused): the rows under it went with
    /// it, and so did their listener's token, while the listener opened for the old row would
    /// go on from where the device left them, never sending them again. It opens again, for
    /// the new row, from the whole collection.
    ///
    /// Does nothing on a connection whose first push has not run: that push's barrier
    /// refreshes the listeners when it ends (see ``connect()``).
    ///
    /// Runs on the sync queue (with `Serialization.unserialized`, also where that mode's
    /// listener work runs, which refreshes the listeners after an apply).
    func refreshListeners() {
        assertOnSyncQueue(listenerWork: true)
        guard
            let (connection, generation) = state.withLock({ state in
                state.running && state.pushedOnConnect == state.generation
                    ? state.connection.map { ($0, state.generation) } : nil
            }), connection.isOpen
        else { return }
        // A collection listened to (again) starts from its latest token.
        storeDeferredTokens()
        let plan: ListenerPlan
        do {
            plan = try readListenerPlan(for: connection)
        } catch {
            // Nothing would listen on this connection until the next refresh: it goes, and
            // the next one tries again (see `startOver`).
            noteError(TandemError("cannot read the listeners", error, otherwise: .database))
            startOver(generation)
            return
        }
        // Opened in path order, so that the order snapshots arrive in is reproducible.
        let (open, close) = state.withLock { state -> ListenerChanges in
            // The connection went while the state was read: the next one has its own refresh.
            guard state.connection === connection, state.generation == generation else { return ([], []) }
            let close = state.listening.open.filter { plan.desired[$0.key] != $0.value.target }
            for path in close.keys { state.listening.open[path] = nil }
            let open = plan.desired.filter { state.listening.open[$0.key] == nil }.sorted { $0.key < $1.key }
                .map { path, target in (path, target, state.listening.opening(path, target)) }
            for (path, target, _) in open where plan.resetting.contains(path) {
                state.resets.expect(path, since: connection.arrivals, isView: target.query != nil)
            }
            return (open, close.map { ($0.key, $0.value.name) })
        }
        // Closed before its round is: no frame of it comes after the number read here.
        for (_, name) in close { connection.unlisten(name) }
        state.withLock { state in
            guard state.generation == generation else { return }
            for (path, _) in close { state.resets.close(path, at: connection.arrivals) }
        }
        openListeners(open, with: plan, on: connection, generation: generation)
    }

    /// What the listeners should be, read from the database: the listeners wanted, their
    /// resume tokens, the views scoped tables resume with, and the collections being reset.
    private struct ListenerPlan {
        var desired: [CollectionPath: ListenerTarget] = [:]
        var tokens: [CollectionPath: String] = [:]
        var views: [CollectionPath: [DocumentID]] = [:]
        var resetting: Set<CollectionPath> = []
    }

    private typealias ListenerChanges = (
        open: [(CollectionPath, ListenerTarget, Listeners.Name)], close: [(CollectionPath, String)]
    )

    private func readListenerPlan(for connection: ServerConnection) throws -> ListenerPlan {
        let (user, maxMessageBytes) = (connection.welcome.user, connection.welcome.limits.maxMessageBytes)
        var problems: [TandemError] = []
        let plan = try readState { db in
            var plan = ListenerPlan()
            plan.desired = try reconciler.desiredListeners(db, user: user) { problems.append($0) }
            for (path, target) in plan.desired {
                plan.tokens[path] = try reconciler.ledger.resumeToken(for: path, db)
                if try reconciler.ledger.isResetting(path, db) { plan.resetting.insert(path) }
                // A scoped table resumes with the ids it holds: the server sends only how they
                // changed. (Too many to send in one message, they are not: the server then
                // sends a reset and the whole view.) Nor while a reset's full snapshot is under
                // way: the rows it has not brought yet are still here, and the server would not
                // send them again. (Only for listeners about to open: a refresh runs whenever
                // parents change.)
                if target.query != nil, plan.tokens[path] != nil,
                    state.withLock({ $0.listening.open[path]?.target != target }), !plan.resetting.contains(path)
                {
                    let ids = try reconciler.viewIDs(of: target.table, db)
                    let bytes = ids.reduce(0) { $0 + $1.rawValue.utf8.count + 3 }
                    if bytes < maxMessageBytes / 2 { plan.views[path] = ids }
                }
            }
            return plan
        }
        for problem in problems { noteError(problem) }
        return plan
    }

    /// Opens the listeners, each with its token and view.
    private func openListeners(
        _ listeners: [(CollectionPath, ListenerTarget, Listeners.Name)], with plan: ListenerPlan,
        on connection: ServerConnection, generation: Int
    ) {
        let excludingOwnWrites = !configuration.receivesOwnWrites && configuration.serialization == .barrier
        for (path, target, name) in listeners {
            // A reset's full snapshot, resumed on this connection, is the whole truth: the rows
            // it does not bring go at its end, so it must bring what this connection's push
            // wrote before the listen too. So must a collection listened to again on this
            // connection: the device may have removed its rows since (their parent left the
            // scope), this connection's writes among them, which the server, once noted, would
            // leave out of any later listener's catch-up.
            connection.listen(
                to: path, target: name.text, resumeToken: plan.tokens[path], query: target.query,
                view: plan.views[path],
                excludingOwnWrites: excludingOwnWrites && !plan.resetting.contains(path) && name.isFirst
            ) { [weak self, weak connection] event in
                self?.listenerEvent(
                    event, arrival: connection?.arrivals ?? 0,
                    of: OpenedListener(path: path, target: target, name: name.text, generation: generation))
            }
        }
    }

    /// A listener as a connection opened it: its collection, where its documents go, its name
    /// on the wire, and the connection's generation.
    private struct OpenedListener {
        let path: CollectionPath
        let target: ListenerTarget
        let name: String
        let generation: Int
    }

    /// A listener's event, on the connection's queue: into the inbox, and an operation queued
    /// to take it out. `arrival` numbers the message that brought it.
    private func listenerEvent(_ event: ServerConnection.ListenEvent, arrival: Int, of listener: OpenedListener) {
        let (path, target, name, generation) = (listener.path, listener.target, listener.name, listener.generation)
        switch event {
        case .snapshot(let snapshot):
            if snapshot.initial {
                state.withLock { state in
                    state.listenFailures[path] = nil
                    if state.generation == generation { state.resets.received(initialFrameOf: path, arrival: arrival) }
                }
            }
            configuration.hooks.snapshotReceived?(snapshot)
            deliver(.snapshot(snapshot, path: path, target: target, arrival: arrival), generation: generation)
        case .reset(let reason):
            logger.info("listener reset", metadata: ["tandem.collection": "\(path)", "tandem.reason": "\(reason)"])
            state.withLock { state in
                if state.generation == generation {
                    state.resets.expect(path, since: arrival, isView: target.query != nil)
                }
            }
            deliver(.reset(path), generation: generation)
        case .error(let error):
            state.withLock { state in
                if state.generation == generation, state.listening.open[path]?.name == name {
                    state.listening.open[path] = nil
                    state.resets.close(path, at: arrival)
                }
            }
            noteError(TandemError(.server, "listening to \(path) was refused: \(error.message)", serverError: error))
            if error.code == .internal || error.code == .rateLimited { scheduleRelisten(path, generation: generation) }
        }
    }

    /// Listens again, after a backoff, to a collection whose listener the server failed for a
    /// reason that may pass (its store failed, it was busy), without waiting for a reconnect.
    /// One task serves every failed listener: ``refreshListeners()`` opens all that are missing.
    private func scheduleRelisten(_ path: CollectionPath, generation: Int) {
        let backoff = Backoff(initial: configuration.reconnectDelay, cap: configuration.maxReconnectDelay)
        let delay = state.withLock { state -> Duration? in
            guard state.running, state.generation == generation else { return nil }
            // One is waiting already for this connection; one of an older connection is moot.
            if let waiting = state.relisten {
                guard waiting.generation != generation else { return nil }
                waiting.timer.cancel()
            }
            let attempt = state.listenFailures[path, default: 0]
            state.listenFailures[path] = attempt + 1
            let delay = backoff.delay(attempt: attempt, random: Double.random(in: 0...1))
            // Made under the lock, so that it is recorded before it can end.
            let timer = SyncTimer.after(delay) { [weak self] in
                guard let self else { return }
                let current = self.state.withLock { state -> Bool in
                    if state.relisten?.generation == generation { state.relisten = nil }
                    return state.running && state.generation == generation
                }
                if current { self.queue.add { [weak self] in self?.refreshListeners() } }
            }
            state.relisten = (generation, timer)
            return delay
        }
        guard let delay else { return }
        logger.info(
            "listening again after a failure", metadata: ["tandem.collection": "\(path)", "tandem.delay": "\(delay)"])
    }

    // MARK: - Tokens alone

    /// A live snapshot that brings no change, only a new resume token: the one that follows
    /// each of this device's pushes, its own writes left out (`excludeOwnWrites`).
    static func onlyMovesToken(_ snapshot: ServerMessage.Snapshot) -> Bool {
        !snapshot.initial && snapshot.changes.isEmpty
    }

    /// Keeps snapshots that only move their collection's token, to be stored together in one
    /// transaction: once ``SyncConfiguration/tokenStoreDelay`` has passed and the sync queue
    /// gets to it, at the start of every listener refresh that runs (after a connection's
    /// first push, when a parent row changed), or when the service stops. A later snapshot of
    /// the collection stores its own token and drops the kept one; so does a reset. (Only with
    /// the barrier: these all run on the sync queue, in order.)
    ///
    /// One comes after each batch a push sends, and storing each at once was a transaction that
    /// the next push waited behind (the barrier). Six alternated pairs of `bench throughput`:
    /// 2.97–3.74 s with them kept, 3.48–4.11 s without, faster in 5 (docs/BENCHMARKS.md). A
    /// token stored late costs nothing but a download: a device that resumes from the one
    /// before gets its own writes again, and knows them by id and version.
    private func deferTokens(_ snapshots: [(ServerMessage.Snapshot, CollectionPath, ListenerTarget)]) {
        let schedule = deferredTokens.withLock { deferred -> Bool in
            for (snapshot, path, target) in snapshots { deferred.snapshots[path] = (snapshot, target) }
            defer { deferred.storeScheduled = true }
            return !deferred.storeScheduled
        }
        guard schedule else { return }
        SyncTimer.after(configuration.tokenStoreDelay) { [weak self] in
            self?.queue.add { [weak self] in self?.storeDeferredTokens() }
        }
    }

    /// Stores the tokens that moved alone, whichever connection brought them: each is later
    /// than the one stored for its collection (a later snapshot's apply drops it). Runs on the
    /// sync queue (with `.unserialized`, where nothing is kept, also where that mode's listener
    /// work runs).
    func storeDeferredTokens() {
        assertOnSyncQueue(listenerWork: true)
        let waiting = deferredTokens.withLock { deferred in
            defer {
                deferred.snapshots = [:]
                deferred.storeScheduled = false
            }
            return deferred.snapshots.sorted { $0.key < $1.key }
        }
        guard !waiting.isEmpty else { return }
        for (_, (snapshot, _)) in waiting { configuration.hooks.beforeApply?(snapshot) }
        do {
            try ownWrite { db in
                for (path, (snapshot, target)) in waiting {
                    _ = try reconciler.apply(
                        SnapshotDelivery(snapshot: snapshot, collection: path, target: target), isolatingChanges: false,
                        db)
                }
                configuration.hooks.beforeApplyCommit?(waiting.map(\.value.0))
            }
            for (_, (snapshot, _)) in waiting { configuration.hooks.afterApply?(snapshot) }
        } catch {
            let paths = waiting.map(\.key.rawValue).joined(separator: ", ")
            noteError(TandemError("cannot store the resume token of \(paths)", error, otherwise: .database))
        }
    }

    /// Listener work waiting for the sync queue, in arrival order. A snapshot keeps the number
    /// of its message (``ServerConnection/arrivals``).
    enum Arrival: Sendable {
        case snapshot(ServerMessage.Snapshot, path: CollectionPath, target: ListenerTarget, arrival: Int)
        case reset(CollectionPath)

        var changeCount: Int {
            if case .snapshot(let snapshot, _, _, _) = self { snapshot.changes.count } else { 0 }
        }
    }

    /// Puts an arrival in the inbox and queues an operation to apply what the inbox holds.
    ///
    /// Listener work goes on the sync queue, behind any push barrier, except with
    /// `Serialization.unserialized`, where it runs at once on the connection's queue,
    /// concurrently with pushes. When
    /// snapshots of a collection arrive faster than they are applied, one operation takes
    /// several of them and applies them in one transaction (a commit per snapshot would cost
    /// more than the snapshot); the operations queued for the ones it took find nothing left.
    ///
    /// Work from a connection that is gone (the service stopped or reconnected since) is
    /// dropped: its changes were not stored, so the next listener brings them again from the
    /// stored resume token.
    private func deliver(_ arrival: Arrival, generation: Int) {
        inbox.withLock { $0.append((arrival, generation)) }
        switch configuration.serialization {
        case .barrier: queue.add { [weak self] in self?.applyArrivals() }
        // The race the barrier prevents, on demand: applied at once, on the connection's
        // queue, while a push may be waiting for its answer on the sync queue.
        case .unserialized: applyArrivals()
        }
    }

    /// At most this many changes go into one transaction.
    private static let changesPerTransaction = 5000

    /// Applies what waits in the inbox: consecutive snapshots of one collection together, up
    /// to ``changesPerTransaction`` changes; a reset on its own.
    private func applyArrivals() {
        assertOnSyncQueue(listenerWork: true)
        let batch = inbox.withLock { inbox -> [(Arrival, Int)] in
            var taken = 0
            var count = 0
            var collection: CollectionPath?
            for (arrival, _) in inbox {
                guard case .snapshot(_, let path, _, _) = arrival else {
                    if taken == 0 { taken = 1 }
                    break
                }
                if taken > 0 && (path != collection || count + arrival.changeCount > Self.changesPerTransaction) {
                    break
                }
                collection = path
                count += arrival.changeCount
                taken += 1
            }
            defer { inbox.removeFirst(taken) }
            return Array(inbox.prefix(taken))
        }
        let current = batch.filter { _, generation in state.withLock { $0.running && $0.generation == generation } }
        var cycle = ApplyCycle(defersTokens: configuration.serialization == .barrier)
        guard let (first, generation) = current.first else {
            _ = cycle.taken(.nothing)
            return
        }
        if case .reset(let path) = first {
            _ = cycle.taken(.reset)
            // A token from before the reset is no use to the listener (the server could not
            // resume from the one stored), nor to the reset's full snapshot.
            deferredTokens.withLock { _ = $0.snapshots.removeValue(forKey: path) }
            let begun: Bool
            do {
                try ownWrite { db in try reconciler.ledger.beginReset(path, db) }
                begun = true
            } catch {
                noteError(TandemError("cannot reset \(path)", error, otherwise: .database))
                begun = false
            }
            if cycle.resetBegun(begun) == .startOver { startOver(generation) }
            return
        }
        let arrivals = current.compactMap { arrival, _ -> SnapshotArrival? in
            if case .snapshot(let snapshot, let path, let target, let number) = arrival {
                (snapshot, path, target, number)
            } else {
                nil
            }
        }
        let onlyMoveTokens = arrivals.allSatisfy { Self.onlyMovesToken($0.snapshot) }
        switch cycle.taken(.snapshots(onlyMoveTokens: onlyMoveTokens)) {
        case .deferTokens:
            deferTokens(arrivals.map { ($0.snapshot, $0.path, $0.target) })
            taken(arrivals, finished: [], generation: generation)
        default:
            apply(arrivals, generation: generation, &cycle)
        }
    }

    /// The device cannot go on with what this connection brings: a snapshot or a reset the
    /// database failed to store as a whole (not one change), or listeners it cannot read.
    /// Nothing the connection delivers after may be applied, or its later token would skip
    /// what failed. The connection goes, and the listeners resume from their stored tokens
    /// on the next one, after a backoff that grows while this goes on
    /// (``State/countStartOver(afterQuiet:)``).
    private func startOver(_ generation: Int) {
        let connection = state.withLock { state -> ServerConnection? in
            guard state.generation == generation, let connection = state.connection else { return nil }
            state.countStartOver(afterQuiet: configuration.maxReconnectDelay)
            return connection
        }
        if let connection { dropConnection(connection) }
    }

    /// Snapshots left the inbox: see ``ResetWindow/taken(through:finished:)``.
    private func taken(
        _ arrivals: [SnapshotArrival], finished: [(path: CollectionPath, lastPage: Int)], generation: Int
    ) {
        guard let last = arrivals.last?.arrival else { return }
        state.withLock { state in
            if state.generation == generation { state.resets.taken(through: last, finished: finished) }
        }
    }

    /// The connection that delivered the snapshots being applied was replaced meanwhile.
    private struct ConnectionGone: Error {}

    typealias SnapshotArrival = (
        snapshot: ServerMessage.Snapshot, path: CollectionPath, target: ListenerTarget, arrival: Int
    )

    /// Applies snapshots and stores their resume tokens in one transaction, as `cycle` says:
    /// when a change fails, the transaction is rolled back and the snapshots applied again with
    /// each change on its own, so that only the changes that fail are left out.
    private func apply(_ arrivals: [SnapshotArrival], generation: Int, _ cycle: inout ApplyCycle) {
        for arrival in arrivals { configuration.hooks.beforeApply?(arrival.snapshot) }
        // Stopped while the hook held us: as after a crash, nothing of these snapshots is stored.
        guard state.withLock({ $0.running && $0.generation == generation }) else { return }
        var isolating = false
        while true {
            let attempt: ApplyCycle.Attempt
            do {
                let outcomes = try applyInOneTransaction(arrivals, generation: generation, isolatingChanges: isolating)
                attempt = .applied(finishApply(arrivals, outcomes, generation: generation))
            } catch let failed as Reconciler.ChangeFailed {
                // Isolated, a change that fails is left out without ending the attempt: one that
                // ends it is the database's failure, said as any other.
                if isolating {
                    noteError(TandemError("cannot apply a snapshot", failed.underlying, otherwise: .database))
                }
                attempt = .changeFailed
            } catch is ConnectionGone {
                attempt = .connectionGone
            } catch {
                let paths = Set(arrivals.map(\.path.rawValue)).sorted().joined(separator: ", ")
                noteError(TandemError("cannot apply a snapshot of \(paths)", error, otherwise: .database))
                attempt = .failed
            }
            switch cycle.attempted(attempt) {
            case .applyIsolating:
                isolating = true
            case .finish(let refreshesListeners, let pushSoon, let refreshesStatus):
                if refreshesListeners { refreshListeners() }
                if pushSoon { schedulePush(after: configuration.pushDelay) }
                // Echoes of this device's own writes (the usual snapshot after a push) leave
                // the counts as they were: no read for them.
                if refreshesStatus { refreshStatus() }
                return
            case .startOver:
                startOver(generation)
                refreshStatus()
                return
            default:
                return
            }
        }
    }

    /// One attempt: every snapshot applied and its token stored, in one transaction.
    private func applyInOneTransaction(_ arrivals: [SnapshotArrival], generation: Int, isolatingChanges: Bool)
        throws -> [ApplyOutcome]
    {
        try ownWrite { db in
            // The last page of a reset's full snapshot keeps the rows acknowledged after the
            // snapshot was read: looked up within the transaction, after any write-back that
            // committed before it. A connection that came meanwhile has its own window: then
            // nothing is stored, as for any connection gone.
            let keeping = try state.withLock { state in
                guard state.generation == generation else { throw ConnectionGone() }
                return arrivals.map { arrival in
                    arrival.snapshot.initial && !arrival.snapshot.hasMore
                        ? state.resets.rows(
                            of: arrival.target.table, in: arrival.path, lastPage: arrival.arrival,
                            readAtFirstFrame: arrival.target.query != nil)
                        : []
                }
            }
            let outcomes = try zip(arrivals, keeping).map { arrival, keeping in
                try reconciler.apply(
                    SnapshotDelivery(
                        snapshot: arrival.snapshot, collection: arrival.path, target: arrival.target, keeping: keeping),
                    isolatingChanges: isolatingChanges, db)
            }
            configuration.hooks.beforeApplyCommit?(arrivals.map(\.snapshot))
            return outcomes
        }
    }

    /// What follows a committed apply at once: kept tokens dropped (theirs are later), the
    /// reset window told, failures and conflicts noted. Returns what the cycle needs to decide
    /// the rest.
    private func finishApply(_ arrivals: [SnapshotArrival], _ outcomes: [ApplyOutcome], generation: Int)
        -> ApplyCycle.Summary
    {
        deferredTokens.withLock { deferred in
            for arrival in arrivals { deferred.snapshots[arrival.path] = nil }
        }
        for arrival in arrivals { configuration.hooks.afterApply?(arrival.snapshot) }
        let finished = zip(outcomes, arrivals).filter { $0.0.finishedReset }.map { ($0.1.path, $0.1.arrival) }
        taken(arrivals, finished: finished, generation: generation)
        var summary = ApplyCycle.Summary()
        for (outcome, arrival) in zip(outcomes, arrivals) {
            for failure in outcome.failures { noteError(TandemError(.database, "cannot apply \(failure)")) }
            if outcome.conflicts > 0 { updateStatus { $0.resolvedConflicts += outcome.conflicts } }
            if parentTables.contains(arrival.target.table) && outcome.inserted + outcome.deleted > 0 {
                summary.parentsChanged = true
            }
        }
        summary.leftWorkToPush = outcomes.contains(where: \.leftWorkToPush)
        summary.changedNothing = outcomes.allSatisfy(\.changedNothing)
        return summary
    }
}
