import Foundation
import TandemClient
import TandemServer
import TandemTesting
import TandemWire
import Testing

@Suite("Durability: an acknowledged write is on disk")
struct DurabilityTests {
    @Test("a write acknowledged before the server is killed with SIGKILL is there after restart")
    func survivesSIGKILL() async throws {
        let folder = try TemporaryDirectory()
        let process = try await ServerProcess(dataDirectory: folder.url)
        let connection = try await ServerConnection.connect(to: process.url, clientId: "durable")
        var acknowledged: [WriteResult] = []
        for index in 0..<20 {
            acknowledged.append(try await connection.create("ledger", ["n": .int(Int64(index))]))
        }
        await process.kill(SIGKILL)

        try await process.start()
        let reconnected = try await ServerConnection.connect(to: process.url, clientId: "durable")
        for (index, result) in acknowledged.enumerated() {
            let document = try #require(try await reconnected.get(try path("ledger"), result.id))
            #expect(document.version == result.version)
            #expect(document.fields == ["n": .int(Int64(index))])
        }
        await process.kill(SIGTERM)
    }

    @Test(
        "the connection that writes commits durably: SQLite's synchronous = FULL, PostgreSQL's synchronous_commit = on")
    func synchronousFullInForce() async throws {
        let server = try await TestServer()
        // What must be in force, by store: SQLite in WAL mode syncs a commit only with FULL
        // (2; GRDB's WAL set-up leaves 1, NORMAL); PostgreSQL only with synchronous_commit on
        // (the test cluster's default is off, so the node must set it itself).
        let expected: [(String, String)] =
            TestServer.storeKind == "postgres"
            ? [("synchronous_commit", "on")] : [("synchronous", "2"), ("journal_mode", "wal")]
        for (name, value) in expected {
            #expect(try await server.server.storeSetting(name) == value, "\(name)")
        }
        // Still in force after writes, and after a restart.
        let connection = try await connect(server)
        _ = try await connection.create("notes", ["n": 1])
        try await server.restart()
        for (name, value) in expected {
            #expect(try await server.server.storeSetting(name) == value, "\(name)")
        }
    }

    @Test("every acknowledgement is sent after a sync to disk that covers its write (strace of tandem serve)")
    func syncBeforeEveryAck() async throws {
        let traced = try await TracedServer.start()
        defer { traced.stop() }
        let connection = try await ServerConnection.connect(to: traced.process.url, clientId: "traced")
        let writes = 100
        for index in 0..<writes {
            _ = try await connection.create("ledger", ["n": .int(Int64(index))])
        }
        connection.close()
        let events = try await traced.events(until: { $0.filter { $0 == .ack }.count >= writes })
        let acks = events.filter { $0 == .ack }.count
        let syncs = events.filter { $0 == .sync }.count
        #expect(acks == writes)
        #expect(syncs >= writes, "\(syncs) syncs for \(writes) acknowledged writes")
        // Between two acknowledgements of sequential writes there is a sync.
        var syncedSinceLastAck = false
        var unsynced = 0
        for event in events {
            switch event {
            case .sync: syncedSinceLastAck = true
            case .ack:
                if !syncedSinceLastAck { unsynced += 1 }
                syncedSinceLastAck = false
            }
        }
        #expect(unsynced == 0, "\(unsynced) acknowledgements went out with no sync before them")
    }

    @Test("writes waiting at once share one sync (group commit), and each is still acknowledged after it")
    func groupCommit() async throws {
        let traced = try await TracedServer.start()
        defer { traced.stop() }
        let clients = 8, writesPerClient = 40
        let connections = try await (0..<clients).asyncMap { index in
            try await ServerConnection.connect(to: traced.process.url, clientId: "group-\(index)")
        }
        // Every client sends all its writes without waiting for the answers.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for connection in connections {
                group.addTask {
                    try await withThrowingTaskGroup(of: Void.self) { writes in
                        for index in 0..<writesPerClient {
                            writes.addTask { _ = try await connection.create("ledger", ["n": .int(Int64(index))]) }
                        }
                        try await writes.waitForAll()
                    }
                }
            }
            try await group.waitForAll()
        }
        let total = clients * writesPerClient
        let events = try await traced.events(until: { $0.filter { $0 == .ack }.count >= total })
        let syncs = events.filter { $0 == .sync }.count
        #expect(events.filter { $0 == .ack }.count == total)
        #expect(syncs < total, "\(syncs) syncs for \(total) writes sent at once: no group commit")
        let stored = try await connections[0].write([
            .create(in: try path("ledger"), fields: ["last": true], idempotencyKey: key())
        ])
        guard case .ack = stored else { throw TestFailure("\(stored)") }
    }
}

/// `tandem serve` run under `strace`, which records its syncs to disk (`fsync`, `fdatasync`)
/// and the acknowledgements it sends (`sendto` of a frame holding `"type":"ack"`), in order.
struct TracedServer {
    enum Event: Equatable { case sync, ack }

    let process: ServerProcess
    let trace: URL
    let folder: TemporaryDirectory

    static func start() async throws -> TracedServer {
        let folder = try TemporaryDirectory()
        let trace = folder.url.appendingPathComponent("strace.txt")
        let strace = ["/usr/bin/strace", "/bin/strace"].first { FileManager.default.isExecutableFile(atPath: $0) }
        let executable = try #require(
            strace.map(URL.init(fileURLWithPath:)), "strace is missing: scripts/install-deps installs it")
        let tandem = try ServerProcess.findExecutable()
        let process = try await ServerProcess(
            arguments: [
                "-f", "-qq", "-e", "trace=fsync,fdatasync,sendto", "-s", "48", "-o", trace.path, tandem.path,
                "serve", "--port", "0", "--data", folder.url.appendingPathComponent("data").path,
                "--log-level", "warning",
            ], executable: executable)
        return TracedServer(process: process, trace: trace, folder: folder)
    }

    /// The events traced so far, read again until `done` holds (strace writes as it goes).
    func events(until done: ([Event]) -> Bool) async throws -> [Event] {
        var events: [Event] = []
        try await waitUntil("strace recorded the writes") {
            events = Self.parse((try? String(contentsOf: trace, encoding: .utf8)) ?? "")
            return done(events)
        }
        return events
    }

    static func parse(_ text: String) -> [Event] {
        text.split(separator: "\n").compactMap { line in
            if (line.contains("fdatasync(") || line.contains("fsync(")) && line.contains("= 0") { return .sync }
            if line.contains("sendto(") && line.contains(#"\"type\":\"ack\""#) { return .ack }
            return nil
        }
    }

    /// Stops the server (strace's child) with SIGTERM; strace follows it out.
    func stop() {
        let tracer = process.processIdentifier
        if let children = try? String(contentsOfFile: "/proc/\(tracer)/task/\(tracer)/children", encoding: .utf8) {
            for child in children.split(separator: " ").compactMap({ Int32($0) }) { kill(child, SIGTERM) }
        }
        process.send(SIGTERM)
    }
}

extension Sequence {
    func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var result: [T] = []
        for element in self { result.append(try await transform(element)) }
        return result
    }
}
