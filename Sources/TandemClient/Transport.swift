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
        /// There is no transport to connect with (a build without libwebsockets was given none).
        public static let unavailable = Code(rawValue: "unavailable")
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
