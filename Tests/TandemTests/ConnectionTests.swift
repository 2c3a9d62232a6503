import Foundation
import Synchronization
import Tandem
import TandemSocket
import TandemTesting
import Testing

@Suite("Connecting")
struct ConnectionTests {
    @Test("connecting to a port nobody listens on fails at once, every time, instead of waiting for the timeout")
    func refusedConnectionsFailFast() async throws {
        // Found by the soak: a refused connection fails within microseconds, on the socket's
        // thread, and its close could come before the connection object was wired to the
        // socket; it was dropped and connect waited for its timeout (one attempt in five in a
        // release build, about one in 500 in a debug build, hence the many attempts).
        // The port stays bound, not listening, until the end: connects to it are refused, and
        // no server started meanwhile by another test can take it.
        let refusing = try RefusingPort()
        for attempt in 0..<2000 {
            do {
                let connection = try await ServerConnection.connect(
                    to: refusing.url, clientId: "c\(attempt)", timeout: .seconds(15))
                connection.close()
                Issue.record("attempt \(attempt) connected to a closed port")
            } catch let error as TandemError {
                // A lost failure ends in `.timedOut` instead.
                #expect(error.code == .unreachable, "attempt \(attempt): \(error)")
            }
        }
    }

    @Test("a hello that is never answered times out, and the socket does not stay open behind the error")
    func unansweredHelloCloses() async throws {
        let silent = Silent()
        // The server never drops the client itself: only the client's own close can end it.
        var configuration = WebSocketConfiguration()
        configuration.pingInterval = 3600
        configuration.idleTimeout = 7200
        let server = try WebSocketServer(port: 0, configuration: configuration, delegate: silent)
        defer { server.shutdownWithoutWaiting() }
        await #expect {
            _ = try await ServerConnection.connect(
                to: "ws://127.0.0.1:\(server.port)", clientId: "patient", timeout: .milliseconds(300))
        } throws: { error in
            (error as? TandemError)?.code == .timedOut
        }
        try await waitUntil("the server saw the client go") { silent.closed.withLock { $0 } == 1 }
    }
}

/// A WebSocket server that never answers.
private final class Silent: WebSocketDelegate {
    let closed = Mutex(0)
    func webSocketDidOpen(_ connection: WebSocketConnection) {}
    func webSocket(_ connection: WebSocketConnection, didReceive message: WebSocketMessage) {}
    func webSocket(_ connection: WebSocketConnection, didCloseWith event: WebSocketCloseEvent) {
        closed.withLock { $0 += 1 }
    }
}
