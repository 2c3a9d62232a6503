/// What a ``WebSocketConnection`` tells its owner.
///
/// Every method is called on the service thread of the connection's event loop, one call at a
/// time and in order for a given connection. Return quickly: while a method runs, no other
/// connection of the same loop is served. Hand real work to your own queue.
public protocol WebSocketDelegate: AnyObject, Sendable {
    /// The handshake completed; the connection can send and receive.
    func webSocketDidOpen(_ connection: WebSocketConnection)

    /// A whole message arrived (fragments already reassembled, size already checked).
    func webSocket(_ connection: WebSocketConnection, didReceive message: WebSocketMessage)

    /// The send queue fell to the threshold given to
    /// ``WebSocketConnection/notifyWhenDrained(below:)``.
    func webSocketDidDrain(_ connection: WebSocketConnection)

    /// The connection ended, or never opened. Called exactly once per connection.
    func webSocket(_ connection: WebSocketConnection, didCloseWith event: WebSocketCloseEvent)
}

extension WebSocketDelegate {
    public func webSocketDidDrain(_ connection: WebSocketConnection) {}
}

/// A complete message received from a peer.
public struct WebSocketMessage: Sendable {
    public enum Kind: Sendable { case text, binary }

    public var kind: Kind
    /// The payload. Text messages have been checked to be UTF-8.
    public var bytes: [UInt8]

    public init(kind: Kind, bytes: [UInt8]) {
        self.kind = kind
        self.bytes = bytes
    }

    /// The payload as a string (text messages are valid UTF-8).
    public var text: String { String(decoding: bytes, as: UTF8.self) }
}
