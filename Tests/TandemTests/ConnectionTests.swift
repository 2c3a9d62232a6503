import Foundation
import Synchronization
import Tandem
import TandemClient
import TandemSocket
import TandemTesting
import TandemWire
import Testing

@Suite("Connecting")
struct ConnectionTests {
    @Test("connecting to a port nobody listens on fails at once, every time, instead of waiting for the timeout")
    func refusedConnectionsFailFast() async throws {
        // Found by the soak: a refused connection fails within microseconds, on the socket's
        // thread, and its close could come before the connection object was wired to the
        // socket; it was dropped and connect waited for its timeout (one attempt in five in a
        // release build, about one in 500 in a debug build, hence the many attempts).
        // The port stays bound, not listening, until the end: connects to it are refused, and
        // no server started meanwhile by another test can take it.
        let refusing = try RefusingPort()
        for attempt in 0..<2000 {
            do {
                let connection = try await ServerConnection.connect(
                    to: refusing.url, clientId: "c\(attempt)", timeout: .seconds(15))
                connection.close()
                Issue.record("attempt \(attempt) connected to a closed port")
            } catch let error as TandemError {
                // A lost failure ends in `.timedOut` instead.
                #expect(error.code == .unreachable, "attempt \(attempt): \(error)")
            }
        }
    }

    @Test(
        "a write is decoded by the server and answered to the client while every thread of libdispatch's global pool is blocked"
    )
    func answersArriveWithTheGlobalPoolBlocked() async throws {
        // The sync service's pushes wait for their answers on threads of that pool, as many as
        // there are devices pushing; on Linux libdispatch gives the pool as many threads as
        // cores, and adds one a second while they are blocked. With the connection's queue, or
        // the server session's decoder, on the pool, the answer waited for that (the cluster
        // benchmark stalled for up to a second at a time, and halved its throughput).
        let server = try await TestServer()
        let connection = try await ServerConnection.connect(to: server.url, clientId: "blocked-pool")
        defer { connection.close() }
        // Over 4 KB: the server decodes it on the session's own queue, not the core queue.
        let ops = [
            WriteOp.create(
                in: try CollectionPath("notes"), fields: ["note": .string(String(repeating: "x", count: 8 << 10))],
                idempotencyKey: .random())
        ]
        let release = DispatchSemaphore(value: 0)
        // More than libdispatch ever starts threads for (it adds one a second, up to 255):
        // anything queued on the pool after them waits until they are released.
        let count = 256 + 4 * ProcessInfo.processInfo.activeProcessorCount
        for _ in 0..<count { DispatchQueue.global().async { release.wait() } }
        defer { for _ in 0..<count { release.signal() } }
        // Nothing awaits from here until the pool is released: Swift concurrency's tasks run on
        // that pool too (on Linux), so this test's own would wait like the answer, and so would
        // every other test's while this one holds the pool.
        let answer = Mutex<Result<ServerConnection.WriteReply, any Error>?>(nil)
        let answered = DispatchSemaphore(value: 0)
        connection.write(ops) { result in
            answer.withLock { $0 = result }
            answered.signal()
        }
        // A bound on progress only: the answer takes milliseconds.
        let arrived = answered.wait(timeout: .now() + .seconds(20)) == .success
        #expect(arrived, "no answer while the pool was blocked")
        if arrived {
            let reply = try #require(answer.withLock { $0 }).get()
            guard case .ack = reply else {
                Issue.record("the write was refused: \(reply)")
                return
            }
        }
    }

    @Test("connections given one queue run their handlers on it, each in its own order")
    func sharedQueue() async throws {
        let server = try await TestServer()
        let shared = DispatchQueue(label: "tandem.test.shared")
        let key = DispatchSpecificKey<Bool>()
        shared.setSpecific(key: key, value: true)
        let notes = try CollectionPath("notes")
        let seen = Mutex<[String: [Int64]]>([:])
        let elsewhere = Atomic<Int>(0)
        var listeners: [ServerConnection] = []
        for name in ["one", "two"] {
            let connection = try await ServerConnection.connect(to: server.url, clientId: name, queue: shared)
            connection.listen(to: notes) { event in
                if DispatchQueue.getSpecific(key: key) != true { elsewhere.add(1, ordering: .relaxed) }
                guard case .snapshot(let snapshot) = event else { return }
                let numbers = snapshot.changes.compactMap { $0.document.fields["n"]?.intValue }
                seen.withLock { $0[name, default: []] += numbers }
            }
            listeners.append(connection)
        }
        defer { for connection in listeners { connection.close() } }
        let writer = try await ServerConnection.connect(to: server.url, clientId: "writer")
        defer { writer.close() }
        for n in 0..<50 {
            _ = try await writer.write([.create(in: notes, fields: ["n": .int(Int64(n))], idempotencyKey: .random())])
        }
        try await waitUntil("both listeners have every note") {
            seen.withLock { $0.values.count == 2 && $0.values.allSatisfy { $0.count == 50 } }
        }
        #expect(seen.withLock { $0 } == ["one": Array(0..<50), "two": Array(0..<50)])
        #expect(elsewhere.load(ordering: .relaxed) == 0, "a handler ran off the shared queue")
    }

    @Test("a hello that is never answered times out, and the socket does not stay open behind the error")
    func unansweredHelloCloses() async throws {
        let silent = Silent()
        // The server never drops the client itself: only the client's own close can end it.
        var configuration = WebSocketConfiguration()
        configuration.pingInterval = 3600
        configuration.idleTimeout = 7200
        let server = try WebSocketServer(port: 0, configuration: configuration, delegate: silent)
        defer { server.shutdownWithoutWaiting() }
        await #expect {
            _ = try await ServerConnection.connect(
                to: "ws://127.0.0.1:\(server.port)", clientId: "patient", timeout: .milliseconds(300))
        } throws: { error in
            (error as? TandemError)?.code == .timedOut
        }
        try await waitUntil("the server saw the client go") { silent.closed.withLock { $0 } == 1 }
    }

    /// Without the drop, the snapshot that could not be read was skipped, and the listener's
    /// next one would have stored a token past its changes.
    @Test(
        "a server message of a kind the client does not know is skipped; one of a kind it knows that it cannot read drops the connection"
    )
    func unreadableMessageDrops() async throws {
        let scripted = Scripted()
        let server = try WebSocketServer(port: 0, delegate: scripted)
        defer { server.shutdownWithoutWaiting() }
        let connection = try await ServerConnection.connect(to: "ws://127.0.0.1:\(server.port)", clientId: "reader")
        defer { connection.close() }
        let snapshots = Mutex<[String]>([])
        connection.listen(to: try CollectionPath("notes")) { event in
            if case .snapshot(let snapshot) = event { snapshots.withLock { $0.append(snapshot.resumeToken) } }
        }
        // The server answered the listen with a later protocol's notice, a snapshot, and a
        // snapshot without its changes.
        try await waitUntil("the first snapshot arrived") { snapshots.withLock { $0 } == ["t.1"] }
        try await waitUntil("the connection dropped") { !connection.isOpen }
        #expect(snapshots.withLock { $0 } == ["t.1"])
        // Each kind listed is one the decoder reads (a bare type lacks its fields, nothing more;
        // `authenticated` has none it must carry).
        #expect(
            try Wire.decode(ServerMessage.self, from: Array(#"{"type":"authenticated"}"#.utf8))
                == .authenticated(.init(user: nil, expires: nil)))
        for kind in ServerMessage.kinds where kind != "authenticated" {
            do {
                _ = try Wire.decode(ServerMessage.self, from: Array(#"{"type":"\#(kind)"}"#.utf8))
                Issue.record("a bare \(kind) was read")
            } catch {
                #expect(!error.message.contains("unknown server message type"), "\(kind) is not decoded")
            }
        }
    }
}

/// A server that says welcome to a hello, and answers a listen with a message of an unknown
/// kind, a snapshot, and a snapshot it cannot have meant (no changes).
private final class Scripted: WebSocketDelegate {
    func webSocketDidOpen(_ connection: WebSocketConnection) {}
    func webSocket(_ connection: WebSocketConnection, didReceive message: WebSocketMessage) {
        let text = String(decoding: message.bytes, as: UTF8.self)
        if text.contains(#""type":"hello""#) {
            let welcome = ServerMessage.welcome(.init(sessionId: "s1", serverTime: 0, limits: .default))
            try? connection.send(text: Wire.encodeString(welcome))
        } else if text.contains(#""type":"listen""#) {
            let snapshot = ServerMessage.snapshot(
                .init(target: "notes", changes: [], resumeToken: "t.1", initial: true))
            try? connection.send(text: #"{"type":"notice","text":"from a later protocol"}"#)
            try? connection.send(text: Wire.encodeString(snapshot))
            try? connection.send(text: #"{"type":"snapshot","target":"notes","resumeToken":"t.2"}"#)
        }
    }
    func webSocket(_ connection: WebSocketConnection, didCloseWith event: WebSocketCloseEvent) {}
}

/// A WebSocket server that never answers.
private final class Silent: WebSocketDelegate {
    let closed = Mutex(0)
    func webSocketDidOpen(_ connection: WebSocketConnection) {}
    func webSocket(_ connection: WebSocketConnection, didReceive message: WebSocketMessage) {}
    func webSocket(_ connection: WebSocketConnection, didCloseWith event: WebSocketCloseEvent) {
        closed.withLock { $0 += 1 }
    }
}
