import Foundation
import TandemClient
import TandemHarness
import TandemSocket
import TandemWire

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// A deliberately primitive WebSocket client over a blocking POSIX socket, for tests that need
/// to misbehave: send fragments, binary frames, invalid UTF-8 or oversize frames, stop reading,
/// or never answer a ping. Nothing here is meant for production traffic.
///
/// For example:
///
/// ```swift
/// let raw = try await RawWebSocket.open(port: server.port)
/// try raw.sendFrame(opcode: .binary, payload: [1, 2, 3])
/// let reply = try await raw.readFrame()
/// ```
///
/// What can block for long (connecting, large writes, reads) runs on a thread of its own when
/// called from a task: the tests run side by side on the few threads of the cooperative pool,
/// and one test blocking one of them holds up every other test's tasks (a device's reconnect
/// waited seconds behind a 7 MB write).
public final class RawWebSocket: @unchecked Sendable {
    public enum Opcode: UInt8, Sendable {
        case continuation = 0, text = 1, binary = 2, close = 8, ping = 9, pong = 10
    }

    public struct Frame: Sendable {
        public var opcode: Opcode
        public var fin: Bool
        public var payload: [UInt8]
        public var text: String { String(decoding: payload, as: UTF8.self) }
        /// For close frames: the status code.
        public var closeCode: UInt16? {
            guard opcode == .close, payload.count >= 2 else { return nil }
            return UInt16(payload[0]) << 8 | UInt16(payload[1])
        }
        /// For close frames: the reason.
        public var closeReason: String {
            guard opcode == .close, payload.count > 2 else { return "" }
            return String(decoding: payload[2...], as: UTF8.self)
        }
    }

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    private let fd: Int32
    private var buffer: [UInt8] = []

    /// Connects to `host:port` and completes the HTTP upgrade, on a thread of its own.
    ///
    /// - Parameter hello: A text message sent right after the upgrade, on the same thread:
    ///   between the server's accept and the hello there is then no wait for a thread of the
    ///   cooperative pool, which on a loaded machine can outlast the server's hello timeout.
    public static func open(
        host: String = "127.0.0.1", port: Int, path: String = "/", receiveBufferSize: Int? = nil,
        resetOnClose: Bool = false, hello: String? = nil
    ) async throws -> RawWebSocket {
        try await onOwnThread {
            let raw = try RawWebSocket(
                host: host, port: port, path: path, receiveBufferSize: receiveBufferSize, resetOnClose: resetOnClose)
            if let hello { try raw.send(text: hello) }
            return raw
        }
    }

    /// Connects to `host:port` and completes the HTTP upgrade, blocking the calling thread: for
    /// harnesses that run on a thread of their own; from a task, use ``open(host:port:receiveBufferSize:resetOnClose:)``.
    ///
    /// - Parameters:
    ///   - receiveBufferSize: A small value makes a consumer that never reads fill up quickly
    ///     (SO_RCVBUF).
    ///   - resetOnClose: Closing resets the connection (no TIME_WAIT), for harnesses that open
    ///     many.
    ///   - path: The path of the upgrade request (a DevTools page's, for instance).
    public init(
        host: String = "127.0.0.1", port: Int, path: String = "/", receiveBufferSize: Int? = nil,
        resetOnClose: Bool = false
    ) throws {
        do {
            fd = try PlainSocket.connect(host: host, port: port, receiveBufferSize: receiveBufferSize)
            if resetOnClose { PlainSocket.resetOnClose(fd) }
        } catch {
            throw Failure(description: "\(error)")
        }
        let key = ClientFraming.newKey()
        try writeAll(ClientFraming.upgradeRequest(path: path, host: "\(host):\(port)", key: key, sendsOrigin: false))
        let head = try readHTTPHead(timeout: 30)
        if let problem = ClientFraming.problem(withAnswer: head, key: key) {
            // No close here: once every property is set, a throwing initializer still runs
            // deinit, which closes the socket; a second close would close whatever socket of
            // the process got the number meanwhile (another test's connection).
            throw Failure(description: "upgrade refused: \(problem)")
        }
    }

    deinit { close(fd) }

    /// The socket's two ends now, as `local -> peer` ports (diagnostics: a socket number
    /// closed and reused elsewhere in the process shows other ports than at connect).
    public var endpoints: String {
        var local = sockaddr_in(), peer = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        withUnsafeMutablePointer(to: &local) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { _ = getsockname(fd, $0, &length) }
        }
        length = socklen_t(MemoryLayout<sockaddr_in>.size)
        withUnsafeMutablePointer(to: &peer) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { _ = getpeername(fd, $0, &length) }
        }
        return "fd \(fd): \(UInt16(bigEndian: local.sin_port)) -> \(UInt16(bigEndian: peer.sin_port))"
    }

    /// Sends one frame, masked as RFC 6455 requires of clients.
    public func sendFrame(opcode: Opcode, payload: [UInt8], fin: Bool = true) throws {
        try writeAll(Self.frame(opcode: opcode, payload: payload, fin: fin))
    }

    /// Sends a text message in one frame.
    public func send(text: String) throws {
        try sendFrame(opcode: .text, payload: Array(text.utf8))
    }

    /// Sends raw bytes as they are (for hand-made frames), blocking the calling thread until the
    /// peer's receive buffer took them all: for a few bytes; for many, ``write(_:)``.
    public func sendRaw(_ bytes: [UInt8]) throws {
        try writeAll(bytes)
    }

    /// Sends raw bytes as they are, on a thread of its own: a peer that reads slowly can keep a
    /// large write waiting for a long time.
    public func write(_ bytes: [UInt8]) async throws {
        try await onOwnThread { try self.writeAll(bytes) }
    }

    /// Encodes one masked client frame (with the same key each time: the bytes a test sends are
    /// the same on every run).
    public static func frame(opcode: Opcode, payload: [UInt8], fin: Bool = true) -> [UInt8] {
        ClientFraming.frame(opcode: opcode.rawValue, payload: payload, fin: fin, maskKey: 0x7856_3412)
    }

    /// Reads the next frame, answering nothing (pings are returned like any frame).
    ///
    /// The blocking read runs on a thread of its own (``onOwnThread(_:)``), not on the caller's task.
    ///
    /// - Throws: ``Failure`` when nothing arrives within `timeout` or the peer closed the TCP
    ///   connection.
    public func readFrame(timeout: Duration = .seconds(30)) async throws -> Frame {
        try await onOwnThread { try self.readFrameBlocking(until: ContinuousClock.now + timeout) }
    }

    /// Reads frames until a text frame arrives, answering pings as any WebSocket client does.
    public func readText(timeout: Duration = .seconds(30)) async throws -> String {
        try await onOwnThread { try self.readTextBlocking(until: ContinuousClock.now + timeout) }
    }

    /// Reads `count` text messages on one thread, each within `timeout` of the one before.
    public func readTexts(_ count: Int, timeout: Duration = .seconds(30)) async throws -> [String] {
        try await onOwnThread {
            try (0..<count).map { _ in try self.readTextBlocking(until: ContinuousClock.now + timeout) }
        }
    }

    private func readTextBlocking(until deadline: ContinuousClock.Instant) throws -> String {
        BlockingCheck.willBlock("RawWebSocket's blocking read")
        while true {
            let frame = try readFrameBlocking(until: deadline)
            switch frame.opcode {
            case .text: return frame.text
            case .close: throw Failure(description: "closed (\(frame.closeCode ?? 0)): \(frame.closeReason)")
            case .ping: try? sendFrame(opcode: .pong, payload: frame.payload)
            default: continue
            }
        }
    }

    /// Reads until the peer's close frame arrives, answers it as RFC 6455 asks, and returns it.
    public func readClose(timeout: Duration = .seconds(30)) async throws -> Frame {
        try await onOwnThread {
            let deadline = ContinuousClock.now + timeout
            while true {
                let frame = try self.readFrameBlocking(until: deadline)
                if frame.opcode == .close {
                    try? self.sendFrame(opcode: .close, payload: Array(frame.payload.prefix(2)))
                    return frame
                }
            }
        }
    }

    /// True when the peer has closed the TCP connection (reads return end of file), waiting
    /// up to `timeout` and discarding anything that arrives meanwhile.
    public func waitForDisconnect(timeout: Duration) async -> Bool {
        (try? await onOwnThread {
            let deadline = ContinuousClock.now + timeout
            while ContinuousClock.now < deadline {
                do {
                    try self.fill(until: deadline)
                    self.buffer.removeAll()
                } catch let failure as Failure where failure.description == "end of file" {
                    return true
                } catch {
                    return false
                }
            }
            return false
        }) ?? false
    }

    /// Reads like a slow link: at most `chunk` bytes every `interval`, for `duration`, keeping
    /// what arrives for the frame reads that follow; answers nothing meanwhile.
    public func trickle(for duration: Duration, chunk: Int, every interval: Duration) async throws {
        try await onOwnThread { try self.blockingTrickle(for: duration, chunk: chunk, every: interval) }
    }

    /// ``trickle(for:chunk:every:)`` on the calling thread, blocking it: for a test whose whole
    /// conversation runs on a thread of its own.
    public func blockingTrickle(for duration: Duration, chunk: Int, every interval: Duration) throws {
        BlockingCheck.willBlock("RawWebSocket's blocking trickle")
        let end = ContinuousClock.now + duration
        var bytes = [UInt8](repeating: 0, count: chunk)
        while ContinuousClock.now < end {
            if PlainSocket.wait(fd, for: Int16(POLLIN), until: ContinuousClock.now + interval) {
                let count = try PlainSocket.receive(fd, into: &bytes)
                guard count > 0 else { throw Failure(description: "end of file") }
                buffer.append(contentsOf: bytes[0..<count])
            }
            Thread.sleep(forTimeInterval: Double(interval.components.attoseconds) / 1e18)
        }
    }

    /// Reads the next frame on the calling thread, blocking it: for harnesses that run on a
    /// thread of their own (a fuzzer), never from a task.
    ///
    /// - Throws: ``Failure`` "timed out" or "end of file".
    public func blockingReadFrame(timeout: Duration) throws -> Frame {
        try readFrameBlocking(until: ContinuousClock.now + timeout)
    }

    private func readFrameBlocking(until deadline: ContinuousClock.Instant) throws -> Frame {
        BlockingCheck.willBlock("RawWebSocket's blocking frame read")
        while true {
            if let frame = parseFrame() { return frame }
            try fill(until: deadline)
        }
    }

    private func parseFrame() -> Frame? {
        guard let header = ClientFraming.FrameHeader.parse(buffer),
            buffer.count >= header.headerLength + header.payloadLength
        else { return nil }
        let end = header.headerLength + header.payloadLength
        let payload = Array(buffer[header.headerLength..<end])
        buffer.removeFirst(end)
        return Frame(opcode: Opcode(rawValue: header.opcode) ?? .binary, fin: header.fin, payload: payload)
    }

    private func fill(until deadline: ContinuousClock.Instant) throws {
        guard PlainSocket.wait(fd, for: Int16(POLLIN), until: deadline) else { throw Failure(description: "timed out") }
        var chunk = [UInt8](repeating: 0, count: 65536)
        let count: Int
        do {
            count = try PlainSocket.receive(fd, into: &chunk)
        } catch {
            throw Failure(description: "\(error)")
        }
        guard count > 0 else { throw Failure(description: "end of file") }
        buffer.append(contentsOf: chunk[0..<count])
    }

    private func readHTTPHead(timeout: Double) throws -> String {
        let deadline = ContinuousClock.now + .milliseconds(Int(timeout * 1000))
        let terminator: [UInt8] = [13, 10, 13, 10]
        while true {
            if let range = buffer.firstRange(of: terminator) {
                let head = String(decoding: buffer[..<range.lowerBound], as: UTF8.self)
                buffer.removeFirst(range.upperBound)
                return head
            }
            try fill(until: deadline)
        }
    }

    private func writeAll(_ bytes: [UInt8]) throws {
        do {
            try PlainSocket.sendAll(fd, bytes)
        } catch {
            throw Failure(description: "\(error)")
        }
    }
}
