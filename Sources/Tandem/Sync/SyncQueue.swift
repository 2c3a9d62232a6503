import Foundation
import Synchronization
import TandemWire

/// The sync queue: an `OperationQueue` that runs one operation at a time, with pushes as
/// barrier blocks (see ``SyncService``). Debug builds mark the thread that runs each
/// operation, so that code whose comment says it runs on the sync queue can check it
/// (``isCurrent``): `OperationQueue.current` does not say so on Linux, where
/// swift-corelibs-foundation runs a barrier block added to an empty queue on the queue's own
/// backing queue.
final class SyncQueue: Sendable {
    let label: String
    private let operations: OperationQueue
    /// The thread running the current operation, and whether it is a barrier (debug builds
    /// only).
    private let runner = Mutex<(thread: ObjectIdentifier, isBarrier: Bool)?>(nil)

    init(label: String) {
        self.label = label
        operations = OperationQueue()
        operations.name = label
        operations.maxConcurrentOperationCount = 1
        // No underlying queue here: swift-corelibs-foundation runs a barrier block added to an
        // empty queue on the operation queue's own backing queue, not on the underlying one,
        // so with an underlying queue set, later operations would not wait for the barrier.
    }

    /// Queues work that waits for every operation before it, and that every later one waits for.
    func addBarrier(_ work: @escaping @Sendable () -> Void) {
        operations.addBarrierBlock { [self] in run(work, isBarrier: true) }
    }

    /// Queues work.
    func add(_ work: @escaping @Sendable () -> Void) {
        operations.addOperation { [self] in run(work, isBarrier: false) }
    }

    /// Drops the operations that have not started.
    func cancelAll() { operations.cancelAllOperations() }

    /// Blocks until the operations queued so far have run.
    func waitForQueuedWork() {
        operations.addOperations([BlockOperation {}], waitUntilFinished: true)
    }

    /// Whether the caller runs inside one of this queue's operations (always true in release
    /// builds, which do not mark them).
    var isCurrent: Bool {
        #if DEBUG
            runner.withLock { $0?.thread } == ObjectIdentifier(Thread.current)
        #else
            true
        #endif
    }

    /// Whether the caller runs inside one of this queue's barrier blocks (always true in
    /// release builds).
    var isInBarrier: Bool {
        #if DEBUG
            runner.withLock { $0.map { $0.thread == ObjectIdentifier(Thread.current) && $0.isBarrier } ?? false }
        #else
            true
        #endif
    }

    private func run(_ work: @Sendable () -> Void, isBarrier: Bool) {
        #if DEBUG
            let previous = runner.withLock { runner in
                defer { runner = (ObjectIdentifier(Thread.current), isBarrier) }
                return runner
            }
            defer { runner.withLock { $0 = previous } }
        #endif
        work()
    }
}
