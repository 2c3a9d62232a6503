import Foundation
import TandemSocket

extension WebSocketServer {
    /// Shuts down on a thread of its own and returns at once: for a test's `defer`, which
    /// cannot `await` ``shutdown()`` and must not block a thread of Swift concurrency's pool
    /// while close handshakes finish.
    public func shutdownWithoutWaiting() {
        Thread.detachNewThread { self.shutdown() }
    }
}

extension WebSocketClient {
    /// Shuts down on a thread of its own and returns at once: for a test's `defer` (see
    /// ``WebSocketServer/shutdownWithoutWaiting()``).
    public func shutdownWithoutWaiting() {
        Thread.detachNewThread { self.shutdown() }
    }
}
