import Foundation

/// Where Tandem reads the time it stamps on local changes (`updatedAt`, in milliseconds
/// since 1970).
///
/// Tests pass their own clock so that "later" is decided by the test, not by the machine.
public protocol SyncClock: Sendable {
    func now() -> Int64
}

/// The system's wall clock.
public struct SystemClock: SyncClock {
    public init() {}

    public func now() -> Int64 {
        Int64((Date().timeIntervalSince1970 * 1000).rounded())
    }
}
