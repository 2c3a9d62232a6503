// Where the client links no libwebsockets (Apple platforms, see Package.swift), this file holds
// only the choice of the default transport.
import Foundation

#if canImport(TandemSocket)
    import Synchronization
    import TandemSocket

    /// The transport over libwebsockets: one event loop (a thread) per set of trusted
    /// certificate authorities, shared by every connection of the process.
    public struct LibWebSocketsTransport: WebSocketTransport {
        private let client: WebSocketClient

        /// - Parameter trustedCertificates: For `wss://`: a PEM file of the certificate
        ///   authorities the server's certificate must chain to; nil for the system's.
        public init(trustedCertificates: String? = nil) throws(TransportError) {
            do {
                client = try SharedClientLoop.get(trusting: trustedCertificates)
            } catch {
                throw TransportError(.failed, "\(error)")
            }
        }

        /// A transport on an event loop of the caller's (for tests that count its connections).
        public init(client: WebSocketClient) {
            self.client = client
        }

        public func connect(to url: String, handler: @escaping @Sendable (TransportEvent) -> Void)
            throws(TransportError)
            -> any TransportConnection
        {
            do {
                return Connection(try client.connect(to: url, delegate: Relay(handler)))
            } catch {
                throw TransportError(error.code == .invalidURL ? .invalidURL : .failed, error.message)
            }
        }

        private final class Connection: TransportConnection {
            let socket: WebSocketConnection

            init(_ socket: WebSocketConnection) { self.socket = socket }

            var isOpen: Bool { socket.isOpen }

            func send(text: [UInt8]) throws(TransportError) {
                do {
                    try socket.send(OutboundMessage(text: text))
                } catch {
                    throw TransportError(error.code == .sendQueueOverflow ? .backpressure : .notOpen, error.message)
                }
            }

            func close(code: UInt16, reason: String) {
                socket.close(code: WebSocketCloseCode(rawValue: code), reason: reason)
            }

            func abort() {
                socket.abort(code: .goingAway, reason: "the connection was dropped")
            }
        }

        private final class Relay: WebSocketDelegate {
            let handler: @Sendable (TransportEvent) -> Void

            init(_ handler: @escaping @Sendable (TransportEvent) -> Void) { self.handler = handler }

            func webSocketDidOpen(_ socket: WebSocketConnection) {}

            func webSocket(_ socket: WebSocketConnection, didReceive message: WebSocketMessage) {
                handler(.text(message.bytes))
            }

            func webSocket(_ socket: WebSocketConnection, didCloseWith event: WebSocketCloseEvent) {
                handler(
                    .closed(
                        TransportClose(
                            code: event.code.rawValue, reason: event.reason, failedToConnect: event.failedToConnect))
                )
            }
        }
    }

    /// The process-wide client event loops, made on first use: one per set of trusted
    /// certificate authorities (usually just the system's).
    package enum SharedClientLoop {
        private static let loops = Mutex<[String: WebSocketClient]>([:])

        /// - Parameter trusting: A PEM file of certificate authorities for `wss://`; nil for the
        ///   system's.
        package static func get(trusting authorities: String? = nil) throws -> WebSocketClient {
            try loops.withLock { loops in
                if let loop = loops[authorities ?? ""] { return loop }
                do {
                    var configuration = WebSocketConfiguration()
                    configuration.trustedCertificates = authorities
                    let client = try WebSocketClient(configuration: configuration)
                    loops[authorities ?? ""] = client
                    return client
                } catch {
                    throw TandemError(.unreachable, "cannot start the WebSocket event loop: \(error)")
                }
            }
        }
    }
#endif

/// The transport used when none is given: libwebsockets where the client links it (Linux),
/// SwiftNIO's elsewhere (Apple platforms, and builds without libwebsockets).
/// `TANDEM_CLIENT_TRANSPORT=nio` (or `libwebsockets`) in the environment chooses one, for a run
/// of the tests over each.
func defaultTransport(trustedCertificates: String?) throws(TransportError) -> any WebSocketTransport {
    #if canImport(TandemSocket)
        if ProcessInfo.processInfo.environment["TANDEM_CLIENT_TRANSPORT"] != "nio" {
            return try LibWebSocketsTransport(trustedCertificates: trustedCertificates)
        }
    #endif
    return try NIOWebSocketTransport(trustedCertificates: trustedCertificates)
}
