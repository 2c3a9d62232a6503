/// An error from the WebSocket layer.
///
/// A struct with a ``Code`` you can switch on, so that new kinds of failure do not break
/// existing code.
public struct WebSocketError: Error, Sendable, CustomStringConvertible {
    public struct Code: RawRepresentable, Hashable, Sendable {
        public var rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }

        /// The URL is not a `ws://host:port/path` URL.
        public static let invalidURL = Code(rawValue: "invalid-url")
        /// libwebsockets refused to create its context or listening socket.
        public static let contextCreationFailed = Code(rawValue: "context-creation-failed")
        /// The connection is closed or closing; nothing more can be sent.
        public static let notOpen = Code(rawValue: "not-open")
        /// The send queue was full: the connection has been closed with 1008.
        public static let sendQueueOverflow = Code(rawValue: "send-queue-overflow")
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { message }
}
