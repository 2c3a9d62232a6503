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
        let (socket, port) = try boundPort()
        defer { close(socket) }
        for attempt in 0..<2000 {
            do {
                let connection = try await ServerConnection.connect(
                    to: "ws://127.0.0.1:\(port)", clientId: "c\(attempt)", timeout: .seconds(2))
                connection.close()
                Issue.record("attempt \(attempt) connected to a closed port")
            } catch let error as TandemError {
                // A lost failure ends in `.timedOut` instead.
                #expect(error.code == .unreachable, "attempt \(attempt): \(error)")
            }
        }
    }

    /// A socket bound to a free loopback port, and the port.
    private func boundPort() throws -> (socket: Int32, port: Int) {
        let socket = Foundation.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { raw in
                bind(socket, raw, length) == 0 && getsockname(socket, raw, &length) == 0
            }
        }
        guard bound else {
            close(socket)
            throw ConnectionTestFailure(description: "cannot bind a loopback port: errno \(errno)")
        }
        return (socket, Int(UInt16(bigEndian: address.sin_port)))
    }
}

struct ConnectionTestFailure: Error, CustomStringConvertible {
    var description: String
}
