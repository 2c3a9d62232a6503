import Foundation
import Synchronization
import TandemServer
import TandemTesting
import TandemWire
import Testing

/// The close frames PROTOCOL.md promises, read off the wire by a client that does the RFC 6455
/// framing by hand.
@Suite("Close codes on the wire")
struct CloseCodeTests {
    /// A test server whose keepalive runs on a short clock.
    static func server(pingInterval: UInt16, idleTimeout: UInt16) async throws -> TestServer {
        try await TestServer { configuration in
            configuration.pingInterval = pingInterval
            configuration.idleTimeout = idleTimeout
        }
    }

    static func session(_ server: TestServer, receiveBufferSize: Int? = nil) async throws -> RawWebSocket {
        let raw = try await RawWebSocket.open(
            port: server.port, receiveBufferSize: receiveBufferSize,
            hello: #"{"type":"hello","protocol":1,"clientId":"closer"}"#)
        _ = try await raw.readText()
        return raw
    }

    @Test("a ping with a 200-byte payload (control frames carry at most 125) is closed with 1002")
    func oversizePing() async throws {
        let server = try await TestServer()
        let raw = try await Self.session(server)
        try raw.sendFrame(opcode: .ping, payload: Array(repeating: 0x41, count: 200))
        let close = try await raw.readClose(timeout: .seconds(10))
        #expect(close.closeCode == 1002, "\(close.closeReason)")
    }

    @Test("a close frame with a 1-byte body is answered with 1002, not echoed")
    func oneByteClose() async throws {
        let server = try await TestServer()
        let raw = try await Self.session(server)
        try raw.sendFrame(opcode: .close, payload: [0x03])
        let close = try await raw.readClose(timeout: .seconds(10))
        #expect(close.closeCode == 1002, "\(close.payload)")
    }

    @Test("a frame announcing 2^62 bytes is closed with 1009 at once, while the peer keeps sending")
    func hugeAnnouncedLength() async throws {
        let server = try await TestServer()
        let raw = try await Self.session(server)
        // FIN + text, masked, 64-bit length 2^62, mask, then some payload.
        var header: [UInt8] = [0x81, 0x80 | 127]
        header += [0x40, 0, 0, 0, 0, 0, 0, 0]
        header += [1, 2, 3, 4]
        try await raw.write(header + Array(repeating: 0x20, count: 70_000))
        let close = try await raw.readClose(timeout: .seconds(10))
        #expect(close.closeCode == 1009, "\(close.closeReason)")
    }

    @Test(
        "a frame header announcing more than the limit, with no payload after it, is closed with 1009, not left to idle"
    )
    func announcedLengthAlone() async throws {
        // The idle close far off: only the header's own check can close it in time.
        let server = try await Self.server(pingInterval: 100, idleTimeout: 200)
        let raw = try await Self.session(server)
        // FIN + text, masked, 64-bit length of 2 MiB (the limit is 1 MiB), the mask; no payload.
        try await raw.write([0x81, 0x80 | 127, 0, 0, 0, 0, 0, 0x20, 0, 0, 1, 2, 3, 4])
        let close = try await raw.readClose(timeout: .seconds(60))
        #expect(close.closeCode == 1009, "\(close.closeReason)")
    }

    @Test("a client still sending when its token is refused gets the 1008 close frame, not a reset")
    func refusedWhileSending() async throws {
        let folder = try TemporaryDirectory()
        let tokens = folder.url.appendingPathComponent("tokens.json")
        try #"{"tokens": {"t-alice": "alice"}}"#.write(to: tokens, atomically: true, encoding: .utf8)
        let access = try AccessControl.load(tokensFile: tokens, rulesFile: nil)
        let server = try await TestServer { $0.access = access }
        let raw = try await RawWebSocket.open(port: server.port)
        // The hello with a wrong token and, right behind it, thousands of messages: more than the
        // server reads before it handles them, so that it stops reading, then closes.
        try raw.send(text: #"{"type":"hello","protocol":1,"clientId":"c","token":"wrong"}"#)
        var gets: [UInt8] = []
        for _ in 0..<100 {
            gets += RawWebSocket.frame(
                opcode: .text, payload: Array(#"{"type":"get","request":"r","collection":"notes","id":"a"}"#.utf8))
        }
        let sending = Thread { [gets] in
            // Sends for three seconds, whatever happens to the connection meanwhile.
            let end = ContinuousClock.now + .seconds(3)
            while ContinuousClock.now < end { try? raw.sendRaw(gets) }
        }
        sending.start()
        let close = try await raw.readClose(timeout: .seconds(60))
        #expect(close.closeCode == 1008, "\(close.closeReason)")
    }

    @Test(
        "a message over the limit, in fragments of any size, is closed with 1009 every time",
        arguments: [4096, 50_000, 65_536])
    func oversizeFragments(fragment: Int) async throws {
        let server = try await TestServer { $0.limits.maxMessageBytes = 256 << 10 }
        for attempt in 0..<10 {
            let raw = try await Self.session(server)
            var wire: [UInt8] = []
            let total = 300 << 10
            var sent = 0
            while sent < total {
                let size = min(fragment, total - sent)
                wire += RawWebSocket.frame(
                    opcode: sent == 0 ? .text : .continuation, payload: Array(repeating: 0x20, count: size),
                    fin: sent + size == total)
                sent += size
            }
            try? await raw.write(wire)
            let close = try await raw.readClose(timeout: .seconds(10))
            #expect(close.closeCode == 1009, "attempt \(attempt): \(close.closeReason)")
        }
    }

    @Test("a client whose send queue overflows finds a 1008 close frame when it reads, however late")
    func overflowCloseFrame() async throws {
        // The stalled client never speaks: without a long idle timeout, a starved machine
        // can reach the timeout (1001) before the writer has filled the kernel's buffers.
        let server = try await TestServer { configuration in
            configuration.maxQueuedBytesPerConnection = 256 << 10
            configuration.idleTimeout = 600
        }
        let stalled = try await Self.session(server, receiveBufferSize: 4096)
        try stalled.send(text: #"{"type":"listen","target":"t","collection":"big"}"#)
        let writer = try await connect(server)
        let blob = String(repeating: "x", count: 60_000)
        // The stalled client reads nothing while changes pile up for it.
        try await waitUntil("the stalled client's queue overflowed", timeout: .seconds(60)) {
            _ = try await writer.create("big", ["blob": .string(blob)])
            return await server.server.stats.connections == 1
        }
        let close = try await stalled.readClose(timeout: .seconds(20))
        #expect(close.closeCode == 1008, "\(close.closeReason)")
        #expect(close.closeReason.hasPrefix("send queue overflow"), "\(close.closeReason)")
        let metrics = try await HTTPGet.fetch(port: server.port, path: "/metrics").body
        #expect(metrics.contains("\ntandem_slow_consumers_closed_total 1\n"), "\(metrics)")
    }

    @Test("a connection dropped by an injected fault gets 1011")
    func injectedFault() async throws {
        let server = try await TestServer { $0.faults = FaultPlan(seed: 1, dropConnectionAfter: 2) }
        let raw = try await Self.session(server)
        try raw.send(text: #"{"type":"get","request":"r","collection":"c","id":"x"}"#)
        let close = try await raw.readClose(timeout: .seconds(10))
        #expect(close.closeCode == 1011)
        #expect(close.closeReason.hasPrefix("injected fault"), "\(close.closeReason)")
    }

    /// The keepalive of all a loop's connections runs from one sweep, not a timer each: the
    /// connections opened together fall due together, and each is still pinged, then closed
    /// from its own callback.
    @Test("twenty silent clients opened together are each pinged, then each closed with 1001 at the idle timeout")
    func idleTimeoutOfMany() async throws {
        let server = try await Self.server(pingInterval: 1, idleTimeout: 3)
        var clients: [RawWebSocket] = []
        for _ in 0..<20 { clients.append(try await Self.session(server)) }
        try await withThrowingTaskGroup(of: (pings: Int, close: RawWebSocket.Frame).self) { group in
            for client in clients {
                group.addTask {
                    var pings = 0
                    while true {
                        let frame = try await client.readFrame(timeout: .seconds(30))
                        if frame.opcode == .ping { pings += 1 }
                        if frame.opcode == .close { return (pings, frame) }
                    }
                }
            }
            for try await (pings, close) in group {
                #expect(pings >= 1, "a ping before the close")
                #expect(close.closeCode == 1001, "\(close.closeReason)")
                #expect(close.closeReason.hasPrefix("idle timeout"), "\(close.closeReason)")
            }
        }
    }

    @Test("a client silent past the idle timeout is closed with 1001; one that only sends data stays")
    func idleTimeout() async throws {
        let server = try await Self.server(pingInterval: 2, idleTimeout: 5)
        let silent = try await Self.session(server)
        // The talker connects, says hello, sends a get every 100 ms for 8 s and then asks once
        // more and reads until that answer comes, all from a thread of its own, started at
        // once. It never answers a ping. The server's clock starts at the upgrade and runs on
        // after the talker's last send: any wait on the cooperative pool (a task, or the
        // test's own task after an await) between the upgrade and the first send, or between
        // the last send and the final question, counts as silence, and a loaded machine can
        // hold the pool up for longer than the timeout (it did, in CI, for both).
        let port = server.port
        let gaps = Mutex<Duration>(.zero)
        let talking = OwnThread { () throws -> String? in
            let talker = try RawWebSocket(port: port)
            var last = ContinuousClock.now
            func send(_ text: String) throws {
                try talker.send(text: text)
                let now = ContinuousClock.now
                gaps.withLock { $0 = max($0, now - last) }
                last = now
            }
            do {
                try send(#"{"type":"hello","protocol":1,"clientId":"talker"}"#)
                let started = ContinuousClock.now
                while ContinuousClock.now - started < .seconds(8) {
                    try send(#"{"type":"get","request":"r","collection":"c","id":"x"}"#)
                    Thread.sleep(forTimeInterval: 0.1)
                }
                try send(#"{"type":"get","request":"last","collection":"c","id":"x"}"#)
                while true {
                    let frame = try talker.blockingReadFrame(timeout: .seconds(30))
                    if frame.opcode == .close {
                        return "closed (\(frame.closeCode ?? 0)): \(frame.closeReason)"
                    }
                    if frame.text.contains(#""request":"last""#) { return nil }
                }
            } catch {
                return "\(error)"
            }
        }
        let close = try await silent.readClose(timeout: .seconds(30))
        #expect(close.closeCode == 1001, "\(close.closeReason)")
        #expect(close.closeReason.hasPrefix("idle timeout"), "\(close.closeReason)")
        if let failure = try await talking.value {
            Issue.record(
                "the talker was closed: \(failure); longest pause between its sends (from the upgrade): \(gaps.withLock { $0 })"
            )
        }
    }

    @Test("a client still reading a backlog past the idle timeout stays, though its pong waits behind the backlog")
    func slowReaderStays() async throws {
        let server = try await Self.server(pingInterval: 1, idleTimeout: 3)
        let writer = try await connect(server)
        let blob = String(repeating: "x", count: 50_000)
        for _ in 0..<40 { _ = try await writer.create("big", ["blob": .string(blob)]) }

        // A 2 MB snapshot through a 4 kB receive buffer at 8 kB every 20 ms: five seconds of
        // reading, longer than the idle timeout, with the server's pings answered by nobody.
        // The whole conversation runs on one thread of its own: a hop through the cooperative
        // pool between two reads is a pause in reading, and a loaded machine can make it longer
        // than the timeout.
        let port = server.port
        let failure = try await onOwnThread { () throws -> String? in
            let reader = try RawWebSocket(port: port, receiveBufferSize: 4096)
            try reader.send(text: #"{"type":"hello","protocol":1,"clientId":"reader"}"#)
            try reader.send(text: #"{"type":"listen","target":"t","collection":"big"}"#)
            try reader.blockingTrickle(for: .seconds(5), chunk: 8192, every: .milliseconds(20))
            var documents = 0
            while documents < 40 {
                let frame = try reader.blockingReadFrame(timeout: .seconds(30))
                if frame.opcode == .close {
                    return "closed after \(documents) documents: \(frame.closeCode ?? 0) \(frame.closeReason)"
                }
                documents += frame.text.components(separatedBy: "\"blob\"").count - 1
            }
            try reader.send(text: #"{"type":"get","request":"after","collection":"big","id":"x"}"#)
            while true {
                let frame = try reader.blockingReadFrame(timeout: .seconds(30))
                if frame.opcode == .close {
                    return "closed after the backlog: \(frame.closeCode ?? 0) \(frame.closeReason)"
                }
                if frame.text.contains(#""request":"after""#) { return nil }
            }
        }
        #expect(failure == nil, "\(failure ?? "")")
    }
}
