/// Limits and timers shared by ``WebSocketServer`` and ``WebSocketClient``.
///
/// For example:
///
/// ```swift
/// var configuration = WebSocketConfiguration()
/// configuration.maxMessageBytes = 4 << 20
/// configuration.pingInterval = 10
/// ```
public struct WebSocketConfiguration: Sendable {
    /// The largest message accepted from a peer, after reassembly of its fragments.
    ///
    /// A peer that sends more is closed with 1009 (message too big), as RFC 6455 §7.4.1 asks.
    /// Default: 1 MiB.
    public var maxMessageBytes: Int = 1 << 20

    /// The most bytes a connection may hold in its send queue before it is closed with 1008.
    ///
    /// A consumer must not make the sender grow without bound: once its queue holds this many
    /// bytes the connection is closed with the reason `"send queue overflow"` and the consumer
    /// is expected to reconnect and resume. Default: 16 MiB.
    public var maxQueuedBytes: Int = 16 << 20

    /// Seconds without traffic from the peer after which a ping is sent. Default: 20.
    ///
    /// Tandem's keepalive sends the ping (`WebSocketConnection.keepAlive`, from the loop's
    /// sweep, to a tenth of a second); any frame from the peer counts as traffic.
    public var pingInterval: UInt16 = 20

    /// Seconds without traffic from the peer after which the connection is dropped. Default: 45.
    ///
    /// This is how a dead peer (a laptop lid closed, a cable pulled) is noticed: TCP alone can
    /// keep such a connection "open" for hours.
    public var idleTimeout: UInt16 = 45

    /// Seconds a backlog may wait for the peer with none of it taken (its TCP stack
    /// acknowledges nothing) before the connection is closed with 1008: the peer stopped
    /// reading. Default: 30.
    ///
    /// A peer that reads, however slowly, is never closed for it: a server's listeners stop
    /// queueing for it and catch up as it drains. The queue's own bound
    /// (``maxQueuedBytes``) stays, for what is sent besides.
    public var stallTimeout: UInt16 = 30

    /// A server's TLS certificate chain and private key (PEM files): with them the server
    /// speaks `wss://` (and `https://` for its HTTP pages) instead of `ws://`. Both or neither.
    public var tlsCertificate: String?
    public var tlsPrivateKey: String?

    /// For clients: the certificate authorities (a PEM file) a `wss://` server's certificate
    /// must chain to. Nil: the system's (`/etc/ssl/certs/ca-certificates.crt` on Debian). The
    /// server's name is checked against its certificate either way.
    public var trustedCertificates: String?

    /// For clients: plain `ws://` connections read and write their frames with Tandem's own
    /// framing (``ClientFraming``) on a raw libwebsockets socket, which copies and masks
    /// payloads in bulk where libwebsockets 4.1's client handles them a byte at a time. False
    /// keeps libwebsockets' own WebSocket client, which `wss://` always uses: libwebsockets
    /// 4.1.6 sends a raw client connection's TLS hello to no socket (docs/BENCHMARKS.md).
    /// Default: true.
    public var ownClientFraming = true

    /// The largest body of a plain HTTP request (a POST to the server's port), when the
    /// server's ``HTTPAdmission`` does not say otherwise. Default: 64 MiB.
    public var maxHTTPBodyBytes: Int = 64 << 20

    /// The most bytes the bodies of all HTTP requests under way may hold together. A request
    /// whose `Content-Length` does not fit beside the others is answered 503 with
    /// `Retry-After: 1`, unread. Default: 128 MiB.
    public var maxHTTPBodyBytesInFlight: Int = 128 << 20

    /// How long an HTTP request's body may take to arrive, from its headers. Later, the
    /// request is answered 408 and the connection closes. Default: 60 s.
    public var httpBodyTimeout: Duration = .seconds(60)

    /// The most connections a server holds at once that have not finished their HTTP request
    /// line and headers (a WebSocket upgrade, or a plain request); more are closed as they are
    /// accepted. Each may take 10 s for its headers (libwebsockets' `timeout_secs_ah_idle`).
    /// Default: 1,024.
    public var maxHandshakes: Int = 1024

    public init() {}
}
