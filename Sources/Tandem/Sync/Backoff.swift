/// Exponential backoff with jitter and a cap, for reconnecting.
///
/// The delay doubles with each failure, up to the cap; the actual wait is between half the
/// delay and the delay ("equal jitter"), so that many clients cut off together do not come
/// back together.
struct Backoff: Sendable {
    var initial: Duration
    var cap: Duration

    func delay(attempt: Int, random: Double) -> Duration {
        let factor = Double(1 << min(attempt, 20))
        let base = min(initial * factor, cap)
        return base * (0.5 + 0.5 * random)
    }
}
