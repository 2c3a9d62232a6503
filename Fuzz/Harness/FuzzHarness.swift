import Foundation
import TandemClient
import TandemServer
import TandemTesting
import TandemWire

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Where a fuzz input goes. The input's first byte picks the surface (modulo the number of
/// surfaces); the rest is what that surface gets.
public enum FuzzSurface: UInt8, CaseIterable, Sendable {
    /// One text message to a real server, on a connection that said `hello` (or, by the
    /// second byte, on a fresh one that did not), to the open or the access-controlled server;
    /// on the latter as alice, or (by the second byte) as carol, who may read none of the
    /// seeded documents and must never hear their content (the leak oracle).
    case message
    /// Frames built from the input (header byte, length byte, payload), masked and written
    /// to a real server's socket: fragments, control frames, reserved bits and opcodes.
    case frames
    /// The wire decoders alone: client and server messages, JSON, field times. Whatever
    /// decodes must encode to bytes that decode to the same value.
    case decode
    /// The access files: a token file and a rules file, split at the first zero byte.
    case accessFiles
    /// Raw bytes on a fresh TCP connection, before any WebSocket upgrade.
    case handshake
}

/// What the harness found: the server crashed (the process dies, libFuzzer reports it), or
/// one of these.
public struct FuzzFinding: Error, CustomStringConvertible {
    public var description: String
}

/// Runs fuzz inputs against an in-process companion server on real sockets: an open one and
/// one with token and rules files, each with its data in a temporary folder.
///
/// After each input sent to a server, the harness sends a probe (`get` with a request id) and
/// reads until its answer, so every input is handled before the next one starts and a server
/// that stops answering is a finding. Every text frame the server sends must decode as a
/// ``ServerMessage``.
///
/// Not thread-safe: one thread runs the inputs. It blocks that thread on socket reads, so it
/// must not run on the Swift concurrency pool.
public final class FuzzHarness {
    private let folder: TemporaryDirectory
    private let open: TandemServer
    private let guarded: TandemServer
    private var sessions: [Peer: RawWebSocket] = [:]
    private var probes = 0
    /// Close codes the servers sent, by code, for the statistics.
    public private(set) var closeCodes: [UInt16: Int] = [:]
    public private(set) var inputs = 0

    /// How long the server may take to answer a probe before that counts as a hang.
    public var answerTimeout: Duration = .seconds(10)

    /// Who a connection speaks for: anyone on the open server; alice (who owns account A1) or
    /// carol on the guarded one. dave, who owns the secret documents, never fuzzes: whatever
    /// alice's inputs change, carol may read none of dave's documents.
    enum Peer: Hashable {
        case open, alice, carol, dave

        var isGuarded: Bool { self != .open }
        var token: String? {
            switch self {
            case .open: nil
            case .alice: "t-alice"
            case .carol: "t-carol"
            case .dave: "t-dave"
            }
        }
    }

    /// Marks the content of dave's documents: no frame sent to carol may hold it.
    static let secret = "SECRET-7c1e"
    /// The client id every fuzz connection uses, carol's included: an idempotency key of alice's
    /// resent by carol must not bring back alice's answer.
    static let clientId = "fuzz"

    public init() throws {
        let folder = try TemporaryDirectory(prefix: "tandem-fuzz")
        self.folder = folder
        func configuration(_ name: String) throws -> ServerConfiguration {
            let directory = folder.url.appendingPathComponent(name)
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            var configuration = ServerConfiguration(dataDirectory: directory)
            configuration.port = 0
            configuration.logger.logLevel = .critical
            return configuration
        }
        open = try TandemServer(configuration: configuration("open"))
        var guardedConfiguration = try configuration("guarded")
        let tokens = #"{"tokens": {"t-alice": "alice", "t-bob": "bob", "t-carol": "carol", "t-dave": "dave"}}"#
        guardedConfiguration.access = try AccessControl(
            tokens: (tokens, "tokens.json"), rules: (SampleAccess.rules, "rules.json"))
        guarded = try TandemServer(configuration: guardedConfiguration)
        // An account for the rules to read (alice owns A1 and bob is a member); dave's account D1
        // with a transaction, and a note of dave's, both secret to carol; and a field-level
        // merge of the note, whose answer holds the document, under a key (seed-3) that carol,
        // with the same client id, may resend.
        let secret = Self.secret
        guard
            case .ack? = try exchange(
                #"{"type":"write","request":"seed","ops":[{"op":"create","collection":"accounts","id":"A1","#
                    + #""fields":{"owner":"alice","members":["bob"]},"idempotencyKey":"seed-1"}]}"#, as: .alice)
        else { throw FuzzFinding(description: "the guarded server did not store the account A1") }
        let seeded = try exchange(
            #"{"type":"write","request":"seed","ops":["#
                + #"{"op":"create","collection":"accounts","id":"D1","fields":{"owner":"dave","members":[]},"idempotencyKey":"seed-0"},"#
                + #"{"op":"create","collection":"accounts/D1/transactions","id":"T1","fields":{"memo":"\#(secret)"},"idempotencyKey":"seed-2"},"#
                + #"{"op":"create","collection":"users/dave/notes","id":"N1","fields":{"text":"\#(secret)"},"fieldTimes":{"text":1},"idempotencyKey":"seed-4"},"#
                + #"{"op":"update","collection":"users/dave/notes","id":"N1","fields":{"text":"\#(secret)!"},"fieldTimes":{"text":2},"idempotencyKey":"seed-3"}]}"#,
            as: .dave)
        sessions[.dave] = nil
        guard case .ack? = seeded else {
            throw FuzzFinding(
                description: "the guarded server did not store the seeded documents: \(String(describing: seeded))")
        }
    }

    /// Stops both servers and removes their data.
    public func shutdown() {
        sessions = [:]
        open.shutdown()
        guarded.shutdown()
    }

    /// Runs one input.
    ///
    /// - Throws: ``FuzzFinding`` when a server hangs, stops accepting connections, or sends
    ///   something that is not a protocol message, or when a decoded message does not survive
    ///   encoding.
    public func run(_ input: [UInt8]) throws {
        inputs += 1
        guard let first = input.first else { return }
        let surface = FuzzSurface.allCases[Int(first) % FuzzSurface.allCases.count]
        let options = input.count > 1 ? input[1] : 0
        let body = Array(input.dropFirst(2))
        let peer: Peer = options & 1 == 0 ? .open : options & 4 == 0 ? .alice : .carol
        switch surface {
        case .message:
            let connection = options & 2 != 0 ? try connect(peer, hello: false) : try session(peer)
            try connection.sendFrame(opcode: .text, payload: body)
            try probe(connection, peer)
        case .frames:
            let connection = try session(peer)
            try connection.sendRaw(Self.frames(from: body))
            try probe(connection, peer)
        case .decode:
            try Self.checkDecoders(Array(input.dropFirst(1)))
        case .accessFiles:
            let text = Array(input.dropFirst(1))
            let split = text.firstIndex(of: 0) ?? text.endIndex
            let tokens = String(decoding: text[..<split], as: UTF8.self)
            let rules = String(decoding: text[min(split + 1, text.endIndex)...], as: UTF8.self)
            _ = try? AccessControl(tokens: (tokens, "tokens.json"), rules: (rules, "rules.json"))
        case .handshake:
            try PlainTCP.sendBeforeUpgrade(body, port: (peer.isGuarded ? guarded : open).port)
            try probe(try session(peer), peer)
        }
    }

    // MARK: - Sessions

    private func session(_ peer: Peer) throws -> RawWebSocket {
        if let session = sessions[peer] { return session }
        let session = try connect(peer, hello: true)
        sessions[peer] = session
        return session
    }

    private func connect(_ peer: Peer, hello: Bool) throws -> RawWebSocket {
        let port = (peer.isGuarded ? guarded : open).port
        let connection: RawWebSocket
        do {
            connection = try RawWebSocket(port: port, resetOnClose: true)
        } catch {
            throw FuzzFinding(
                description: "the \(peer.isGuarded ? "guarded" : "open") server refused a connection: \(error)")
        }
        if hello {
            let token = peer.token.map { #","token":"\#($0)""# } ?? ""
            try connection.sendFrame(
                opcode: .text,
                payload: Array(#"{"type":"hello","protocol":1,"clientId":"\#(Self.clientId)"\#(token)}"#.utf8))
            let answer = try readMessage(connection, peer, until: { _ in true }, what: "the welcome")
            guard case .welcome? = answer else {
                throw FuzzFinding(description: "hello was not welcomed: \(String(describing: answer))")
            }
        }
        return connection
    }

    private func exchange(_ text: String, as peer: Peer) throws -> ServerMessage? {
        let connection = try session(peer)
        try connection.sendFrame(opcode: .text, payload: Array(text.utf8))
        return try readMessage(connection, peer, until: { _ in true }, what: "the answer to \(text.prefix(60))")
    }

    /// Sends a `get` with a fresh request id and reads until its answer or the close.
    private func probe(_ connection: RawWebSocket, _ peer: Peer) throws {
        probes += 1
        let request = "probe-\(probes)"
        // A send can fail when the server already closed the connection: the read below sees why.
        try? connection.sendFrame(
            opcode: .text,
            payload: Array(#"{"type":"get","request":"\#(request)","collection":"probe","id":"p"}"#.utf8))
        _ = try readMessage(connection, peer, until: { $0.requestId == request }, what: "the probe's answer")
    }

    /// Reads frames until a message `matches`, the server closes, or the time is up (a finding).
    /// Returns nil when the connection ended; it is then forgotten, and the next input opens
    /// another one.
    private func readMessage(
        _ connection: RawWebSocket, _ peer: Peer, until matches: (ServerMessage) -> Bool, what: String
    ) throws -> ServerMessage? {
        while true {
            let frame: RawWebSocket.Frame
            do {
                frame = try connection.blockingReadFrame(timeout: answerTimeout)
            } catch let failure as RawWebSocket.Failure where failure.description == "timed out" {
                throw FuzzFinding(description: "no answer within \(answerTimeout) (waiting for \(what))")
            } catch {
                forget(connection)
                return nil
            }
            switch frame.opcode {
            case .text:
                let message: ServerMessage
                do {
                    message = try Wire.decode(ServerMessage.self, from: frame.payload)
                } catch {
                    throw FuzzFinding(
                        description: "the server sent a frame that is not a message: \(error): \(frame.text)")
                }
                if peer == .carol && frame.text.contains(Self.secret) {
                    throw FuzzFinding(description: "carol was sent what she may not read: \(frame.text)")
                }
                if matches(message) { return message }
            case .close:
                closeCodes[frame.closeCode ?? 1005, default: 0] += 1
                forget(connection)
                return nil
            case .binary, .continuation:
                throw FuzzFinding(description: "the server sent a \(frame.opcode) frame")
            case .ping, .pong:
                continue
            }
        }
    }

    private func forget(_ connection: RawWebSocket) {
        for (key, session) in sessions where session === connection { sessions[key] = nil }
    }

    // MARK: - Inputs

    /// Frames from the input: a header byte as sent (FIN, reserved bits, opcode), a length byte,
    /// then that many payload bytes (fewer at the end of the input), masked as a client must.
    static func frames(from body: [UInt8]) -> [UInt8] {
        var bytes: [UInt8] = []
        var index = 0
        while index < body.count {
            let header = body[index]
            let length = index + 1 < body.count ? Int(body[index + 1]) : 0
            let start = min(index + 2, body.count)
            let payload = body[start..<min(start + length, body.count)]
            index = start + length
            bytes.append(header)
            if payload.count < 126 {
                bytes.append(0x80 | UInt8(payload.count))
            } else {
                bytes += [0x80 | 126, 0, UInt8(payload.count)]
            }
            let mask: [UInt8] = [0x0F, 0xF0, 0x55, 0xAA]
            bytes.append(contentsOf: mask)
            for (offset, byte) in payload.enumerated() { bytes.append(byte ^ mask[offset & 3]) }
        }
        return bytes
    }

    /// Whatever the decoders accept must encode to bytes that decode to the same value.
    static func checkDecoders(_ bytes: [UInt8]) throws {
        func roundTrip<T: JSONReadable & JSONWritable & Equatable>(_ type: T.Type) throws {
            guard let value = try? Wire.decode(type, from: bytes) else { return }
            let encoded = Wire.encode(value)
            let again: T
            do {
                again = try Wire.decode(type, from: encoded)
            } catch {
                throw FuzzFinding(
                    description:
                        "\(type) encodes to bytes it cannot decode: \(error): \(String(decoding: encoded, as: UTF8.self))"
                )
            }
            guard again == value else {
                throw FuzzFinding(
                    description:
                        "\(type) changes in an encode/decode round trip: \(String(decoding: encoded, as: UTF8.self))")
            }
        }
        try roundTrip(ClientMessage.self)
        try roundTrip(ServerMessage.self)
        try checkCanonicalFields(bytes)
        if let value = try? Wire.parse(bytes) {
            let encoded = Wire.encode(value)
            guard (try? Wire.parse(encoded)) == value else {
                throw FuzzFinding(
                    description: "JSON changes in a round trip: \(String(decoding: encoded, as: UTF8.self))")
            }
        }
        _ = try? Wire.decodeTimes(bytes)
        _ = try? Wire.decodeFields(bytes)
    }

    /// The client message decoding, which reads a write's fields straight into canonical text,
    /// must give what the general one (through a tree of values) gives: the same message and,
    /// for each op, the bytes the writer gives for its fields; or the same error.
    static func checkCanonicalFields(_ bytes: [UInt8]) throws {
        func general<Message: JSONReadable>(_ type: Message.Type) throws(WireError) -> Message {
            try Wire.decode(type, from: bytes)
        }
        let fast = Result { () throws(WireError) in try Wire.decode(ClientMessage.self, from: bytes) }
        let slow = Result { () throws(WireError) in try general(ClientMessage.self) }
        let text = String(decoding: bytes.prefix(300), as: UTF8.self)
        switch (fast, slow) {
        case (.success(let fast), .success(let slow)):
            guard fast == slow else { throw FuzzFinding(description: "the client message decodings differ: \(text)") }
            guard case .write(let write) = fast, case .write(let general) = slow else { return }
            for (op, generalOp) in zip(write.ops, general.ops)
            where op.canonicalFieldsJSON != generalOp.fields.map({ Wire.encodeCanonical($0) }) {
                throw FuzzFinding(description: "a write's fields were kept as text that is not canonical: \(text)")
            }
        case (.failure(let fast), .failure(let slow)):
            guard fast.code == slow.code, fast.message == slow.message, fast.request == slow.request,
                fast.op == slow.op, fast.target == slow.target
            else {
                throw FuzzFinding(
                    description: "the client message decodings refuse differently (\(fast); \(slow)): \(text)")
            }
        default:
            throw FuzzFinding(description: "one client message decoding refuses what the other accepts: \(text)")
        }
    }

}

extension ServerMessage {
    /// The request an answer belongs to.
    fileprivate var requestId: String? {
        switch self {
        case .ack(let ack): ack.request
        case .conflict(let conflict): conflict.request
        case .document(let reply): reply.request
        case .error(let error): error.request
        case .welcome, .snapshot, .reset, .authenticated: nil
        }
    }
}

/// The inputs of a corpus: files as given, folders by their regular files, sorted by path.
public enum CorpusFiles {
    public static func list(_ urls: [URL]) throws -> [URL] {
        var files: [URL] = []
        for url in urls {
            var isFolder: ObjCBool = false
            guard FileManager.default.fileExists(atPath: url.path, isDirectory: &isFolder) else {
                throw FuzzFinding(description: "\(url.path): no such file or folder")
            }
            if isFolder.boolValue {
                let names = try FileManager.default.contentsOfDirectory(atPath: url.path)
                files += names.filter { !$0.hasPrefix(".") }.map { url.appendingPathComponent($0) }
            } else {
                files.append(url)
            }
        }
        return files.sorted { $0.path < $1.path }
    }
}

/// A TCP connection that never becomes a WebSocket.
private enum PlainTCP {
    /// Writes the bytes on a fresh TCP connection, half-closes it, and reads what the server
    /// answers until it closes (at most two seconds).
    static func sendBeforeUpgrade(_ bytes: [UInt8], port: Int) throws {
        let fd: Int32
        do {
            fd = try PlainSocket.connect(host: "127.0.0.1", port: port)
            PlainSocket.resetOnClose(fd)
        } catch {
            throw FuzzFinding(description: "the server refused a TCP connection: \(error)")
        }
        defer { close(fd) }
        try? PlainSocket.sendAll(fd, bytes)
        shutdown(fd, Int32(SHUT_WR))
        var chunk = [UInt8](repeating: 0, count: 4096)
        let deadline = ContinuousClock.now + .seconds(2)
        while PlainSocket.wait(fd, for: Int16(POLLIN), until: deadline) {
            guard let count = try? PlainSocket.receive(fd, into: &chunk), count > 0 else { return }
        }
    }
}
