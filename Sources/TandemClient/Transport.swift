import Synchronization
import TandemSocket

/// How a ``ServerConnection`` reaches a server: a WebSocket client that carries whole text
/// messages.
///
/// Tandem ships ``LibWebSocketsTransport``. An app that cannot link libwebsockets (on an
/// Apple platform, over `URLSessionWebSocketTask`) supplies its own and checks it with
/// `TandemTesting`'s `TransportConformance` suite, which Tandem's own transport passes.
///
/// The contract, which the suite checks:
/// - `connect` returns at once; it throws only for a URL the transport cannot use. A server
///   that cannot be reached is a `.closed` event with `failedToConnect`.
/// - Events of one connection reach the handler one at a time, in order: every received text
///   message whole (however the network split it), then exactly one `.closed`, also when the
///   connection never opened or was closed or aborted from this side.
/// - `send` may be called before the connection has opened: messages wait for it, and go out
///   in the order they were sent. It throws when the connection is closed, and when the peer
///   has stopped reading and the bytes waiting exceed the transport's bound (it never blocks
///   and never buffers without limit).
public protocol WebSocketTransport: Sendable {
    /// Starts connecting to `url` (`ws://` or `wss://`).
    func connect(to url: String, handler: @escaping @Sendable (TransportEvent) -> Void) throws(TransportError)
        -> any TransportConnection
}

/// One connection made by a ``WebSocketTransport``.
public protocol TransportConnection: AnyObject, Sendable {
    /// True from the open until the connection starts to close, from either side (before the
    /// `.closed` event, which may still be on its way).
    var isOpen: Bool { get }
    /// Queues a whole text message (UTF-8).
    func send(text: [UInt8]) throws(TransportError)
    /// Closes with a close frame carrying `code` and `reason`; `.closed` follows.
    func close(code: UInt16, reason: String)
    /// Ends the connection at once, dropping what is queued, as a network failure would
    /// (whether a close frame still goes out is the transport's choice); `.closed` follows.
    func abort()
}

/// What a ``TransportConnection`` reports.
public enum TransportEvent: Sendable {
    /// A whole text message.
    case text([UInt8])
    /// The connection is over; nothing follows.
    case closed(TransportClose)
}

/// How a connection ended.
public struct TransportClose: Sendable, Hashable, CustomStringConvertible {
    /// The close frame's status code; 1006 when there was none (a dropped connection).
    public var code: UInt16
    /// The close frame's reason, or what happened locally.
    public var reason: String
    /// True when the connection never opened (refused, unreachable, TLS or upgrade rejected).
    public var failedToConnect: Bool

    public init(code: UInt16, reason: String, failedToConnect: Bool = false) {
        self.code = code
        self.reason = reason
        self.failedToConnect = failedToConnect
    }

    public var description: String {
        if failedToConnect { return "could not connect: \(reason)" }
        return reason.isEmpty ? "closed (\(code))" : "closed (\(code)): \(reason)"
    }
}

/// A transport that cannot do what was asked.
public struct TransportError: Error, Sendable, Hashable, CustomStringConvertible {
    public struct Code: RawRepresentable, Hashable, Sendable {
        public var rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }

        /// The URL is not one the transport can connect to.
        public static let invalidURL = Code(rawValue: "invalid-url")
        /// The connection is closed (or closing).
        public static let notOpen = Code(rawValue: "not-open")
        /// The peer is not reading and the bytes waiting for it exceed the bound.
        public static let backpressure = Code(rawValue: "backpressure")
        /// Anything else (the transport could not start).
        public static let failed = Code(rawValue: "failed")
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { message }
}

// MARK: - libwebsockets

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

    public func connect(to url: String, handler: @escaping @Sendable (TransportEvent) -> Void) throws(TransportError)
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
