import Dispatch
import TandemWire

/// The sync engine's one timer model: work that runs once after a delay, or at an interval
/// until cancelled, on libdispatch's global queue. Timers only enqueue work (a push on the sync
/// queue, a connection attempt, a listener refresh): none waits on a thread of Swift
/// concurrency's pool, and each can be cancelled from any thread. Their clock is libdispatch's
/// (`DispatchTime`), which does not count while the system sleeps: a delay due during a sleep
/// runs its rest after the wake.
final class SyncTimer: Sendable {
    // A dispatch source's `cancel()` may be called from any thread.
    private nonisolated(unsafe) let source: DispatchSourceTimer

    private init(_ source: DispatchSourceTimer) { self.source = source }

    /// Runs `work` once, after `delay`, unless cancelled before.
    @discardableResult
    static func after(_ delay: Duration, _ work: @escaping @Sendable () -> Void) -> SyncTimer {
        let source = DispatchSource.makeTimerSource(queue: .global())
        source.schedule(deadline: .now() + max(delay, .zero).dispatchInterval)
        // The handler holds the source until it has fired: cancelling releases the handler.
        source.setEventHandler {
            source.cancel()
            work()
        }
        source.resume()
        return SyncTimer(source)
    }

    /// Runs `work` every `interval` until cancelled, or until `work` returns false (its owner
    /// is gone).
    static func every(_ interval: Duration, _ work: @escaping @Sendable () -> Bool) -> SyncTimer {
        let source = DispatchSource.makeTimerSource(queue: .global())
        let step = max(interval, .milliseconds(1)).dispatchInterval
        source.schedule(deadline: .now() + step, repeating: step)
        source.setEventHandler {
            if !work() { source.cancel() }
        }
        source.resume()
        return SyncTimer(source)
    }

    /// Stops the timer; work that has started runs to its end.
    func cancel() { source.cancel() }

    var isCancelled: Bool { source.isCancelled }
}
