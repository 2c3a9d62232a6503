/// The server's limits, sent to every client in `welcome` so that it can size its batches.
///
/// JSON form:
///
/// ```json
/// {"maxMessageBytes":1048576,"maxOpsPerWrite":500,"maxListenersPerConnection":100,
///  "maxDocumentBytes":262144}
/// ```
public struct Limits: Sendable, Hashable {
    /// The largest frame the server accepts; a larger one closes the connection with 1009.
    public var maxMessageBytes: Int
    /// The most ops one `write` may carry; more gets `too-large`.
    public var maxOpsPerWrite: Int
    /// The most listeners one connection may hold at once; more gets `too-many-listeners`.
    public var maxListenersPerConnection: Int
    /// The largest document, measured as the JSON of its `fields`; larger gets `too-large`.
    public var maxDocumentBytes: Int

    public init(
        maxMessageBytes: Int = 1 << 20, maxOpsPerWrite: Int = 500, maxListenersPerConnection: Int = 100,
        maxDocumentBytes: Int = 256 << 10
    ) {
        self.maxMessageBytes = maxMessageBytes
        self.maxOpsPerWrite = maxOpsPerWrite
        self.maxListenersPerConnection = maxListenersPerConnection
        self.maxDocumentBytes = maxDocumentBytes
    }

    /// The defaults: 1 MiB messages, 500 ops per write, 100 listeners per connection,
    /// 256 KiB documents.
    public static let `default` = Limits()
}
