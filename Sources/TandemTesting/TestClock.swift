import Synchronization
import Tandem

/// A clock the test sets by hand, for deciding which edit is "later" without sleeping.
///
/// For example:
///
/// ```swift
/// let clock = TestClock(now: 1_000)
/// configuration.clock = clock
/// clock.advance(by: 60_000)  // one minute later
/// ```
public final class TestClock: SyncClock {
    private let time: Mutex<Int64>

    /// - Parameter now: Milliseconds since 1970; by default the real time, so that the clock
    ///   agrees with a server's (Tandem's clocks take in the server's times).
    public init(now: Int64? = nil) {
        time = Mutex(now ?? SystemClock().now())
    }

    public func now() -> Int64 { time.withLock { $0 } }

    public func advance(by milliseconds: Int64) { time.withLock { $0 += milliseconds } }

    public func set(_ milliseconds: Int64) { time.withLock { $0 = milliseconds } }
}
