import Foundation
import Logging

/// An event loop for client connections: one libwebsockets context, one service thread, any
/// number of connections.
///
/// Many devices in one process (the demo, the benchmarks, the tests) share one client loop
/// instead of paying a thread each.
///
/// For example:
///
/// ```swift
/// let client = try WebSocketClient()
/// let connection = try client.connect(to: "ws://127.0.0.1:7878/", delegate: handler)
/// try connection.send(text: "…")
/// client.shutdown()
/// ```
public final class WebSocketClient: Sendable {
    private let loop: ServiceLoop
    private let configuration: WebSocketConfiguration

    public init(
        configuration: WebSocketConfiguration = .init(), logger: Logger = Logger(label: "tandem.socket")
    ) throws(WebSocketError) {
        self.configuration = configuration
        loop = try ServiceLoop(
            name: "client", listen: nil, acceptDelegate: nil, configuration: configuration, logger: logger)
    }

    /// Open connections.
    public var connectionCount: Int { loop.connectionCount }

    /// The name of the service thread (for diagnostics and leak checks).
    public var threadName: String { loop.threadName }

    /// Starts connecting to `url` (`ws://host:port/path`).
    ///
    /// Returns at once; `delegate` hears ``WebSocketDelegate/webSocketDidOpen(_:)`` when the
    /// handshake completes or ``WebSocketDelegate/webSocket(_:didCloseWith:)`` with
    /// `failedToConnect` when it cannot. Messages sent before that are queued.
    ///
    /// - Throws: ``WebSocketError`` `.invalidURL` for anything but a `ws://` or `wss://` URL
    ///   with a host.
    public func connect(to url: String, delegate: any WebSocketDelegate) throws(WebSocketError) -> WebSocketConnection {
        let target = try Self.parse(url)
        let connection = WebSocketConnection(loop: loop, peer: url, delegate: delegate, configuration: configuration)
        connection.connectTarget = target
        loop.needsAttention(connection)
        return connection
    }

    /// Closes every connection with 1001 and joins the service thread.
    public func shutdown() {
        loop.shutdown()
    }

    /// ``shutdown()`` for async callers: waits for the close handshakes without holding a
    /// thread of Swift concurrency's pool.
    public func shutdown() async {
        await loop.shutdown()
    }

    static func parse(_ url: String) throws(WebSocketError) -> WebSocketConnection.ConnectTarget {
        guard let components = URLComponents(string: url), let scheme = components.scheme?.lowercased(),
            scheme == "ws" || scheme == "wss", let host = components.host, !host.isEmpty
        else {
            throw WebSocketError(.invalidURL, "'\(url)' is not a WebSocket URL; expected ws://HOST:PORT")
        }
        let useTLS = scheme == "wss"
        let port = components.port ?? (useTLS ? 443 : 80)
        guard (1...65535).contains(port) else {
            throw WebSocketError(.invalidURL, "'\(url)' has port \(port), which is not between 1 and 65535")
        }
        var path = components.percentEncodedPath
        if path.isEmpty { path = "/" }
        if let query = components.percentEncodedQuery { path += "?" + query }
        return WebSocketConnection.ConnectTarget(host: host, port: port, path: path, useTLS: useTLS)
    }
}
