import Foundation
import Synchronization
import TandemClient
import TandemServer
import TandemServerPostgres
import TandemTesting
import TandemWire
import Testing

/// Faults of a cluster: PostgreSQL restarted under the nodes, a node killed mid-write, a node
/// cut off from the database by a network partition.
@Suite("Cluster faults", .serialized)
struct ClusterFaultTests {
    /// Two test servers over one database of a throwaway PostgreSQL cluster of their own.
    private func twoNodes() async throws -> (PostgresCluster, [TestServer]) {
        let cluster = try await PostgresCluster.start()
        let url = try await onOwnThread { try cluster.createDatabase() }
        let nodes = try await (0..<2).asyncMap { index in
            try await TestServer { configuration in
                configuration.storage = .postgres(url: url)
                configuration.nodeName = "node-\(index)"
            }
        }
        return (cluster, nodes)
    }

    @Test("PostgreSQL restarted at once (-m immediate) while nodes serve: nodes reconnect, catch up, devices converge")
    func postgresRestart() async throws {
        let (cluster, nodes) = try await twoNodes()
        let phone = try TestDevice(name: "phone", serverURL: nodes[0].url) { $0.serverURLs = [nodes[1].url] }
        let laptop = try TestDevice(name: "laptop", serverURL: nodes[1].url) { $0.serverURLs = [nodes[0].url] }
        for device in [phone, laptop] { device.service.start() }
        let account = try await phone.addAccount("Household")
        for n in 0..<5 { try await phone.addEntry("before \(n)", amount: Int64(n), account: account.id!) }
        _ = try await Convergence.waitUntilQuiet(server: nodes[1], devices: [phone, laptop])

        try await cluster.restartImmediately()
        for n in 0..<5 { try await phone.addEntry("after \(n)", amount: Int64(n), account: account.id!) }
        let laptopAccount = try await laptop.accounts()[0].id!
        for n in 0..<5 { try await laptop.addEntry("laptop \(n)", amount: Int64(n), account: laptopAccount) }

        let report = try await Convergence.waitUntilQuiet(
            server: nodes[0], devices: [phone, laptop], timeout: .seconds(90))
        #expect(report.isConverged, "\(report.firstDifferences)")
        #expect(try await phone.entries().count == 15)
        #expect(try await laptop.entries().count == 15)
        // Both nodes answer /healthz with 200 again.
        for node in nodes {
            try await waitUntil("\(node.url) is healthy", timeout: .seconds(30)) {
                try await HTTPGet.fetch(port: node.port, path: "/healthz").status == 200
            }
        }
    }

    @Test("a listener across a PostgreSQL restart hears every change once, resuming from its token")
    func listenerAcrossRestart() async throws {
        let cluster = try await PostgresCluster.start()
        let url = try await onOwnThread { try cluster.createDatabase() }
        let node = try await TestServer { $0.storage = .postgres(url: url) }
        let listener = ResumingListener(url: node.url, collection: try path("ledger"))
        try await listener.start()
        let writer = try await connect(node)
        var written: [DocumentID] = []
        for n in 0..<10 { written.append(try await writer.create("ledger", ["n": .int(Int64(n))]).id) }
        try await cluster.restartImmediately()
        // Writes go through again once the node has its database back.
        var fresh: ServerConnection?
        try await waitUntil("the node takes writes again", timeout: .seconds(60)) {
            do {
                let connection = try await connect(node)
                written.append(try await connection.create("ledger", ["n": .int(100)]).id)
                fresh = connection
                return true
            } catch {
                return false
            }
        }
        for n in 0..<10 { written.append(try await fresh!.create("ledger", ["n": .int(Int64(200 + n))]).id) }
        try await waitUntil("the listener has every document", timeout: .seconds(60)) {
            Set(listener.ids) == Set(written)
        }
        #expect(listener.ids.count == written.count, "each change once: \(listener.ids.count) for \(written.count)")
        listener.stop()
    }

    @Test("a node killed with SIGKILL mid-write loses no acknowledged write; the client finishes through another node")
    func nodeKilledMidWrite() async throws {
        let cluster = try await PostgresCluster.shared()
        let url = try await onOwnThread { try cluster.createDatabase() }
        let nodes = try await (0..<2).asyncMap { _ in
            try await ServerProcess(arguments: ["serve", "--port", "0", "--postgres", url, "--log-level", "warning"])
        }
        defer { for node in nodes { node.send(SIGTERM) } }
        let acknowledged = Mutex<[DocumentID: Int64]>([:])
        let client = "killer"
        // Writes in flight on node 0, answered or not, when it is killed.
        let first = try await ServerConnection.connect(to: nodes[0].url, clientId: client)
        var ops: [WriteOp] = []
        for n in 0..<200 {
            ops.append(.create(in: try path("ledger"), fields: ["n": .int(Int64(n))], idempotencyKey: key()))
        }
        let sending = Task {
            for op in ops {
                guard case .ack(let results) = try await first.write([op]) else { continue }
                acknowledged.withLock { $0[results[0].id] = results[0].version }
            }
        }
        try await waitUntil("some writes are acknowledged") { acknowledged.withLock { $0.count } >= 20 }
        await nodes[0].kill(SIGKILL)
        _ = await sending.result
        let beforeKill = acknowledged.withLock { $0 }
        // The client resends everything, with the same keys, through node 1.
        let second = try await ServerConnection.connect(to: nodes[1].url, clientId: client)
        for op in ops {
            guard case .ack(let results) = try await second.write([op]) else { throw TestFailure("refused") }
            acknowledged.withLock { $0[results[0].id] = results[0].version }
        }
        let stored = try await second.documentsCount("ledger")
        #expect(stored == 200, "one document per op, resends included")
        for (id, version) in beforeKill {
            let document = try #require(try await second.get(try path("ledger"), id))
            #expect(document.version == version)
        }
    }

    @Test(
        "under PostgreSQL fast restarts, no write answered 'internal' was applied, and every acknowledged one is stored once"
    )
    func noCommittedWriteDenied() async throws {
        let (cluster, nodes) = try await twoNodes()
        let ledger = try path("ledger")
        let answers = WriteAnswers()
        // Writers, each on its node, one create at a time, each under a key of its own; a lost
        // connection is found again.
        let writers = (0..<4).map { writer in
            Task {
                var connection: ServerConnection?
                var n = 0
                while !answers.stopped {
                    if connection == nil || !connection!.isOpen {
                        connection = try? await ServerConnection.connect(
                            to: nodes[writer % 2].url, clientId: "writer-\(writer)", timeout: .seconds(10))
                        if connection == nil { try? await Task.sleep(for: .milliseconds(50)) }
                        continue
                    }
                    let key = try ClientName("w\(writer)-\(n)")
                    n += 1
                    let answer: String
                    do {
                        _ = try await connection!.write(
                            [.create(in: ledger, fields: ["n": .int(Int64(n))], idempotencyKey: key)],
                            timeout: .seconds(30))
                        answer = "ack"
                    } catch let error as TandemError {
                        answer = error.serverError?.code.rawValue ?? "no answer"
                    }
                    answers.note(key.rawValue, answer)
                }
            }
        }
        for _ in 0..<3 {
            try await Task.sleep(for: .seconds(1))
            await cluster.stopServer()
            try await cluster.startServer()
        }
        try await Task.sleep(for: .seconds(2))
        answers.stop()
        for writer in writers { _ = await writer.result }

        let reader = try await connect(nodes[0])
        var stored: [String: Int] = [:]
        try await waitUntil("the nodes take reads again", timeout: .seconds(60)) {
            guard let documents = try? await nodes[0].server.documents(in: ledger) else { return false }
            stored = Dictionary(documents.map { ($0.createKey ?? "", 1) }, uniquingKeysWith: +)
            return true
        }
        reader.close()
        let all = answers.all
        let denied = all.filter { $0.value == "internal" }.keys.filter { stored[$0] != nil }
        #expect(denied.isEmpty, "answered 'internal' but stored: \(denied.sorted())")
        let lost = all.filter { $0.value == "ack" }.keys.filter { stored[$0] == nil }
        #expect(lost.isEmpty, "acknowledged but not stored: \(lost.sorted())")
        #expect(stored.values.allSatisfy { $0 == 1 })
        #expect(all.values.filter { $0 == "ack" }.count > 100, "the writers wrote: \(all.count) answers")
    }

    @Test(
        "a node cut off from PostgreSQL reports 503, its clients move to another node, and it catches up when the partition heals"
    )
    func partition() async throws {
        let host = try await NetworkNamespace.make()
        let cluster = try await PostgresCluster.start(tcpAddresses: [host.databaseSideAddress])
        let database = try await onOwnThread { try cluster.createDatabase() }
        let name = try #require(PostgresCluster.databaseName(of: database))
        let folder = try TemporaryDirectory()
        let tokens = folder.url.appendingPathComponent("tokens.json")
        let rules = folder.url.appendingPathComponent("rules.json")
        try #"{"tokens": {"t-alice": "alice"}}"#.write(to: tokens, atomically: true, encoding: .utf8)
        try #"""
        {"rules": [{"match": "accounts", "read": "user != null", "write": "user != null"},
                   {"match": "accounts/{account}/entries", "read": "user != null", "write": "user != null"}]}
        """#.write(to: rules, atomically: true, encoding: .utf8)
        // Node P inside the namespace, reaching PostgreSQL over the link that will be cut.
        let inside = host.command([
            try ServerProcess.findExecutable().path, "serve", "--host", host.address, "--port", "0",
            "--postgres", cluster.tcpURL(database: name, address: host.databaseSideAddress),
            "--tokens", tokens.path, "--rules", rules.path, "--allow-plaintext", "--node-name", "partitioned",
            "--log-level", "error",
        ])
        let partitioned = try await ServerProcess(arguments: inside.arguments, executable: inside.executable)
        defer { partitioned.send(SIGTERM) }
        let access = try AccessControl.load(tokensFile: tokens, rulesFile: rules)
        let healthy = try await TestServer { configuration in
            configuration.storage = .postgres(url: database)
            configuration.access = access
        }
        let partitionedPort = try #require(URL(string: partitioned.url)?.port)
        #expect(try await HTTPGet.fetch(host: host.address, port: partitionedPort, path: "/healthz").status == 200)

        let phone = try TestDevice(name: "phone", serverURL: partitioned.url) { configuration in
            configuration.token = "t-alice"
            configuration.serverURLs = [healthy.url]
        }
        let laptop = try TestDevice(name: "laptop", serverURL: healthy.url) { $0.token = "t-alice" }
        for device in [phone, laptop] { device.service.start() }
        let account = try await phone.addAccount("Household")
        for n in 0..<5 { try await phone.addEntry("before \(n)", amount: Int64(n), account: account.id!) }
        var report = try await Convergence.waitUntilQuiet(server: healthy, devices: [phone, laptop])
        #expect(report.isConverged, "\(report.firstDifferences)")

        try await host.cutDatabaseLink()
        try await waitUntil("the cut-off node reports unhealthy", timeout: .seconds(60)) {
            (try? await HTTPGet.fetch(host: host.address, port: partitionedPort, path: "/healthz").status) == 503
        }
        // The phone goes on through the healthy node.
        for n in 0..<5 { try await phone.addEntry("during \(n)", amount: Int64(n), account: account.id!) }
        report = try await Convergence.waitUntilQuiet(server: healthy, devices: [phone, laptop], timeout: .seconds(90))
        #expect(report.isConverged, "\(report.firstDifferences)")
        #expect(try await laptop.entries().count == 10)

        try await host.healDatabaseLink()
        try await waitUntil("the node is healthy again", timeout: .seconds(60)) {
            (try? await HTTPGet.fetch(host: host.address, port: partitionedPort, path: "/healthz").status) == 200
        }
        // It serves the whole, current data again.
        let reader = try await ServerConnection.connect(to: partitioned.url, clientId: "reader", token: "t-alice")
        let entries = try await path("accounts/\(try #require(try phone.serverId(ofAccount: account.id!)))/entries")
        let feed = Feed()
        reader.listen(to: entries, handler: feed.handler)
        try await waitUntil("the healed node's listener is current") { feed.isCurrent }
        #expect(feed.changes.count == 10)
        await host.remove()
    }
}

/// What each write was answered (`ack`, an error code, or `no answer`), by idempotency key.
final class WriteAnswers: Sendable {
    private let state = Mutex<(answers: [String: String], stopped: Bool)>(([:], false))

    func note(_ key: String, _ answer: String) { state.withLock { $0.answers[key] = answer } }
    var all: [String: String] { state.withLock { $0.answers } }
    func stop() { state.withLock { $0.stopped = true } }
    var stopped: Bool { state.withLock { $0.stopped } }
}

extension ServerConnection {
    /// How many live documents a collection holds, counted by listening to it.
    func documentsCount(_ collection: String) async throws -> Int {
        let feed = Feed()
        let target = "count-\(UUID().uuidString.prefix(6))"
        listen(to: try path(collection), target: target, handler: feed.handler)
        try await waitUntil("the count is in") { feed.isCurrent }
        unlisten(target)
        return Set(feed.changes.filter { !$0.document.deleted }.map(\.document.id)).count
    }
}

/// A listener that reconnects and resumes from its last token, as a client must, recording
/// every document id it is sent (in order, repeats included). Each connection attempt has a
/// number; only the loss of the current, established connection starts a reconnect.
final class ResumingListener: Sendable {
    let url: String
    let collection: CollectionPath
    private struct State {
        var ids: [DocumentID] = []
        var token: String?
        var stopped = false
        var connection: ServerConnection?
        var attempt = 0
    }
    private let state = Mutex(State())

    init(url: String, collection: CollectionPath) {
        self.url = url
        self.collection = collection
    }

    var ids: [DocumentID] { state.withLock { $0.ids } }

    func start() async throws {
        try await connect()
    }

    func stop() {
        let connection = state.withLock { state -> ServerConnection? in
            state.stopped = true
            return state.connection
        }
        connection?.close()
    }

    private func connect() async throws {
        let attempt = state.withLock { state -> Int in
            state.attempt += 1
            return state.attempt
        }
        let connection = try await ServerConnection.connect(
            to: url, clientId: "resuming-listener",
            onClose: { [weak self] _ in self?.lost(attempt) })
        let token = state.withLock { state -> String? in
            state.connection = connection
            return state.token
        }
        connection.listen(to: collection, resumeToken: token) { [weak self] event in
            guard let self, case .snapshot(let snapshot) = event else { return }
            state.withLock { state in
                state.ids += snapshot.changes.map(\.document.id)
                state.token = snapshot.resumeToken
            }
        }
    }

    private func lost(_ attempt: Int) {
        let current = state.withLock { $0.attempt == attempt && $0.connection != nil && !$0.stopped }
        guard current else { return }
        state.withLock { $0.connection = nil }
        Task {
            while !state.withLock({ $0.stopped }) {
                try? await Task.sleep(for: .milliseconds(200))
                if (try? await connect()) != nil { return }
            }
        }
    }
}
