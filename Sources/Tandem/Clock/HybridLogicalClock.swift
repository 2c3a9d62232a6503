import Synchronization

/// A hybrid logical clock: timestamps that follow the wall clock but never go backwards on a
/// device, and that move past every timestamp the device has received.
///
/// Every time Tandem compares (a row's `updatedAt`, a field's time) is one of these. So when a
/// device whose clock runs an hour fast edits a row, and a slow device then receives that edit
/// and edits the row again, the second edit gets the later time: causality holds whatever the
/// wall clocks say.
///
/// A timestamp is one `Int64`, which SQLite compares as it compares numbers: milliseconds
/// since 1970 in the high 48 bits, a counter in the low 16 bits for events within the same
/// millisecond. ``milliseconds(_:)`` recovers the wall time.
///
/// For example:
///
/// ```swift
/// let clock = HybridLogicalClock(wall: SystemClock())
/// let a = clock.now()
/// clock.receive(b)          // a timestamp from another device
/// let c = clock.now()       // c > a and c > b
/// ```
public final class HybridLogicalClock: Sendable {
    private let wall: any SyncClock
    private let last: Mutex<Int64>

    /// The number of low bits used for the counter.
    public static let counterBits: Int64 = 16

    /// - Parameters:
    ///   - wall: The device's wall clock.
    ///   - start: A timestamp the clock must not go below (the latest one issued or received
    ///     before a restart).
    public init(wall: any SyncClock, start: Int64 = 0) {
        self.wall = wall
        last = Mutex(start)
    }

    /// A new timestamp, later than every one issued or received so far.
    public func now() -> Int64 {
        let physical = wall.now() << Self.counterBits
        return last.withLock { last in
            last = physical > last ? physical : last + 1
            return last
        }
    }

    /// Takes in a timestamp from elsewhere: later timestamps of this clock come after it.
    public func receive(_ timestamp: Int64) {
        last.withLock { $0 = max($0, timestamp) }
    }

    /// The latest timestamp issued or received.
    public var latest: Int64 { last.withLock { $0 } }

    /// The wall-clock milliseconds of a timestamp.
    public static func milliseconds(_ timestamp: Int64) -> Int64 { timestamp >> counterBits }

    /// The timestamp of a wall-clock time (counter 0), for times from the server.
    public static func timestamp(milliseconds: Int64) -> Int64 { milliseconds << counterBits }
}
