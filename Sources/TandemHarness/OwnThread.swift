import Foundation
import Synchronization

/// Runs blocking work (a socket read, a fuzz harness) on a thread of its own and awaits it.
///
/// Swift concurrency runs tasks on as many threads as there are cores, and on Linux
/// `DispatchQueue.global()` shares them: work that blocks one of them stalls every test in
/// the process. A new thread costs a few microseconds and blocks nobody.
public func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread { continuation.resume(with: Result { try body() }) }
    }
}

/// Blocking work started on a thread of its own *now*, before the caller's next suspension,
/// whose result is awaited later.
///
/// `Task { try await onOwnThread { … } }` starts the thread only once the cooperative pool
/// runs the task, which a loaded machine may delay for seconds: too late for work that must
/// begin at a given moment (a client that has to keep talking from the time it connected).
public final class OwnThread<T: Sendable>: Sendable {
    private enum State {
        case running([CheckedContinuation<T, any Error>])
        case finished(Result<T, any Error>)
    }
    private let state = Mutex(State.running([]))

    public init(_ body: @escaping @Sendable () throws -> T) {
        Thread.detachNewThread { [self] in
            let result = Result { try body() }
            let waiting = state.withLock { state -> [CheckedContinuation<T, any Error>] in
                guard case .running(let waiting) = state else { return [] }
                state = .finished(result)
                return waiting
            }
            for continuation in waiting { continuation.resume(with: result) }
        }
    }

    /// Whether the body has returned or thrown.
    public var isFinished: Bool {
        state.withLock { state in
            if case .finished = state { true } else { false }
        }
    }

    /// The body's result, once it returned or threw.
    public var value: T {
        get async throws {
            try await withCheckedThrowingContinuation { continuation in
                let finished = state.withLock { state -> Result<T, any Error>? in
                    switch state {
                    case .running(let waiting):
                        state = .running(waiting + [continuation])
                        return nil
                    case .finished(let result):
                        return result
                    }
                }
                if let finished { continuation.resume(with: finished) }
            }
        }
    }
}
