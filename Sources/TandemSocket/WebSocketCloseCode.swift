/// A WebSocket close status code (RFC 6455 §7.4).
///
/// A struct rather than an enum so that codes from peers we do not know by name
/// (4000–4999 are for applications) still round-trip.
public struct WebSocketCloseCode: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public var rawValue: UInt16

    public init(rawValue: UInt16) { self.rawValue = rawValue }

    /// 1000: the purpose of the connection was fulfilled.
    public static let normal = WebSocketCloseCode(rawValue: 1000)
    /// 1001: the endpoint is going away (server shutdown, client stopping).
    public static let goingAway = WebSocketCloseCode(rawValue: 1001)
    /// 1002: the peer broke the WebSocket protocol.
    public static let protocolError = WebSocketCloseCode(rawValue: 1002)
    /// 1005: the close frame carried no status (never sent, only reported).
    public static let noStatus = WebSocketCloseCode(rawValue: 1005)
    /// 1006: the connection ended without a close frame (never sent, only reported).
    public static let abnormal = WebSocketCloseCode(rawValue: 1006)
    /// 1007: a text message was not valid UTF-8.
    public static let invalidPayload = WebSocketCloseCode(rawValue: 1007)
    /// 1008: the peer broke a policy, such as overflowing its send queue.
    public static let policyViolation = WebSocketCloseCode(rawValue: 1008)
    /// 1009: a message was larger than the receiver accepts.
    public static let messageTooBig = WebSocketCloseCode(rawValue: 1009)
    /// 1011: the endpoint hit an unexpected condition.
    public static let internalError = WebSocketCloseCode(rawValue: 1011)
    /// 1013: try again later (IANA registry): the server cannot serve now, another may.
    public static let tryAgainLater = WebSocketCloseCode(rawValue: 1013)

    public var description: String { String(rawValue) }
}

/// How a connection ended, as reported to ``WebSocketDelegate/webSocket(_:didCloseWith:)``.
public struct WebSocketCloseEvent: Sendable, CustomStringConvertible {
    /// The status code of the close frame, ``WebSocketCloseCode/abnormal`` when there was none.
    public var code: WebSocketCloseCode
    /// The reason text of the close frame, or a description of the local cause.
    public var reason: String
    /// True when the connection never opened (refused, unreachable, handshake rejected).
    public var failedToConnect: Bool

    public init(code: WebSocketCloseCode, reason: String, failedToConnect: Bool = false) {
        self.code = code
        self.reason = reason
        self.failedToConnect = failedToConnect
    }

    public var description: String {
        if failedToConnect { return "could not connect: \(reason)" }
        return reason.isEmpty ? "closed (\(code))" : "closed (\(code)): \(reason)"
    }
}
