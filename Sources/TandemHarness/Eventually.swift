import Foundation

/// The condition given to ``waitUntil(_:timeout:_:)`` did not hold before the deadline.
public struct WaitTimedOut: Error, CustomStringConvertible {
    public var condition: String
    public var timeout: Duration
    public var description: String { "timed out after \(timeout) waiting until \(condition)" }
}

/// Waits until `condition` holds, checking it again and again, up to `timeout`.
///
/// Tests wait on a condition with a deadline instead of sleeping for a guessed time: they
/// finish as soon as the condition holds and fail with a clear message when it never does.
/// The checks start 1 ms apart and space out to 50 ms: a condition that holds soon is seen
/// soon, and dozens of tests waiting at once on a busy machine do not spend its CPU polling.
///
/// The default deadline is generous, a bound on progress and never a measure of speed: on a
/// loaded machine running the suite in parallel, one connection attempt alone may take its
/// whole 10 s timeout before the next succeeds.
///
/// For example:
///
/// ```swift
/// try await waitUntil("device B has 3 rows") { try deviceB.rowCount() == 3 }
/// ```
public func waitUntil(
    _ condition: String, timeout: Duration = .seconds(60), _ check: () async throws -> Bool
) async throws {
    let deadline = ContinuousClock.now + timeout
    var pause = Duration.milliseconds(1)
    while true {
        if try await check() { return }
        if ContinuousClock.now >= deadline { throw WaitTimedOut(condition: condition, timeout: timeout) }
        try await Task.sleep(for: pause)
        pause = min(pause * 2, .milliseconds(50))
    }
}
