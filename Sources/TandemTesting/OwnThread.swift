import Foundation

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
