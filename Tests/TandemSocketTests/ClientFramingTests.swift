import Foundation
import Synchronization
import TandemHarness
import TandemSocketTesting
import Testing

@testable import TandemSocket

#if canImport(Glibc)
    import Glibc
#endif

@Suite("A plain ws:// client's own framing (RFC 6455)")
struct ClientFramingTests {
    @Test("the accept value of RFC 6455's own example")
    func acceptOfTheRFCExample() {
        #expect(ClientFraming.expectedAccept(for: "dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
        #expect(ClientFraming.base64(Array("any carnal pleas".utf8)) == "YW55IGNhcm5hbCBwbGVhcw==")
        #expect(ClientFraming.base64(Array("any carnal pleasu".utf8)) == "YW55IGNhcm5hbCBwbGVhc3U=")
        #expect(ClientFraming.newKey().utf8.count == 24)
    }

    @Test(
        "a frame of each length class carries its length, a key, and the payload masked with it",
        arguments: [0, 1, 7, 125, 126, 65_535, 65_536, 70_001])
    func frames(length: Int) {
        let payload = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
        var storage = [UInt8](repeating: 0, count: OutboundMessage.headroom) + payload
        let start = ClientFraming.frame(&storage, headroom: OutboundMessage.headroom, opcode: ClientFraming.binary)
        let frame = Array(storage[start...])
        #expect(frame[0] == 0x82)
        #expect(frame[1] & 0x80 == 0x80, "a client's frames are masked")
        var offset = 2
        switch frame[1] & 0x7F {
        case 126:
            #expect(Int(frame[2]) << 8 | Int(frame[3]) == length)
            offset = 4
        case 127:
            #expect(frame[2..<10].reduce(0) { $0 << 8 | Int($1) } == length)
            offset = 10
        default:
            #expect(Int(frame[1] & 0x7F) == length)
        }
        #expect(length < 126 ? offset == 2 : length <= 65_535 ? offset == 4 : offset == 10)
        let key = Array(frame[offset..<offset + 4])
        let unmasked = frame[(offset + 4)...].enumerated().map { $0.element ^ key[$0.offset & 3] }
        #expect(unmasked == payload)
        #expect(frame.count == offset + 4 + length)
    }

    @Test("every frame has a key of its own, across more frames than the random pool holds")
    func freshKeys() {
        // The pool holds 512 words, so 2,000 frames draw past a refill. A fair generator
        // repeats a key among 2,000 in about one run of two thousand, so the check allows a
        // few repeats; a key that stayed the same, or a refill that handed out the same words
        // again, would fail it.
        var keys: Set<[UInt8]> = []
        for _ in 0..<2000 {
            var storage = [UInt8](repeating: 0, count: OutboundMessage.headroom) + [1, 2, 3]
            let start = ClientFraming.frame(&storage, headroom: OutboundMessage.headroom, opcode: ClientFraming.binary)
            keys.insert(Array(storage[(start + 2)..<(start + 6)]))
        }
        #expect(keys.count >= 1995)
    }

    @Test("the server's frames make the same events however the network cuts them")
    func readerAcrossCuts() {
        let stream =
            serverFrame(0x01, fin: false, Array("hel".utf8)) + serverFrame(0x09, Array("ping!".utf8))
            + serverFrame(0x00, Array("lo ✓".utf8)) + serverFrame(0x02, [0, 255, 1])
            + serverFrame(0x01, [UInt8](repeating: 0x61, count: 70_000)) + serverFrame(0x0A, [])
            + serverFrame(0x08, [0x0F, 0xA0] + Array("bye".utf8))
        let whole = events(reading: stream, cut: stream.count)
        #expect(
            whole == [
                "ping:ping!", "text:hello ✓", "binary:3", "text:\(String(repeating: "a", count: 70_000))", "pong",
                "close:4000:bye",
            ])
        for cut in [1, 2, 3, 7, 1000] {
            #expect(events(reading: stream, cut: cut) == whole, "cut every \(cut) bytes")
        }
    }

    @Test(
        "a server frame that breaks the protocol or a limit ends the reading with the close it deserves",
        arguments: [
            (serverFrame(0x01, Array("x".utf8), masked: true), "1002"),
            ([0xC1, 0x01, 0x78], "1002"),
            (serverFrame(0x09, [UInt8](repeating: 0, count: 126)), "1002"),
            (serverFrame(0x09, fin: false, []), "1002"),
            (serverFrame(0x00, Array("x".utf8)), "1002"),
            (serverFrame(0x01, fin: false, Array("x".utf8)) + serverFrame(0x01, Array("y".utf8)), "1002"),
            (serverFrame(0x03, []), "1002"),
            (serverFrame(0x08, [0x03]), "1002"),
            ([0x82, 0x7F, 0x80, 0, 0, 0, 0, 0, 0, 0], "1002"),
            ([0x82, 0x7E, 0x10, 0x01], "1009"),
            (serverFrame(0x01, [0x61, 0xC3, 0x28]), "1007"),
            (serverFrame(0x08, [0x03, 0xED]), "1002"),  // 1005 only reports; no one sends it
            (serverFrame(0x08, [0x03, 0xE7]), "1002"),  // 999
            (serverFrame(0x08, [0x0B, 0xB7]), "1002"),  // 2999, reserved
            (serverFrame(0x08, [0x03, 0xE8, 0xC3, 0x28]), "1007"),  // a reason that is not UTF-8
        ] as [([UInt8], String)])
    func readerFailures(stream: [UInt8], code: String) {
        let reader = ServerFrameReader(maxMessageBytes: 4096)
        var failures: [String] = []
        stream.withUnsafeBytes { bytes in
            reader.consume(bytes) { event in
                if case .failure(let closeCode, _) = event { failures.append("\(closeCode.rawValue)") }
                return true
            }
        }
        #expect(failures == [code])
    }

    @Test(
        "a close with a status an endpoint may send reaches the reader as it came", arguments: [1000, 1013, 3000, 4999])
    func closeCodes(code: Int) {
        let stream = serverFrame(0x08, [UInt8(code >> 8), UInt8(code & 0xFF)] + Array("ok".utf8))
        #expect(events(reading: stream, cut: stream.count) == ["close:\(code):ok"])
    }

    @Test("UTF-8 is checked a word at a time and exactly past the first byte that is not ASCII")
    func utf8() {
        #expect(ServerFrameReader.isValidUTF8(Array("plain ascii, longer than one word".utf8)))
        #expect(ServerFrameReader.isValidUTF8(Array("ünïcødé 🎉 in the middle of ascii text".utf8)))
        #expect(!ServerFrameReader.isValidUTF8(Array("twelve bytes".utf8) + [0xE2, 0x82]))
        #expect(!ServerFrameReader.isValidUTF8([0xED, 0xA0, 0x80]))  // a surrogate
        #expect(!ServerFrameReader.isValidUTF8([0xC0, 0xAF]))  // overlong
        #expect(ServerFrameReader.isValidUTF8([]))
    }

    @Test(
        "on a real socket: the upgrade with frames behind it, a message in pieces, a pong, an echo masked, and the server's close"
    )
    func againstAHandWrittenServer() async throws {
        let server = try HandWrittenServer()
        let seen = Mutex<[String]>([])
        server.run { peer in
            let request = try peer.readHead()
            let lines = request.split(separator: "\r\n")
            seen.withLock { $0.append(String(lines[0])) }
            let key = lines.first { $0.lowercased().hasPrefix("sec-websocket-key:") }!
                .split(separator: ":", maxSplits: 1)[1].trimmingCharacters(in: .whitespaces)
            seen.withLock { $0.append(lines.contains("Sec-WebSocket-Version: 13") ? "version 13" : "no version") }
            // The answer, and in the same write the start of a message cut across writes and
            // frames, with a ping between its fragments.
            let upgradeAnswer =
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                + "Sec-WebSocket-Accept: \(ClientFraming.expectedAccept(for: key))\r\n\r\n"
            let message =
                serverFrame(0x01, fin: false, Array("hello, ".utf8)) + serverFrame(0x09, Array("p1".utf8))
                + serverFrame(0x00, Array("world".utf8))
            try peer.write(Array(upgradeAnswer.utf8) + message[..<5])
            Thread.sleep(forTimeInterval: 0.05)
            try peer.write(Array(message[5...]))
            let pong = try peer.readClientFrame()
            seen.withLock { $0.append("pong \(pong.opcode) \(String(decoding: pong.payload, as: UTF8.self))") }
            let echo = try peer.readClientFrame()
            seen.withLock { $0.append("echo \(echo.opcode) \(String(decoding: echo.payload, as: UTF8.self))") }
            try peer.write(serverFrame(0x08, [0x0F, 0xA0] + Array("bye".utf8)))
            let answer = try peer.readClientFrame()
            seen.withLock { $0.append("close \(Int(answer.payload[0]) << 8 | Int(answer.payload[1]))") }
        }
        let client = try WebSocketClient()
        defer { client.shutdownWithoutWaiting() }
        let events = Recorder(echo: true)
        _ = try client.connect(to: "ws://127.0.0.1:\(server.port)/path?x=1", delegate: events)
        try await waitUntil("the server's close arrives") { !events.closes.isEmpty }
        #expect(events.texts == ["hello, world"])
        #expect(events.closes.map { "\($0.code) \($0.reason)" } == ["4000 bye"])
        try await waitUntil("the server read the client's answer to its close") {
            seen.withLock { $0.count } == 5 || !server.failures.isEmpty
        }
        #expect(server.failures.isEmpty)
        #expect(
            seen.withLock { $0 } == [
                "GET /path?x=1 HTTP/1.1", "version 13", "pong 10 p1", "echo 1 hello, world", "close 4000",
            ])
    }

    @Test("an upgrade answered with the wrong accept value, or refused, does not open", arguments: [true, false])
    func wrongAccept(refuse: Bool) async throws {
        let server = try HandWrittenServer()
        server.run { peer in
            _ = try peer.readHead()
            try peer.write(
                refuse
                    ? "HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n"
                    : "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                        + "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n")
            Thread.sleep(forTimeInterval: 1)
        }
        let client = try WebSocketClient()
        defer { client.shutdownWithoutWaiting() }
        let events = Recorder()
        _ = try client.connect(to: "ws://127.0.0.1:\(server.port)/", delegate: events)
        try await waitUntil("the connection fails") { !events.closes.isEmpty }
        #expect(events.opened == 0)
        let close = try #require(events.closes.first)
        #expect(close.failedToConnect)
        #expect(close.reason.contains(refuse ? "refused the WebSocket upgrade: HTTP 403" : "Sec-WebSocket-Accept"))
        #expect(server.failures.isEmpty)
    }
}

/// A server frame: unmasked unless asked.
private func serverFrame(_ opcode: UInt8, fin: Bool = true, _ payload: [UInt8], masked: Bool = false) -> [UInt8] {
    var frame: [UInt8] = [(fin ? 0x80 : 0) | opcode]
    let maskBit: UInt8 = masked ? 0x80 : 0
    if payload.count < 126 {
        frame.append(maskBit | UInt8(payload.count))
    } else if payload.count <= 0xFFFF {
        frame += [maskBit | 126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
    } else {
        frame.append(maskBit | 127)
        for shift in stride(from: 56, through: 0, by: -8) { frame.append(UInt8((payload.count >> shift) & 0xFF)) }
    }
    if masked { frame += [0, 0, 0, 0] }
    return frame + payload
}

/// What a reader makes of `stream` fed `cut` bytes at a time, as short strings.
private func events(reading stream: [UInt8], cut: Int) -> [String] {
    let reader = ServerFrameReader(maxMessageBytes: 1 << 20)
    var out: [String] = []
    var start = 0
    while start < stream.count {
        let end = min(start + cut, stream.count)
        stream[start..<end].withUnsafeBytes { bytes in
            reader.consume(bytes) { event in
                switch event {
                case .message(let message):
                    out.append(message.kind == .text ? "text:\(message.text)" : "binary:\(message.bytes.count)")
                case .ping(let payload): out.append("ping:\(String(decoding: payload, as: UTF8.self))")
                case .pong: out.append("pong")
                case .close(let code, let reason): out.append("close:\(code ?? 0):\(reason)")
                case .failure(let code, let reason): out.append("failure:\(code):\(reason)")
                }
                return true
            }
        }
        start = end
    }
    return out
}

/// A TCP server on loopback that serves one connection with a script, on a thread of its own
/// (blocking reads and writes): a peer that speaks exactly the bytes a test gives it.
private final class HandWrittenServer: @unchecked Sendable {
    let port: Int
    private let listener: Int32
    private let failed = Mutex<[String]>([])
    /// What went wrong in the script (recorded here: an expectation on its thread would not
    /// belong to the test).
    var failures: [String] { failed.withLock { $0 } }

    init() throws {
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
                bind(listener, pointer, length) == 0 && listen(listener, 4) == 0
                    && getsockname(listener, pointer, &length) == 0
            }
        }
        guard bound else {
            close(listener)
            throw Peer.Failure(description: "cannot listen on loopback: errno \(errno)")
        }
        self.listener = listener
        port = Int(UInt16(bigEndian: address.sin_port))
    }

    deinit { close(listener) }

    func run(_ script: @escaping @Sendable (Peer) throws -> Void) {
        Thread.detachNewThread { [self] in
            let fd = accept(listener, nil, nil)
            guard fd >= 0 else { return }
            let peer = Peer(fd: fd)
            do { try script(peer) } catch { failed.withLock { $0.append("\(error)") } }
            close(fd)
        }
    }

    final class Peer {
        struct Failure: Error, CustomStringConvertible { var description: String }
        let fd: Int32
        private var buffer: [UInt8] = []

        init(fd: Int32) {
            self.fd = fd
            var timeout = timeval(tv_sec: 20, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        }

        func write(_ text: String) throws { try write(Array(text.utf8)) }

        func write(_ bytes: [UInt8]) throws {
            var sent = 0
            while sent < bytes.count {
                let count = bytes[sent...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                guard count > 0 else { throw Failure(description: "send failed: errno \(errno)") }
                sent += count
            }
        }

        private func fill(_ count: Int) throws {
            var chunk = [UInt8](repeating: 0, count: 4096)
            while buffer.count < count {
                let got = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                guard got > 0 else { throw Failure(description: "the client closed, or 20 s passed (errno \(errno))") }
                buffer += chunk[..<got]
            }
        }

        private func take(_ count: Int) throws -> [UInt8] {
            try fill(count)
            defer { buffer.removeFirst(count) }
            return Array(buffer[..<count])
        }

        /// The HTTP head, without its blank line.
        func readHead() throws -> String {
            while true {
                if let end = String(decoding: buffer, as: UTF8.self).range(of: "\r\n\r\n") {
                    let head = String(String(decoding: buffer, as: UTF8.self)[..<end.lowerBound])
                    buffer.removeFirst(head.utf8.count + 4)
                    return head
                }
                try fill(buffer.count + 1)
            }
        }

        /// One client frame, which must be masked; its payload unmasked.
        func readClientFrame() throws -> (opcode: UInt8, payload: [UInt8]) {
            let head = try take(2)
            guard head[1] & 0x80 != 0 else { throw Failure(description: "the client sent an unmasked frame") }
            var length = Int(head[1] & 0x7F)
            if length == 126 {
                length = try take(2).reduce(0) { $0 << 8 | Int($1) }
            } else if length == 127 {
                length = try take(8).reduce(0) { $0 << 8 | Int($1) }
            }
            let key = try take(4)
            let payload = try take(length).enumerated().map { $0.element ^ key[$0.offset & 3] }
            return (head[0] & 0x0F, payload)
        }
    }
}
