import Dispatch

/// The conversions of `Duration` that the client, the server and the scenarios share: whole
/// milliseconds for the wire and the stores, seconds for figures and sleeps, a dispatch
/// interval for timers.
extension Duration {
    /// Whole milliseconds, rounded down.
    package var milliseconds: Int64 { components.seconds * 1000 + components.attoseconds / 1_000_000_000_000_000 }

    /// Whole microseconds, rounded down.
    package var microseconds: Int64 { components.seconds * 1_000_000 + components.attoseconds / 1_000_000_000_000 }

    package var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }

    /// The same interval for `DispatchQueue.asyncAfter`, at most a day (a longer timer is a
    /// mistake, and its nanoseconds would overflow `Int` on 32-bit platforms).
    package var dispatchInterval: DispatchTimeInterval {
        let capped = min(self, .seconds(86_400))
        return .nanoseconds(
            Int(capped.components.seconds) * 1_000_000_000 + Int(capped.components.attoseconds / 1_000_000_000))
    }
}
