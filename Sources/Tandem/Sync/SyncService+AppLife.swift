import Foundation
import Observation
import Synchronization

/// What a bounded sync (``SyncService/sync(within:)``) did, and what it left.
public struct SyncRun: Sendable, Equatable {
    /// Everything that waited went out, its answers were written back, and what the listeners
    /// had received was applied, before the deadline.
    public var finished: Bool
    /// Ops the server acknowledged in this run.
    public var pushed: Int
    /// Local changes still waiting to be pushed (the next run sends them, under the same
    /// idempotency keys for those already sent).
    public var pending: Int
    /// Rows whose push failed for good.
    public var failed: Int
    /// What stopped the run early, if anything (offline, the deadline).
    public var error: TandemError?
}

extension SyncService {
    /// Syncs for at most `budget`: pushes what waits, writes the answers back, applies what the
    /// listeners received, and returns before the deadline with what is left, whatever the
    /// network does. For background work with a time limit, such as iOS's `BGAppRefreshTask`
    /// (about 30 seconds).
    ///
    /// For example:
    ///
    /// ```swift
    /// BGTaskScheduler.shared.register(forTaskWithIdentifier: "app.sync", using: nil) { task in
    ///     Task {
    ///         let run = await sync.sync(within: .seconds(25))
    ///         task.setTaskCompleted(success: run.finished)
    ///     }
    /// }
    /// ```
    ///
    /// At the deadline a push still under way is cut off where it is, as a lost connection
    /// would cut it: the rows it sent keep their idempotency keys, and the next run (or the
    /// next connection) sends them again under the same keys, so that nothing is applied twice.
    /// The service must be started (``start()``); it goes on syncing afterwards as usual.
    ///
    /// - Parameter budget: The time allowed, from now.
    public func sync(within budget: Duration) async -> SyncRun {
        let deadline = ContinuousClock.now + budget
        var run = SyncRun(finished: false, pushed: 0, pending: 0, failed: 0, error: nil)
        // A push may wait for a connection for a third of the budget.
        switch await Self.race(until: deadline, { try await self.syncNow(connectionWait: budget / 3) }) {
        case .done(.success(let report)):
            run.pushed = report.pushed
            // What the listeners received meanwhile is applied in queue order, after the push.
            switch await Self.race(until: deadline, { await self.queuedWorkDone() }) {
            case .done: run.finished = report.pending == 0
            case .deadline: run.error = TandemError(.timedOut, "the deadline came while received changes were applied")
            }
        case .done(.failure(let error)):
            run.error = TandemError("sync failed", error, otherwise: .database)
        case .deadline:
            // Cut off where it is: unanswered writes keep their keys for the next connection.
            reconnect()
            run.error = TandemError(.timedOut, "the deadline came before the push ended; the rest goes out next time")
        }
        if let counts = try? await readState({ [reconciler] db in try reconciler.counts(db) }) {
            run.pending = counts.pending
            run.failed = counts.failed
            if counts.pending > 0 { run.finished = false }
        }
        return run
    }

    /// Returns once every operation queued on the sync queue before this call has run.
    private func queuedWorkDone() async {
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            queue.add { done.resume() }
        }
    }

    private enum Raced<T: Sendable>: Sendable {
        case done(T)
        case deadline
    }

    /// Runs `work` and returns its result, or `.deadline` at the deadline, whichever comes
    /// first; the work goes on in the background when the deadline wins.
    private static func race<T: Sendable>(
        until deadline: ContinuousClock.Instant, _ work: @escaping @Sendable () async throws -> T
    ) async -> Raced<Result<T, any Error>> {
        let first = FirstOf<Raced<Result<T, any Error>>>()
        return await withCheckedContinuation { continuation in
            first.continuation = continuation
            Task { first.offer(.done(await Result { try await work() })) }
            SyncTimer.after(deadline - .now) { first.offer(.deadline) }
        }
    }
}

/// The first of several offers resumes a continuation; the others are dropped.
private final class FirstOf<Value: Sendable>: Sendable {
    private let state = Mutex<(continuation: CheckedContinuation<Value, Never>?, early: Value?, taken: Bool)>(
        (nil, nil, false))

    var continuation: CheckedContinuation<Value, Never>? {
        get { state.withLock { $0.continuation } }
        set {
            let early = state.withLock { state -> Value? in
                state.continuation = newValue
                return state.early
            }
            if let early { offer(early) }
        }
    }

    func offer(_ value: Value) {
        let continuation = state.withLock { state -> CheckedContinuation<Value, Never>? in
            guard !state.taken else { return nil }
            guard let continuation = state.continuation else {
                if state.early == nil { state.early = value }
                return nil
            }
            state.taken = true
            return continuation
        }
        continuation?.resume(returning: value)
    }
}

extension Result where Failure == any Error {
    fileprivate init(catching body: () async throws -> Success) async {
        do { self = .success(try await body()) } catch { self = .failure(error) }
    }
}

/// The sync status as an observable model, for SwiftUI: a view that reads it is redrawn when
/// it changes.
///
/// For example:
///
/// ```swift
/// struct SyncBadge: View {
///     let status: ObservableSyncStatus
///     var body: some View {
///         Label("\(status.pendingCount) to send", systemImage: status.isConnected ? "icloud" : "icloud.slash")
///     }
/// }
/// // SyncBadge(status: sync.observableStatus())
/// ```
///
/// It follows ``SyncService/statusUpdates()`` on the main actor, where SwiftUI reads it.
@MainActor
@Observable
public final class ObservableSyncStatus {
    /// The whole status, as it was last published.
    public private(set) var status: SyncStatus
    @ObservationIgnored private var following: Task<Void, Never>?

    init(_ service: SyncService) {
        status = service.status
        let updates = service.statusUpdates()
        following = Task { [weak self] in
            for await status in updates {
                guard let self else { return }
                if self.status != status { self.status = status }
            }
        }
    }

    isolated deinit {
        following?.cancel()
    }

    public var isConnected: Bool { status.isConnected }
    public var pendingCount: Int { status.pendingCount }
    public var failedCount: Int { status.failedCount }
    public var openConflicts: Int { status.openConflicts }
    public var lastError: TandemError? { status.lastError }
}

extension SyncService {
    /// The status as an `@Observable` model for SwiftUI (``ObservableSyncStatus``); one per
    /// call, following this service for as long as it lives.
    @MainActor
    public func observableStatus() -> ObservableSyncStatus {
        ObservableSyncStatus(self)
    }
}
