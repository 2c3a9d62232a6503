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

    public init(now: Int64 = 1_763_683_200_000) {
        time = Mutex(now)
    }

    public func now() -> Int64 { time.withLock { $0 } }

    public func advance(by milliseconds: Int64) { time.withLock { $0 += milliseconds } }

    public func set(_ milliseconds: Int64) { time.withLock { $0 = milliseconds } }
}
