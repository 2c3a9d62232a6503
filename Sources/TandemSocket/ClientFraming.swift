import CLibWebSockets
import Foundation
import TandemWire

/// RFC 6455 on the client side, written here instead of libwebsockets' for plain `ws://`
/// connections (unless ``WebSocketConfiguration/ownClientFraming`` is false): the upgrade request and the check of its answer, the frames a client sends
/// (masked), and the frames a server sends.
///
/// Why: libwebsockets 4.1 parses what a client receives one byte at a time (a state machine
/// step per byte of payload) and masks what it sends one byte at a time. That was 6 % and 1.2 %
/// of all CPU in `bench throughput`, and a quarter of the machine's CPU while `bench snapshot`
/// downloaded. Here the payload is copied and masked in bulk. libwebsockets still owns the
/// socket, the event loop and its timers: the connection is a raw one (`"RAW"` method), and
/// these types turn its bytes into messages. `wss://` stays on libwebsockets' own client.
///
/// The package's one client framer: the raw-socket test client (`RawWebSocket`) and the
/// bench's listener swarm frame and read with it too.
package enum ClientFraming {
    /// Opcodes (RFC 6455 §5.2).
    package static let text: UInt8 = 1
    package static let binary: UInt8 = 2
    package static let close: UInt8 = 8
    package static let ping: UInt8 = 9
    package static let pong: UInt8 = 10

    /// The GUID of RFC 6455 §1.3, appended to the key for `Sec-WebSocket-Accept`.
    static let acceptGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    /// A new `Sec-WebSocket-Key`: 16 random bytes in base 64.
    package static func newKey() -> String {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<16).map { _ in UInt8.random(in: 0...255, using: &generator) }
        return base64(bytes)
    }

    /// The upgrade request, as libwebsockets' client sent it (Host and Origin alike, unless
    /// `sendsOrigin` is false: Chromium's DevTools refuses a connection that names one).
    package static func upgradeRequest(path: String, host: String, key: String, sendsOrigin: Bool = true) -> [UInt8] {
        Array(
            ("GET \(path) HTTP/1.1\r\nHost: \(host)\r\n\(sendsOrigin ? "Origin: \(host)\r\n" : "")Upgrade: websocket\r\n"
                + "Connection: Upgrade\r\nSec-WebSocket-Key: \(key)\r\nSec-WebSocket-Version: 13\r\n\r\n").utf8)
    }

    /// The `Sec-WebSocket-Accept` a server must answer `key` with.
    static func expectedAccept(for key: String) -> String {
        base64(sha1(Array((key + acceptGUID).utf8)))
    }

    /// Checks the head of the server's answer to the upgrade (up to and without the blank
    /// line): nil when it accepted, else what was wrong.
    package static func problem(withAnswer head: String, key: String) -> String? {
        let lines = head.split(separator: "\r\n", omittingEmptySubsequences: false)
        guard let status = lines.first else { return "the server's answer to the upgrade was empty" }
        let parts = status.split(separator: " ", maxSplits: 2)
        guard parts.count >= 2, parts[0].hasPrefix("HTTP/1.") else {
            return "the server's answer to the upgrade is not HTTP: '\(status.prefix(80))'"
        }
        guard parts[1] == "101" else {
            return "the server refused the WebSocket upgrade: HTTP \(parts[1...].joined(separator: " ").prefix(80))"
        }
        var headers: [String: String] = [:]
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            let name = line[..<colon].trimmingSpaces.lowercased()
            headers[name] = String(line[line.index(after: colon)...].trimmingSpaces)
        }
        guard headers["upgrade"]?.lowercased() == "websocket" else {
            return "the server's answer to the upgrade has no 'Upgrade: websocket'"
        }
        guard
            headers["connection"]?.lowercased().split(separator: ",").contains(where: { $0.trimmingSpaces == "upgrade" }
            )
                == true
        else {
            return "the server's answer to the upgrade has no 'Connection: Upgrade'"
        }
        guard headers["sec-websocket-accept"] == expectedAccept(for: key) else {
            return "the server's Sec-WebSocket-Accept does not match the key sent"
        }
        if let extensions = headers["sec-websocket-extensions"], !extensions.isEmpty {
            return "the server answered with extensions this client did not ask for: \(extensions.prefix(80))"
        }
        if let subprotocol = headers["sec-websocket-protocol"], !subprotocol.isEmpty {
            return "the server answered with a subprotocol this client did not ask for: \(subprotocol.prefix(80))"
        }
        return nil
    }

    // MARK: - Sending

    /// The most a client frame's header takes: 2 bytes, an 8-byte length, a 4-byte key.
    package static let maxHeaderBytes = 14

    /// One masked client frame of `payload`, in a new array.
    ///
    /// - Parameters:
    ///   - fin: False for a fragment that more follow.
    ///   - maskKey: The key as it lies in memory; nil for a fresh random one, as RFC 6455
    ///     §5.3 asks (tests and fuzzers give one, to write the same bytes every time).
    package static func frame(opcode: UInt8, payload: [UInt8], fin: Bool = true, maskKey: UInt32? = nil) -> [UInt8] {
        var storage = [UInt8](repeating: 0, count: maxHeaderBytes)
        storage.reserveCapacity(maxHeaderBytes + payload.count)
        storage += payload
        let start = frame(&storage, headroom: maxHeaderBytes, opcode: opcode, fin: fin, maskKey: maskKey)
        return Array(storage[start...])
    }

    /// Makes `storage[headroom...]` (the payload) a whole masked client frame: the header goes
    /// into the headroom, the payload is masked in place. Returns where the frame starts.
    static func frame(
        _ storage: inout [UInt8], headroom: Int, opcode: UInt8, fin: Bool = true, maskKey: UInt32? = nil
    ) -> Int {
        let count = storage.count - headroom
        var header: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) =
            (0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        var headerCount = 0
        withUnsafeMutableBytes(of: &header) { bytes in
            bytes[0] = (fin ? 0x80 : 0) | opcode
            if count < 126 {
                bytes[1] = 0x80 | UInt8(count)
                headerCount = 2
            } else if count <= 0xFFFF {
                bytes[1] = 0x80 | 126
                bytes[2] = UInt8(count >> 8)
                bytes[3] = UInt8(count & 0xFF)
                headerCount = 4
            } else {
                bytes[1] = 0x80 | 127
                for index in 0..<8 { bytes[2 + index] = UInt8((UInt64(count) >> (56 - 8 * UInt64(index))) & 0xFF) }
                headerCount = 10
            }
        }
        // The key of RFC 6455 §5.3: fresh and unpredictable for every frame. It comes from the
        // system's cryptographic generator through the pool, not one system call per frame.
        var generator = RandomPool()
        let key = maskKey ?? UInt32.random(in: 0...UInt32.max, using: &generator)
        let start = headroom - headerCount - 4
        precondition(start >= 0, "the buffer's headroom is too small for a frame header")
        storage.withUnsafeMutableBytes { buffer in
            withUnsafeBytes(of: header) { bytes in
                buffer.baseAddress!.advanced(by: start).copyMemory(from: bytes.baseAddress!, byteCount: headerCount)
            }
            withUnsafeBytes(of: key) { bytes in
                buffer.baseAddress!.advanced(by: headroom - 4).copyMemory(from: bytes.baseAddress!, byteCount: 4)
            }
            mask(UnsafeMutableRawBufferPointer(rebasing: buffer[headroom...]), with: key)
        }
        return start
    }

    /// XORs `bytes` with the 4-byte `key` as it lies in memory, eight bytes at a time.
    static func mask(_ bytes: UnsafeMutableRawBufferPointer, with key: UInt32) {
        let wide = UInt64(key) | UInt64(key) << 32
        var index = 0
        let count = bytes.count
        while index + 8 <= count {
            let word = bytes.loadUnaligned(fromByteOffset: index, as: UInt64.self)
            bytes.storeBytes(of: word ^ wide, toByteOffset: index, as: UInt64.self)
            index += 8
        }
        withUnsafeBytes(of: key) { keyBytes in
            while index < count {
                bytes[index] ^= keyBytes[index & 3]
                index += 1
            }
        }
    }

    // MARK: - Reading a header

    /// A frame's header, as the bytes at the start of a buffer give it, unchecked: for readers
    /// of frames that look at them as they come (tests of bad input, the bench). What a server
    /// sends is read and checked by ``ServerFrameReader``.
    package struct FrameHeader: Sendable, Equatable {
        package var fin: Bool
        package var opcode: UInt8
        package var masked: Bool
        /// The header's bytes, the mask key included.
        package var headerLength: Int
        package var payloadLength: Int

        /// The header at the start of `bytes`; nil until it is all there.
        package static func parse(_ bytes: some Collection<UInt8>) -> FrameHeader? {
            guard bytes.count >= 2 else { return nil }
            let first = bytes[bytes.startIndex], second = bytes[bytes.index(after: bytes.startIndex)]
            let masked = second & 0x80 != 0
            var length = Int(second & 0x7F)
            var headerLength = 2
            if length >= 126 {
                let extra = length == 126 ? 2 : 8
                guard bytes.count >= 2 + extra else { return nil }
                length = bytes.dropFirst(2).prefix(extra).reduce(0) { $0 << 8 | Int($1) }
                headerLength += extra
            }
            if masked { headerLength += 4 }
            guard bytes.count >= headerLength else { return nil }
            return FrameHeader(
                fin: first & 0x80 != 0, opcode: first & 0x0F, masked: masked, headerLength: headerLength,
                payloadLength: length)
        }
    }

    // MARK: - Base 64 (Foundation's) and SHA-1 (libwebsockets')

    static func base64(_ bytes: [UInt8]) -> String {
        Data(bytes).base64EncodedString()
    }

    /// SHA-1, which the handshake's accept value needs and nothing else: libwebsockets' own
    /// (`lws_SHA1`, over its TLS library's where it has one).
    static func sha1(_ message: [UInt8]) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: 20)
        _ = message.withUnsafeBufferPointer { bytes in
            digest.withUnsafeMutableBufferPointer { lws_SHA1(bytes.baseAddress, bytes.count, $0.baseAddress) }
        }
        return digest
    }
}

extension Substring {
    fileprivate var trimmingSpaces: Substring {
        var result = self
        while result.first == " " || result.first == "\t" { result.removeFirst() }
        while result.last == " " || result.last == "\t" { result.removeLast() }
        return result
    }
}

/// The frames a server sends, turned into messages: fed the connection's bytes as they come,
/// it copies each payload in bulk and reports whole messages, control frames and what broke
/// the protocol.
final class ServerFrameReader {
    enum Event {
        case message(WebSocketMessage)
        case ping([UInt8])
        case pong
        /// The server's close frame: its status (nil when the body was empty) and reason.
        case close(code: UInt16?, reason: String)
        /// The server broke RFC 6455, or sent more than allowed: close with this.
        case failure(WebSocketCloseCode, String)
    }

    let maxMessageBytes: Int

    /// The header being read (up to 10 bytes: servers do not mask).
    private var header: [UInt8] = []
    /// The frame whose payload is being read: its opcode, whether it ends its message, and how
    /// many payload bytes are still to come.
    private var opcode: UInt8 = 0
    private var final = false
    private var remaining = 0
    private var inPayload = false
    /// The message being assembled from data frames, and its kind, while one is under way.
    private var message: [UInt8] = []
    private var messageKind: WebSocketMessage.Kind?
    /// A control frame's payload (at most 125 bytes).
    private var control: [UInt8] = []

    init(maxMessageBytes: Int) { self.maxMessageBytes = maxMessageBytes }

    /// Reads `bytes`, reporting each event to `emit`, which returns false to stop reading (the
    /// connection is closing).
    func consume(_ bytes: UnsafeRawBufferPointer, _ emit: (Event) -> Bool) {
        var index = 0
        while index < bytes.count {
            if !inPayload {
                header.append(bytes[index])
                index += 1
                guard let needed = Self.headerLength(header), header.count == needed else { continue }
                if let failure = startFrame() {
                    _ = emit(failure)
                    return
                }
                header.removeAll(keepingCapacity: true)
                inPayload = true
                if remaining > 0 { continue }
            } else {
                let take = min(remaining, bytes.count - index)
                let chunk = UnsafeRawBufferPointer(rebasing: bytes[index..<index + take])
                if opcode >= 8 { control.append(contentsOf: chunk) } else { message.append(contentsOf: chunk) }
                remaining -= take
                index += take
                guard remaining == 0 else { continue }
            }
            inPayload = false
            guard let event = endFrame() else { continue }
            if !emit(event) { return }
        }
    }

    /// The length of a header that starts with `bytes`, once it can be told.
    private static func headerLength(_ bytes: [UInt8]) -> Int? {
        guard bytes.count >= 2 else { return nil }
        let masked = bytes[1] & 0x80 != 0
        switch bytes[1] & 0x7F {
        case 126: return 4 + (masked ? 4 : 0)
        case 127: return 10 + (masked ? 4 : 0)
        default: return 2 + (masked ? 4 : 0)
        }
    }

    /// Takes the header just read: nil, or the failure it is.
    private func startFrame() -> Event? {
        let first = header[0]
        let length7 = header[1] & 0x7F
        guard header[1] & 0x80 == 0 else {
            return .failure(.protocolError, "protocol error: the server masked a frame (RFC 6455 §5.1)")
        }
        guard first & 0x70 == 0 else {
            return .failure(.protocolError, "protocol error: a frame set reserved bits without an extension")
        }
        opcode = first & 0x0F
        final = first & 0x80 != 0
        var length = 0
        switch length7 {
        case 126: length = Int(header[2]) << 8 | Int(header[3])
        case 127:
            guard header[2] & 0x80 == 0 else {
                return .failure(.protocolError, "protocol error: a frame's length has its top bit set")
            }
            var value: UInt64 = 0
            for byte in header[2..<10] { value = value << 8 | UInt64(byte) }
            guard value <= UInt64(Int.max / 2) else {
                return .failure(.messageTooBig, "message larger than \(maxMessageBytes) bytes")
            }
            length = Int(value)
        default: length = Int(length7)
        }
        remaining = length
        switch opcode {
        case 8, 9, 10:
            guard final, length <= 125 else {
                return .failure(.protocolError, "protocol error: a control frame was fragmented or over 125 bytes")
            }
            control.removeAll(keepingCapacity: true)
        case 0:
            guard messageKind != nil else {
                return .failure(.protocolError, "protocol error: a continuation frame with no message under way")
            }
        case 1, 2:
            guard messageKind == nil else {
                return .failure(.protocolError, "protocol error: a new message began inside a fragmented one")
            }
            messageKind = opcode == 1 ? .text : .binary
        default:
            return .failure(.protocolError, "protocol error: unknown opcode \(opcode)")
        }
        if opcode < 8 {
            guard message.count + length <= maxMessageBytes else {
                return .failure(.messageTooBig, "message larger than \(maxMessageBytes) bytes")
            }
            // Room for the rest of the frame at once, as the libwebsockets path does.
            if message.count + length > message.capacity {
                message.reserveCapacity(max(message.count + length, message.capacity * 2))
            }
        }
        return nil
    }

    /// The frame's payload is in: what it makes, if anything.
    private func endFrame() -> Event? {
        switch opcode {
        case 8:
            if control.count == 1 {
                return .failure(
                    .protocolError, "protocol error: a close frame's body is a 2-byte status and a reason, not 1 byte")
            }
            guard control.count >= 2 else { return .close(code: nil, reason: "") }
            let code = UInt16(control[0]) << 8 | UInt16(control[1])
            guard Self.mayBeSent(code) else {
                return .failure(
                    .protocolError, "protocol error: the server closed with status \(code), which no endpoint may send")
            }
            let reason = Array(control[2...])
            guard Self.isValidUTF8(reason) else {
                return .failure(.invalidPayload, "the server's close reason was not valid UTF-8")
            }
            return .close(code: code, reason: String(decoding: reason, as: UTF8.self))
        case 9: return .ping(control)
        case 10: return .pong
        default:
            guard final, let kind = messageKind else { return nil }
            messageKind = nil
            if kind == .text && !Self.isValidUTF8(message) {
                return .failure(.invalidPayload, "a text message was not valid UTF-8")
            }
            // The bytes go to the message as they are; the next message reserves its own room
            // when its first frame announces its length.
            let whole = message
            message = []
            return .message(WebSocketMessage(kind: kind, bytes: whole))
        }
    }

    /// Whether a close frame may carry `code` (RFC 6455 §7.4 and IANA's registry): 1000–1003,
    /// 1007–1014, and 3000–4999 for libraries and applications. 1005 and 1006 only report what
    /// happened; the rest of 1000–2999 is reserved.
    static func mayBeSent(_ code: UInt16) -> Bool {
        switch code {
        case 1000...1003, 1007...1014, 3000...4999: true
        default: false
        }
    }

    /// Whether `bytes` are UTF-8: eight ASCII bytes at a time, the standard library's decoder
    /// from the first byte that is not.
    static func isValidUTF8(_ bytes: [UInt8]) -> Bool {
        bytes.withUnsafeBytes { buffer in
            var index = 0
            while index + 8 <= buffer.count {
                if buffer.loadUnaligned(fromByteOffset: index, as: UInt64.self) & 0x8080_8080_8080_8080 != 0 { break }
                index += 8
            }
            while index < buffer.count && buffer[index] < 0x80 { index += 1 }
            guard index < buffer.count else { return true }
            var iterator = UnsafeRawBufferPointer(rebasing: buffer[index...]).makeIterator()
            var decoder = Unicode.UTF8()
            while true {
                switch decoder.decode(&iterator) {
                case .scalarValue: continue
                case .emptyInput: return true
                case .error: return false
                }
            }
        }
    }
}
