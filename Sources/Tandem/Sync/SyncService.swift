import Dispatch
import Foundation
import GRDB
import Logging
import Synchronization
import TandemWire

/// Keeps the app's synced tables and the server in step: pushes local changes, applies the
/// server's, over one reconnecting WebSocket connection.
///
/// Everything that touches sync state runs on one `OperationQueue` with
/// `maxConcurrentOperationCount = 1`, the *sync queue*:
///
/// - A push is a **barrier block**: it sends the dirty rows, waits for the server's answer,
///   and writes the answer back (server ids, versions, `isDirty = 0` for rows that did not
///   change meanwhile) before any later operation runs.
/// - Each listener snapshot is an ordinary operation on the same queue: it finds rows by
///   server id and inserts, updates or deletes them, storing the resume token in the same
///   transaction.
///
/// So the server's echo of a document this device just created is applied after the create's
/// server id is stored, and is recognized instead of inserted a second time.
///
/// The app's own calls that change sync state (``resolve(_:with:)``, ``retryFailed()``) are
/// the exception: like the app's writes, each is one transaction of the database's writer,
/// on the caller's thread, which the database serializes with the queue's; the push that
/// follows goes on the queue.
///
/// ## Threads
///
/// - **The sync queue** (an `OperationQueue`, one operation at a time) runs pushes and
///   snapshot applies. A push blocks its operation's thread while it waits for the server's
///   answer: that wait *is* the barrier. It is a libdispatch thread, never one of Swift
///   concurrency's.
/// - **The transport's thread** (libwebsockets' service thread, one per event loop) reads
///   and writes sockets only; each connection hands what arrives to its own serial
///   `DispatchQueue`, which decodes it, answers waiting requests and passes snapshots to the
///   sync queue.
/// - **Timers** (the periodic push, a delayed push, reconnect and relisten backoff, deferred
///   resume tokens, a bounded sync's deadline) are ``SyncTimer``s: libdispatch timers that
///   only enqueue work. A request's timeout is the connection's own.
/// - **Tasks**: a connection attempt is a task, and async callers (``syncNow(connectionWait:)``)
///   wait on a continuation that the sync queue resumes. No task blocks its thread: hooks
///   run on the thread of the point they mark (the sync queue's, a connection's queue), and
///   `beforeConnect`, which a task would reach, runs on a thread of its own.
/// - `TANDEM_CHECK_BLOCKING=report` (or `=1`, to stop) names every blocking wait of Tandem
///   and its test helpers that runs on a thread of the cooperative pool.
///
/// For example:
///
/// ```swift
/// let service = try SyncService(
///     database: dbQueue, serverURL: "ws://127.0.0.1:7878", clientId: deviceId,
///     records: [Account.self, Entry.self])
/// service.start()
/// try await dbQueue.write { db in try Entry(accountId: 1, title: "Rent", amount: -1200).insert(db) }
/// try await service.syncNow()
/// ```
public final class SyncService: Sendable {
    public let clientId: String
    /// The first server node the service connects to.
    public let serverURL: String
    /// Every node it may connect to: ``serverURL``, then ``SyncConfiguration/serverURLs``.
    public let serverURLs: [String]
    public let configuration: SyncConfiguration
    let database: any DatabaseWriter
    let reconciler: Reconciler
    /// The clock's value as last committed by ``ownWrite(_:file:line:)`` (0 until then).
    private let storedClock = Atomic<Int64>(0)
    let queue: SyncQueue
    let observer: LocalChangeObserver
    let state = Mutex(State())
    /// Listener arrivals waiting for the sync queue, with the connection generation of each.
    let inbox = Mutex<[(Arrival, Int)]>([])
    /// Snapshots that moved their collection's token alone, waiting to be stored
    /// (``storeDeferredTokens()``).
    let deferredTokens = Mutex(DeferredTokens())

    /// The resume tokens kept and not stored yet, by collection (see
    /// ``SyncConfiguration/tokenStoreDelay``).
    @_spi(Testing) public var keptTokens: [String: String] {
        deferredTokens.withLock { deferred in
            Dictionary(uniqueKeysWithValues: deferred.snapshots.map { ($0.key.rawValue, $0.value.0.resumeToken) })
        }
    }
    /// The collections with a listener open on the current connection.
    @_spi(Testing) public var listenedCollections: [String] {
        state.withLock { $0.listening.open.keys.map(\.rawValue).sorted() }
    }

    /// Waits until the work queued on the sync queue so far has run: a hook can let an
    /// operation a commit queued run before the engine goes on. Not from the sync queue.
    @_spi(Testing) public func waitForQueuedWork() {
        queue.waitForQueuedWork()
    }

    let logger: Logger
    let parentTables: Set<String>
    /// Tables whose rows others nest under or reference.
    let dependedOnTables: Set<String>
    /// The device's hybrid logical clock: `updatedAt` and field times come from it.
    public let clock: HybridLogicalClock

    struct DeferredTokens {
        var snapshots: [CollectionPath: (ServerMessage.Snapshot, ListenerTarget)] = [:]
        var storeScheduled = false
    }

    struct State {
        var running = false
        var connection: ServerConnection?
        /// Grows with every connection attempt; callbacks of older connections are ignored.
        var generation = 0
        var reconnectAttempt = 0
        /// Connections this service dropped one after the other because what they delivered
        /// could not be read or stored: the next connection's backoff goes on from there, so
        /// a lasting fault (a full disk) is tried again ever more slowly, not several times a
        /// second.
        var droppedInARow = 0
        /// When the current connection was made.
        var connectedAt: ContinuousClock.Instant?
        /// Which of ``serverURLs`` the next connection goes to.
        var urlIndex = 0
        /// True from the start of a connection attempt until it succeeds or fails.
        var connecting = false
        /// The generation whose connection has had its first push: its listeners may open.
        var pushedOnConnect = 0
        var listening = Listeners()
        /// Full snapshots of resets that may still end on the connection of `generation`,
        /// and what pushes acknowledged meanwhile: kept after the connection closes, while
        /// what it delivered may still be applied.
        var resets = ResetWindow()
        /// Counts reads of the counts for the status, and the last one shown: reads that run
        /// at once may finish out of order, and an older one must not overwrite a newer.
        var countReads = 0
        var countsShown = 0
        /// A read of the counts is queued by ``refreshStatusSoon()`` and has not started: it
        /// will see every commit made until it starts, which need no read of their own.
        var countsReadQueued = false
        /// When the push scheduled next will be queued, if one is.
        var pushDue: ContinuousClock.Instant?
        var status = SyncStatus()
        var watchers: [Int: AsyncStream<SyncStatus>.Continuation] = [:]
        var nextWatcher = 0
        var periodicPush: SyncTimer?
        var reconnect: SyncTimer?
        /// Listeners the server failed (`internal`, `rate-limited`), by how many times in a
        /// row; each is listened to again after a backoff, on the same connection.
        var listenFailures: [CollectionPath: Int] = [:]
        var relisten: (generation: Int, timer: SyncTimer)?
        /// Asks the token provider for the next token before the current one expires.
        var tokenRefresh: SyncTimer?

        /// The current connection is dropped because what it delivered could not be read or
        /// stored. One that lived longer than the longest backoff without trouble starts a
        /// new streak.
        mutating func countStartOver(afterQuiet quiet: Duration) {
            if livedLonger(than: quiet) { droppedInARow = 0 }
            droppedInARow += 1
        }

        /// The current connection ended for the network's reasons: one that lived longer than
        /// the longest backoff ends any streak, and the next attempt waits the shortest time.
        mutating func noteConnectionLost(afterQuiet quiet: Duration) {
            guard livedLonger(than: quiet) else { return }
            droppedInARow = 0
            reconnectAttempt = 0
        }

        private func livedLonger(than quiet: Duration) -> Bool {
            connectedAt.map { $0.duration(to: .now) > quiet } ?? false
        }
    }

    /// Prepares the database for syncing: adds Tandem's columns, triggers and tables, and
    /// registers `tandem_now()`. Create the service before the app writes synced tables in a
    /// new process: the triggers call that function.
    ///
    /// - Throws: ``TandemError`` `.invalidArgument` for a table that does not exist, has no
    ///   `id` primary key, or references an unregistered table; `.database` when the schema
    ///   cannot be changed.
    public init(
        database: any DatabaseWriter, serverURL: String, clientId: String, tables: [SyncTable],
        configuration: SyncConfiguration = .init()
    ) throws {
        do { _ = try ClientName(clientId, field: "clientId") } catch {
            throw TandemError(.invalidArgument, error.message)
        }
        self.database = database
        self.serverURL = serverURL
        var urls = [serverURL]
        for url in configuration.serverURLs where !urls.contains(url) { urls.append(url) }
        self.serverURLs = urls
        self.clientId = clientId
        self.configuration = configuration
        self.logger = configuration.logger
        let clock = HybridLogicalClock(wall: configuration.clock)
        self.clock = clock
        let models: [TableModel]
        do {
            // Tandem's own tables first, by version; then the app's tables get their columns.
            try SyncLedger.migrator.migrate(database)
            models = try database.writeWithoutTransaction { db in
                db.add(function: DatabaseFunction("tandem_now", argumentCount: 0, pure: false) { _ in clock.now() })
                var models: [TableModel] = []
                try db.inTransaction {
                    models = try SyncSchema.install(db, tables: tables, defaultPolicy: configuration.conflictPolicy)
                    return .commit
                }
                // Never below a time this database has seen, whatever the wall clock says now.
                clock.receive(try Reconciler(tables: models, clock: clock).latestTime(db))
                return models
            }
        } catch let error as TandemError {
            throw error
        } catch {
            throw TandemError(.database, "cannot prepare the database for syncing: \(error)")
        }
        reconciler = Reconciler(
            tables: models, clock: clock, recognizesOwnCreates: configuration.serialization == .barrier)
        parentTables = Set(models.compactMap(\.parentTable))
        dependedOnTables = parentTables.union(models.flatMap(\.references.values))
        observer = LocalChangeObserver(tables: Set(models.map(\.name)), parents: parentTables)
        queue = SyncQueue(label: "tandem.sync.\(clientId)")
        let observer = self.observer
        observer.setOnCommit { [weak self] parentsChanged in self?.localChangesCommitted(parentsChanged: parentsChanged)
        }
        // The status is current when init returns, whichever thread called it. The counts are
        // read in the write that starts observing, so no commit falls between the two, and
        // before any refresh a later commit starts (whose read is newer, and wins).
        let read = nextCountRead()
        do {
            let counts = try database.writeWithoutTransaction { [reconciler] db in
                db.add(transactionObserver: observer, extent: .observerLifetime)
                return try reconciler.counts(db)
            }
            showCounts(counts, read: read)
        } catch {
            throw TandemError(.database, "cannot read the sync status: \(error)")
        }
    }

    /// Syncs the tables of these record types (see ``SyncableRecord``).
    public convenience init(
        database: any DatabaseWriter, serverURL: String, clientId: String, records: [any SyncableRecord.Type],
        configuration: SyncConfiguration = .init()
    ) throws {
        try self.init(
            database: database, serverURL: serverURL, clientId: clientId, tables: records.map { $0.syncTable },
            configuration: configuration)
    }

    deinit {
        let (timers, connection) = state.withLock {
            ($0.running ? [$0.periodicPush, $0.reconnect, $0.relisten?.timer] : [], $0.connection)
        }
        timers.forEach { $0?.cancel() }
        connection?.close()
    }

    // MARK: - Lifecycle

    /// Connects (and keeps reconnecting), listens, and pushes local changes. Local writes work
    /// whether or not the service runs; they are pushed once it is connected.
    public func start() {
        let started = state.withLock { state -> Bool in
            guard !state.running else { return false }
            state.running = true
            state.reconnectAttempt = 0
            return true
        }
        guard started else { return }
        connect()
        let interval = configuration.pushInterval
        let timer = SyncTimer.every(interval) { [weak self] in
            guard let self else { return false }
            schedulePush(after: .zero)
            return true
        }
        state.withLock { $0.periodicPush = timer }
    }

    /// Disconnects and stops pushing. Waits for the operation running now; listener changes
    /// still queued are not applied (their resume tokens were not stored, so they come again
    /// after restarting). The resume tokens that came alone after pushes, kept to be stored
    /// within about a second, are stored now, unless `discardingQueuedWork`, which drops them
    /// and the queued operations (pushes included) as a crash would.
    public func stop(discardingQueuedWork: Bool = false) async {
        let (connection, timers) = state.withLock { state -> (ServerConnection?, [SyncTimer?]) in
            let result = (state.connection, [state.periodicPush, state.reconnect, state.relisten?.timer])
            state.running = false
            state.generation += 1
            state.connecting = false
            state.connection = nil
            state.listening = Listeners()
            state.periodicPush = nil
            state.reconnect = nil
            state.relisten = nil
            state.listenFailures = [:]
            state.pushDue = nil
            state.status.isConnected = false
            return result
        }
        timers.forEach { $0?.cancel() }
        connection?.close()
        if discardingQueuedWork {
            queue.cancelAll()
        }
        await withCheckedContinuation { continuation in
            queue.addBarrier { [self] in
                if discardingQueuedWork {
                    // Its timer's store may have been cancelled with the queue: none is scheduled.
                    deferredTokens.withLock { $0 = DeferredTokens() }
                } else {
                    storeDeferredTokens()
                }
                continuation.resume()
            }
        }
        // Unserialized, listener work runs on the connection's queue: an apply under way there
        // ends before stop returns, and any later one finds the generation gone.
        if configuration.serialization == .unserialized, let connection {
            await withCheckedContinuation { continuation in connection.afterQueuedWork { continuation.resume() } }
        }
        // What is left came from the connection just closed: the next one brings it again.
        inbox.withLock { $0.removeAll() }
        publishStatus()
    }

    /// Pushes every local change now and waits until the answers are written back.
    ///
    /// - Parameter connectionWait: How long to wait for a connection while there is none. An
    ///   attempt under way when it runs out is waited for until it succeeds or fails (it has
    ///   its own timeout), so that a slow handshake on a busy device is not taken for none.
    /// - Throws: ``TandemError`` `.stopped` when the service is not started, `.disconnected`
    ///   when there is no connection or it dropped during the push, `.timedOut`; the changes
    ///   stay pending and go out later.
    @discardableResult
    public func syncNow(connectionWait: Duration = .seconds(5)) async throws -> SyncReport {
        let deadline = ContinuousClock.now + connectionWait
        let hardDeadline = deadline + Self.connectTimeout + .seconds(5)
        while true {
            let (running, connected, connecting) = state.withLock {
                ($0.running, $0.connection?.isOpen ?? false, $0.connecting)
            }
            guard running else { throw TandemError(.stopped, "the sync service is stopped; call start() first") }
            if connected { break }
            let now = ContinuousClock.now
            if now >= hardDeadline || (now >= deadline && !connecting) { break }
            try await Task.sleep(for: .milliseconds(10))
        }
        return try await withCheckedThrowingContinuation { continuation in
            queue.addBarrier { [self] in
                continuation.resume(with: Result { try push() })
            }
        }
    }

    // MARK: - Status

    /// True between ``start()`` and ``stop(discardingQueuedWork:)``.
    public var isRunning: Bool { state.withLock { $0.running } }

    /// What the service is doing now.
    public var status: SyncStatus { state.withLock { $0.status } }

    /// The current status, then every change of it.
    public func statusUpdates() -> AsyncStream<SyncStatus> {
        let (stream, continuation) = AsyncStream.makeStream(of: SyncStatus.self, bufferingPolicy: .bufferingNewest(1))
        let id = state.withLock { state -> Int in
            state.nextWatcher += 1
            state.watchers[state.nextWatcher] = continuation
            continuation.yield(state.status)
            return state.nextWatcher
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.state.withLock { $0.watchers.removeValue(forKey: id) }
        }
        return stream
    }

    /// Rows whose push failed for good, with the reason.
    public func failedRecords() throws -> [FailedRecord] {
        try readState { db in try reconciler.ledger.failedRecords(db) }
    }

    public func failedRecords() async throws -> [FailedRecord] {
        try await readState { [reconciler] db in try reconciler.ledger.failedRecords(db) }
    }

    // MARK: - Conflicts

    /// Open conflicts of tables with the ``ConflictPolicy/manual`` policy. Their rows do not
    /// sync until resolved.
    public func conflicts() throws -> [ConflictRecord] {
        try readState { db in try reconciler.ledger.conflicts(db) }
    }

    public func conflicts() async throws -> [ConflictRecord] {
        try await readState { [reconciler] db in try reconciler.ledger.conflicts(db) }
    }

    /// Resolves an open conflict: ``ConflictResolution/keepLocal`` pushes the local row over the
    /// server's version, ``ConflictResolution/useServer`` takes the server's, and
    /// ``ConflictResolution/merge(fields:)`` makes the row the given fields (the others keep
    /// their local values) and pushes it.
    ///
    /// - Throws: ``TandemError`` `.invalidArgument` when the conflict is no longer open.
    public func resolve(_ conflict: ConflictRecord, with resolution: ConflictResolution) throws {
        try ownWrite { db in try reconciler.resolve(conflict, with: resolution, db) }
        resolved()
    }

    public func resolve(_ conflict: ConflictRecord, with resolution: ConflictResolution) async throws {
        try await ownWrite { [reconciler] db in try reconciler.resolve(conflict, with: resolution, db) }
        updateStatus { $0.resolvedConflicts += 1 }
        await refreshStatus()
        schedulePush(after: .zero)
    }

    private func resolved() {
        updateStatus { $0.resolvedConflicts += 1 }
        refreshStatus()
        schedulePush(after: .zero)
    }

    /// The open conflicts now, then after every change of them.
    public func conflictUpdates() -> AsyncStream<[ConflictRecord]> {
        let statuses = statusUpdates()
        return AsyncStream { continuation in
            let task = Task { [weak self] in
                var last: [ConflictRecord]?
                for await _ in statuses {
                    guard let self, let current = try? await conflicts() else { break }
                    if current != last {
                        continuation.yield(current)
                        last = current
                    }
                }
                continuation.finish()
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

    /// Makes failed rows pending again and pushes them.
    public func retryFailed() throws {
        try ownWrite { db in try reconciler.ledger.retryFailed(db) }
        refreshStatus()
        schedulePush(after: .zero)
    }

    public func retryFailed() async throws {
        try await ownWrite { [reconciler] db in try reconciler.ledger.retryFailed(db) }
        await refreshStatus()
        schedulePush(after: .zero)
    }

    /// Refreshes the status on a thread that may wait for the database (not the caller's, which
    /// may be one of Swift concurrency's).
    ///
    /// A read queued and not yet started sees every commit made before it starts, so a burst
    /// of local commits queues one read, not one each (each would wait for the database behind
    /// the app's next write).
    func refreshStatusSoon() {
        let alreadyQueued = state.withLock { state in
            defer { state.countsReadQueued = true }
            return state.countsReadQueued
        }
        guard !alreadyQueued else { return }
        DispatchQueue.global().async { [weak self] in
            guard let self else { return }
            configuration.hooks.beforeQueuedStatusRead?()
            // Cleared before the read: a commit from here on may come after it, and queues its own.
            state.withLock { $0.countsReadQueued = false }
            refreshStatus()
        }
    }

    /// Reads the counts of the status. Called on a thread of Swift concurrency's pool (a task
    /// that connects or stops), it leaves the read to a thread that may wait for the database.
    func refreshStatus() {
        if BlockingCheck.onCooperativePool {
            refreshStatusSoon()
            return
        }
        do {
            _ = try showCurrentCounts()
        } catch {
            logger.error("reading the sync status failed", metadata: ["tandem.error": "\(error)"])
        }
    }

    /// Reads the counts, shows them in the status and returns them: one read for a push's
    /// report and the status both.
    func showCurrentCounts() throws -> (pending: Int, failed: Int, conflicts: Int) {
        let read = nextCountRead()
        let counts = try readState { [reconciler] db in try reconciler.counts(db) }
        showCounts(counts, read: read)
        return counts
    }

    /// From async code: the status is current when it returns.
    func refreshStatus() async {
        let read = nextCountRead()
        do {
            showCounts(try await readState { [reconciler] db in try reconciler.counts(db) }, read: read)
        } catch {
            logger.error("reading the sync status failed", metadata: ["tandem.error": "\(error)"])
        }
    }

    private func nextCountRead() -> Int {
        state.withLock { state in
            state.countReads += 1
            return state.countReads
        }
    }

    private func showCounts(_ counts: (pending: Int, failed: Int, conflicts: Int), read: Int) {
        updateStatus(countsRead: read) { status in
            status.pendingCount = counts.pending
            status.failedCount = counts.failed
            status.openConflicts = counts.conflicts
        }
    }

    /// Changes the status and tells its watchers. With `countsRead`, the change carries counts
    /// read then, and is dropped when counts read later were shown already.
    func updateStatus(countsRead read: Int? = nil, _ change: (inout SyncStatus) -> Void) {
        let (changed, status, watchers) = state.withLock {
            state -> (Bool, SyncStatus, [AsyncStream<SyncStatus>.Continuation]) in
            if let read {
                guard read > state.countsShown else { return (false, state.status, []) }
                state.countsShown = read
            }
            let before = state.status
            change(&state.status)
            return (before != state.status, state.status, Array(state.watchers.values))
        }
        if changed { watchers.forEach { $0.yield(status) } }
    }

    func publishStatus() {
        guard !BlockingCheck.onCooperativePool else {
            DispatchQueue.global().async { [weak self] in self?.publishStatus() }
            return
        }
        refreshStatus()
        let (status, watchers) = state.withLock { ($0.status, Array($0.watchers.values)) }
        watchers.forEach { $0.yield(status) }
    }

    func noteError(_ error: TandemError) {
        logger.warning("\(error.message)", metadata: ["tandem.client": "\(clientId)", "tandem.code": "\(error.code)"])
        updateStatus { $0.lastError = error }
    }

    // MARK: - Connection

    /// Drops the connection at once, as a network failure would, and connects again with the
    /// usual backoff: for apps that know the network changed, and for tests. Unanswered writes
    /// keep their idempotency keys and go out again; listeners resume from their tokens.
    public func reconnect() {
        guard let connection = state.withLock({ $0.connection }) else { return }
        dropConnection(connection)
    }

    /// Reads Tandem's own state (status counts, listeners, failed rows).
    ///
    /// On a `DatabaseQueue`, GRDB's `read` brackets the read with `PRAGMA query_only`, and
    /// SQLite expires every prepared statement of the connection when that flag changes: each
    /// read would make the next apply and push compile all their statements again (0.4 ms
    /// for a one-document change instead of 0.1 ms). A queue runs every access on one serial
    /// queue, so a read without the pragma is just as isolated from writes there.
    func readState<T>(_ body: (Database) throws -> T, file: StaticString = #fileID, line: UInt = #line) throws -> T {
        BlockingCheck.willBlock("a synchronous read of the database", file: file, line: line)
        if let queue = database as? DatabaseQueue { return try queue.unsafeRead(body) }
        return try database.read(body)
    }

    /// From async code: waits for the database without holding a thread (and, on a queue,
    /// without the pragma, as above).
    func readState<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        if let queue = database as? DatabaseQueue { return try await queue.unsafeRead(body) }
        return try await database.read(body)
    }

    // MARK: - Writes

    /// Writes as Tandem: changes made here are not mistaken for the app's local changes. The
    /// clock is stored with them, so that it never goes back after a restart; a write after
    /// which it has not moved past the value last committed leaves it as it is (an upsert
    /// fewer: a snapshot that carries a new resume token alone, for instance, or a write-back
    /// whose answer's time is no later than the clock).
    func ownWrite<T>(_ body: (Database) throws -> T, file: StaticString = #fileID, line: UInt = #line) throws -> T {
        BlockingCheck.willBlock("a synchronous write of the database", file: file, line: line)
        let observer = self.observer
        let (result, stored) = try database.write { db in
            try observer.tandemWrites(in: db) { (try body(db), try storeClockIfMoved(db)) }
        }
        if let stored { storedClock.max(stored, ordering: .relaxed) }
        return result
    }

    func ownWrite<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        let observer = self.observer
        let (result, stored) = try await database.write { [self] db in
            try observer.tandemWrites(in: db) { (try body(db), try storeClockIfMoved(db)) }
        }
        if let stored { storedClock.max(stored, ordering: .relaxed) }
        return result
    }

    /// Stores the clock when it moved past the value last committed, and returns what it
    /// stored; the caller notes it once the transaction has committed (a value noted before
    /// a rollback would leave the clock unstored).
    private func storeClockIfMoved(_ db: Database) throws -> Int64? {
        let latest = reconciler.clock.latest
        guard latest > storedClock.load(ordering: .relaxed) else { return nil }
        try reconciler.ledger.storeClock(latest, db)
        return latest
    }

    private func localChangesCommitted(parentsChanged: Bool) {
        let pushDue = schedulePush(after: configuration.pushDelay)
        if parentsChanged {
            queue.add { [weak self] in self?.refreshListeners() }
        }
        // A push queued at once shows the new counts when it ends (even one that finds no
        // connection), so a read here would only hold it up: on a `DatabaseQueue`, its first
        // write waits for the read (propagation p50 1.24 → 1.04 ms without it).
        if !pushDue || configuration.pushDelay > .zero { refreshStatusSoon() }
    }

    /// Stops a debug build unless the caller runs on the sync queue, where the push and the
    /// listener's apply own the sync state (``Confinement``). `listenerWork`: with
    /// `Serialization.unserialized`, listener work runs on its connection's queue instead.
    func assertOnSyncQueue(listenerWork: Bool = false, file: StaticString = #fileID, line: UInt = #line) {
        Confinement.check(
            queue.isCurrent || (listenerWork && configuration.serialization == .unserialized),
            "not on the sync queue \(queue.label)", file: file, line: line)
    }

    /// Queues a push after `delay`, unless one is due as soon already. Returns whether a push
    /// is due by then: false when the service is stopped.
    @discardableResult
    func schedulePush(after delay: Duration) -> Bool {
        // A push due sooner (a resolved conflict, while a local edit's push waits out a long
        // `pushDelay`) takes the place of the one scheduled; a later one is not needed.
        let due = ContinuousClock.now + delay
        let (running, schedule) = state.withLock { state -> (Bool, Bool) in
            guard state.running, state.pushDue.map({ due < $0 }) ?? true else { return (state.running, false) }
            state.pushDue = due
            return (true, true)
        }
        guard schedule else { return running }
        let enqueue: @Sendable () -> Void = { [weak self] in
            guard let self, state.withLock({ $0.pushDue == due }) else { return }
            queue.addBarrier { [weak self] in _ = try? self?.push() }
        }
        if delay <= .zero {
            enqueue()
        } else {
            SyncTimer.after(delay, enqueue)
        }
        return true
    }
}

extension SyncService {
    /// What this device holds of the server's data, as documents: for every synced row with a
    /// server id, its collection, id and fields as a push would send them.
    ///
    /// A diagnostic for tests and tools that compare a device with the server.
    public func localDocuments() throws -> [CollectionPath: [DocumentID: JSONObject]] {
        try readState { db in try reconciler.localDocuments(db) }
    }

    public func localDocuments() async throws -> [CollectionPath: [DocumentID: JSONObject]] {
        try await readState { [reconciler] db in try reconciler.localDocuments(db) }
    }

    /// What this device holds and has still to push, read in one transaction: for comparing the
    /// device with the server. (Read one at a time, a push could fall between the reads: its row
    /// left out of the documents, not synced yet, and out of the unsynced count, written back
    /// since; the status's counts are only refreshed when the push ends.)
    public func localState() async throws -> LocalState {
        try await readState { [reconciler] db in
            let counts = try reconciler.counts(db)
            return LocalState(
                documents: try reconciler.localDocuments(db), pending: counts.pending, failed: counts.failed,
                unsynced: try reconciler.unsyncedRowCount(db))
        }
    }

    /// Synced rows that have no server id yet.
    public func unsyncedRowCount() throws -> Int {
        try readState { db in try reconciler.unsyncedRowCount(db) }
    }

    public func unsyncedRowCount() async throws -> Int {
        try await readState { [reconciler] db in try reconciler.unsyncedRowCount(db) }
    }
}

/// What a device holds and has still to push, at one moment (``SyncService/localState()``).
public struct LocalState: Sendable {
    /// Every synced row with a server id, as the document a push would send.
    public var documents: [CollectionPath: [DocumentID: JSONObject]]
    /// Rows not pushed yet (dirty rows and deletes), failed ones excluded.
    public var pending: Int
    /// Rows whose push failed for good.
    public var failed: Int
    /// Synced rows without a server id.
    public var unsynced: Int
}
