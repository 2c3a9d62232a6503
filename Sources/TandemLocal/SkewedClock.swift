import Tandem
import TandemHarness

/// The system clock shifted by a fixed offset: a device whose clock is wrong.
public struct SkewedClock: SyncClock {
    /// Milliseconds added to the real time (negative: the clock is behind).
    public var offset: Int64

    public init(offset: Int64) { self.offset = offset }

    public func now() -> Int64 { SystemClock().now() + offset }
}
