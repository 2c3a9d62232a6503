import CLibWebSockets
import Glibc
import Synchronization

/// A plain HTTP request to a ``WebSocketServer``'s port (not an upgrade to WebSocket).
public struct HTTPRequest: Sendable {
    public var method: String
    /// The path, without the query.
    public var path: String
    /// The query's arguments, each `name=value`, percent-decoded by libwebsockets.
    public var arguments: [String]
    /// The `Authorization` header, if any.
    public var authorization: String?
    /// The `Host` header, if any.
    public var host: String?
    /// The `Origin` header, if any: browsers send it with every POST and every cross-origin
    /// request, so a server can tell its own pages from other sites'.
    public var origin: String?
    /// The body of a POST (at most ``WebSocketConfiguration/maxHTTPBodyBytes``).
    public var body: [UInt8]
    /// The peer's address.
    public var peer: String

    /// The value of a query argument (`?collection=notes`); the first when it is repeated.
    public func parameter(_ name: String) -> String? {
        for argument in arguments {
            if argument == name { return "" }
            if argument.hasPrefix(name + "=") { return String(argument.dropFirst(name.utf8.count + 1)) }
        }
        return nil
    }
}

/// The answer to an ``HTTPRequest``.
public struct HTTPResponse: Sendable {
    public var status: Int
    public var contentType: String
    public var body: [UInt8]
    /// Headers besides the content's type and length, like `("Retry-After", "1")`.
    public var headers: [(name: String, value: String)] = []

    public init(status: Int, contentType: String = "application/json", body: [UInt8]) {
        self.status = status
        self.contentType = contentType
        self.body = body
    }

    public init(status: Int, contentType: String = "application/json", text: String) {
        self.init(status: status, contentType: contentType, body: Array(text.utf8))
    }

    /// `{"error":"code","message":"…"}` with a status, as the server's HTTP errors are.
    public static func error(_ status: Int, _ code: String, _ message: String) -> HTTPResponse {
        var escaped = ""
        for scalar in message.unicodeScalars {
            switch scalar {
            case "\"": escaped += "\\\""
            case "\\": escaped += "\\\\"
            case "\n": escaped += "\\n"
            default: escaped.unicodeScalars.append(scalar)
            }
        }
        return HTTPResponse(status: status, text: #"{"error":"\#(code)","message":"\#(escaped)"}"# + "\n")
    }

    public static func notFound(_ path: String) -> HTTPResponse {
        HTTPResponse(status: 404, contentType: "text/plain; charset=utf-8", text: "no such page: \(path)\n")
    }
}

/// Answers HTTP requests. Called on the server's service thread: answer quickly, or hand the
/// work elsewhere and call `respond` from any thread when done.
public typealias HTTPHandler = @Sendable (HTTPRequest, _ respond: @escaping @Sendable (HTTPResponse) -> Void) -> Void

/// Judges a request from its request line and headers alone, before a byte of its body is
/// read: who may do this here, and how large a body this path takes. Called on the server's
/// service thread; decide at once, from what the request says.
public typealias HTTPAdmission = @Sendable (HTTPRequest) -> HTTPVerdict

/// What ``HTTPAdmission`` decided.
public enum HTTPVerdict: Sendable {
    /// Read a body of at most this many bytes (a longer one is refused with 413 unread), then
    /// hand the request to the handler.
    case accept(maxBodyBytes: Int)
    /// Answer this at once; the body is never read into memory, and the connection closes.
    case refuse(HTTPResponse)
}

/// One HTTP request and its answer, from the request's headers to the last byte of the body.
///
/// Created on the service thread; `respond` may come from any thread (it is handed to the
/// loop through its attention list, like a connection's sends); everything else happens on
/// the service thread.
final class HTTPExchange: @unchecked Sendable {
    let id: UInt64
    // Service thread only.
    nonisolated(unsafe) var wsi: OpaquePointer?
    nonisolated(unsafe) var request: HTTPRequest
    nonisolated(unsafe) var headersSent = false
    /// Handed to the handler already (a POST without a body is, before libwebsockets' own
    /// end-of-body callback, which may still come).
    nonisolated(unsafe) var dispatched = false
    nonisolated(unsafe) var sent = 0
    /// Refused from its headers: what arrives of its body is dropped, and the connection
    /// closes after the answer.
    nonisolated(unsafe) var refused = false
    /// Bytes of the loop's body budget held for this request's body (``ServiceLoop``).
    nonisolated(unsafe) var reservedBytes = 0
    /// The body must be in by then, or the request is answered 408.
    nonisolated(unsafe) var bodyDeadline: ContinuousClock.Instant?
    /// The answer is written; the connection closes at the next timer (refused requests).
    nonisolated(unsafe) var closing = false
    private let response = Mutex<HTTPResponse?>(nil)

    private static let nextID = Atomic<UInt64>(1)

    init(wsi: OpaquePointer, request: HTTPRequest) {
        id = Self.nextID.wrappingAdd(1, ordering: .relaxed).oldValue
        self.wsi = wsi
        self.request = request
    }

    /// Keeps the first answer; a later one is ignored (it would not match the headers sent).
    ///
    /// - Returns: False when an answer was set already.
    func setResponse(_ value: HTTPResponse) -> Bool {
        response.withLock { response in
            guard response == nil else { return false }
            response = value
            return true
        }
    }
    var readyResponse: HTTPResponse? { response.withLock { $0 } }

    /// Writes the headers and as much of the body as the socket takes (service thread).
    ///
    /// - Returns: -1 to close, 0 to go on.
    func write() -> Int32 {
        guard let wsi, let response = readyResponse else { return 0 }
        if !headersSent {
            var buffer = [UInt8](repeating: 0, count: OutboundMessage.headroom + 1024)
            let failed = buffer.withUnsafeMutableBufferPointer { pointer -> Bool in
                let start = pointer.baseAddress! + OutboundMessage.headroom
                var position: UnsafeMutablePointer<UInt8>? = start
                let end = pointer.baseAddress! + pointer.count - 1
                let type = response.contentType
                var failed = type.withCString { type in
                    lws_add_http_common_headers(
                        wsi, UInt32(response.status), type, lws_filepos_t(response.body.count), &position, end) != 0
                }
                for (name, value) in response.headers where !failed {
                    // The name with its colon (libwebsockets adds the space), NUL-terminated.
                    let header = Array((name.lowercased() + ":").utf8) + [0]
                    let bytes = Array(value.utf8)
                    failed =
                        header.withUnsafeBufferPointer { header in
                            lws_add_http_header_by_name(
                                wsi, header.baseAddress, bytes, Int32(bytes.count), &position, end)
                        } != 0
                }
                if refused && !failed {
                    failed = lws_add_http_header_by_token(wsi, WSI_TOKEN_CONNECTION, "close", 5, &position, end) != 0
                }
                return failed || lws_finalize_write_http_header(wsi, start, &position, end) != 0
            }
            if failed { return -1 }
            headersSent = true
            if response.body.isEmpty { return finished(wsi) }
        }
        let chunk = min(16 << 10, response.body.count - sent)
        let final = sent + chunk == response.body.count
        var buffer = [UInt8](repeating: 0, count: OutboundMessage.headroom)
        buffer.append(contentsOf: response.body[sent..<(sent + chunk)])
        let written = buffer.withUnsafeMutableBufferPointer { pointer in
            lws_write(
                wsi, pointer.baseAddress! + OutboundMessage.headroom, chunk,
                final ? LWS_WRITE_HTTP_FINAL : LWS_WRITE_HTTP)
        }
        if written < chunk { return -1 }
        sent += chunk
        if final { return finished(wsi) }
        lws_callback_on_writable(wsi)
        return 0
    }

    /// The answer is written. A refused request's connection closes soon: libwebsockets reads
    /// and drops what is left of the body meanwhile (`lws_http_transaction_completed` with
    /// content still to come), so that the peer, which may still be sending, gets the answer
    /// and a FIN rather than a reset; on plain TCP the write side is shut at once, so that the
    /// peer sees the end. The loop's timer closes it (``ServiceLoop``), two seconds on.
    private func finished(_ wsi: OpaquePointer) -> Int32 {
        guard refused else { return lws_http_transaction_completed(wsi) != 0 ? -1 : 0 }
        closing = true
        if lws_http_transaction_completed(wsi) != 0 { return -1 }
        if lws_is_ssl(wsi) == 0 && lws_partial_buffered(wsi) == 0 { shutdown(lws_get_socket_fd(wsi), Int32(SHUT_WR)) }
        lws_set_timer_usecs(wsi, 2_000_000)
        return 0
    }
}
