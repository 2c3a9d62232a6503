import Dispatch
import Synchronization
import TandemWire

/// A place where a test holds the sync engine, to force an interleaving.
///
/// Put ``pause()`` in a hook; the engine thread that reaches it waits there until the test
/// calls ``release()``. Meanwhile the test does what must happen "in between" and can await
/// ``reached(timeout:)`` to know the engine is there.
///
/// For example, holding the pusher between the server's acknowledgement and the write-back:
///
/// ```swift
/// let afterAck = Checkpoint()
/// configuration.hooks.afterAck = { _ in afterAck.pause() }
/// // …
/// try await afterAck.reached()
/// // the listener's echo arrives and is queued now
/// afterAck.release()
/// ```
///
/// A checkpoint holds the first thread that reaches it (or the first `times` threads), then
/// lets everything through.
public final class Checkpoint: Sendable {
    private let state: Mutex<State>
    private let gate = DispatchSemaphore(value: 0)

    private struct State {
        var skip: Int
        var remaining: Int
        var waiting = 0
        var reached = 0
        var released = false
    }

    /// - Parameters:
    ///   - skip: How many arrivals to let through before holding.
    ///   - times: How many arrivals to hold; later ones pass.
    public init(skip: Int = 0, times: Int = 1) {
        state = Mutex(State(skip: skip, remaining: times))
    }

    /// Called from a hook, on the engine's thread: waits here until ``release()``, unless
    /// this checkpoint already held as many arrivals as it should.
    public func pause() {
        let hold = state.withLock { state -> Bool in
            state.reached += 1
            if state.skip > 0 {
                state.skip -= 1
                return false
            }
            guard state.remaining > 0, !state.released else { return false }
            state.remaining -= 1
            state.waiting += 1
            return true
        }
        if hold {
            BlockingCheck.willBlock("Checkpoint.pause()")
            gate.wait()
        }
    }

    /// How many times a thread arrived here.
    public var arrivals: Int { state.withLock { $0.reached } }

    /// Waits until a thread is held here.
    public func reached(timeout: Duration = .seconds(60)) async throws {
        try await waitUntil("the engine reaches the checkpoint", timeout: timeout) {
            state.withLock { $0.waiting > 0 }
        }
    }

    /// Lets held threads go, and every later arrival through.
    public func release() {
        let waiting = state.withLock { state -> Int in
            state.released = true
            defer { state.waiting = 0 }
            return state.waiting
        }
        for _ in 0..<waiting { gate.signal() }
    }
}
