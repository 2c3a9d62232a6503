import Foundation
import Tandem
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
}
