import Logging

/// A WebSocket server on its own libwebsockets context and service thread.
///
/// Start it on port 0 to let the system pick a free port, as tests do:
///
/// ```swift
/// let server = try WebSocketServer(host: "127.0.0.1", port: 0, delegate: handler)
/// print("listening on ws://127.0.0.1:\(server.port)")
/// defer { server.shutdown() }
/// ```
///
/// Every accepted connection reports to `delegate`, on the service thread.
public final class WebSocketServer: Sendable {
    /// The address the server listens on.
    public let host: String
    /// The port the server listens on (the one the system picked when asked for 0).
    public let port: Int

    private let loop: ServiceLoop

    /// Starts listening.
    ///
    /// - Parameters:
    ///   - host: An IPv4 or IPv6 address of this machine, `localhost`, or `0.0.0.0` for all.
    ///   - port: The port, or 0 for any free port.
    ///   - configuration: Message and queue limits, keepalive timers.
    ///   - delegate: Receives the events of every accepted connection.
    ///   - httpHandler: Answers plain HTTP requests on the same port (health, metrics, …);
    ///     without one they get 404.
    ///   - httpAdmission: Judges each plain HTTP request from its headers, before its body is
    ///     read; without one every request is taken, with a body up to
    ///     ``WebSocketConfiguration/maxHTTPBodyBytes``.
    ///   - logger: Where libwebsockets' warnings and errors go.
    /// - Throws: ``WebSocketError`` `.contextCreationFailed` when the address cannot be bound.
    public init(
        host: String = "127.0.0.1", port: Int = 0, configuration: WebSocketConfiguration = .init(),
        delegate: any WebSocketDelegate, httpHandler: HTTPHandler? = nil, httpAdmission: HTTPAdmission? = nil,
        logger: Logger = Logger(label: "tandem.socket")
    ) throws(WebSocketError) {
        guard (0...65535).contains(port) else {
            throw WebSocketError(.contextCreationFailed, "port \(port) is not between 0 and 65535")
        }
        loop = try ServiceLoop(
            name: "server", listen: (host, port), acceptDelegate: delegate, httpHandler: httpHandler,
            httpAdmission: httpAdmission,
            configuration: configuration, logger: logger)
        self.host = host
        self.port = loop.listenPort
    }

    /// Open connections.
    public var connectionCount: Int { loop.connectionCount }

    /// The name of the service thread (for diagnostics and leak checks).
    public var threadName: String { loop.threadName }

    /// Closes every connection with 1001 ("going away"), stops listening and joins the service
    /// thread. Safe to call more than once and from any thread.
    public func shutdown() {
        loop.shutdown()
    }

    /// ``shutdown()`` for async callers: waits for the close handshakes without holding a
    /// thread of Swift concurrency's pool.
    public func shutdown() async {
        await loop.shutdown()
    }
}
