import CLibWebSockets

/// A message ready to be written by libwebsockets.
///
/// `lws_write` needs `LWS_PRE` writable bytes in front of the payload, where it builds the
/// frame header. Building the message with that headroom up front means the service thread
/// writes it without another copy.
///
/// For example:
///
/// ```swift
/// let message = OutboundMessage(text: #"{"type":"hello"}"#)
/// try connection.send(message)
/// ```
public struct OutboundMessage: Sendable {
    /// `LWS_PRE` bytes of headroom, then the payload.
    var storage: [UInt8]
    public let isBinary: Bool

    /// How many bytes a buffer keeps in front of the payload (`LWS_PRE`).
    public static let headroom = tandem_lws_pre()

    /// A text message from UTF-8 bytes.
    public init(text bytes: some Collection<UInt8>) {
        self.init(bytes: bytes, isBinary: false)
    }

    /// A text message.
    public init(text: String) {
        self.init(bytes: text.utf8, isBinary: false)
    }

    /// A binary message.
    public init(binary bytes: some Collection<UInt8>) {
        self.init(bytes: bytes, isBinary: true)
    }

    /// A message whose payload is written by `body` into a buffer that already has headroom.
    ///
    /// Use it to encode straight into the outgoing buffer.
    public init(isBinary: Bool = false, reservingCapacity capacity: Int = 0, _ body: (inout [UInt8]) -> Void) {
        var storage = [UInt8](repeating: 0, count: Self.headroom)
        storage.reserveCapacity(Self.headroom + capacity)
        body(&storage)
        self.storage = storage
        self.isBinary = isBinary
    }

    /// A text message from a buffer whose first ``headroom`` bytes are free for the frame header
    /// and the payload follows: taken as it is, without a copy.
    public init(textAfterHeadroom storage: [UInt8]) {
        precondition(storage.count >= Self.headroom, "the buffer has no headroom")
        self.storage = storage
        self.isBinary = false
    }

    private init(bytes: some Collection<UInt8>, isBinary: Bool) {
        var storage = [UInt8]()
        storage.reserveCapacity(Self.headroom + bytes.count)
        storage.append(contentsOf: repeatElement(0, count: Self.headroom))
        storage.append(contentsOf: bytes)
        self.storage = storage
        self.isBinary = isBinary
    }

    /// The payload size in bytes.
    public var count: Int { storage.count - Self.headroom }

    /// The payload.
    public var payload: ArraySlice<UInt8> { storage[Self.headroom...] }
}
