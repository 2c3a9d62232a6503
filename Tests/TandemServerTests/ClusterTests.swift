import Foundation
import Synchronization
import TandemClient
import TandemServer
import TandemServerPostgres
import TandemTesting
import TandemWire
import Testing

/// Several server nodes over one PostgreSQL database, in this process: each node its own
/// core, store connections and WebSocket port; PostgreSQL the only thing they share.
struct Nodes {
    let cluster: PostgresCluster
    let databaseURL: String
    let servers: [TestServer]

    static func start(
        _ count: Int, configure: @escaping (inout ServerConfiguration) -> Void = { _ in }
    ) async throws -> Nodes {
        let cluster = try await PostgresCluster.shared()
        let url = try await onOwnThread { try cluster.createDatabase() }
        var servers: [TestServer] = []
        for index in 0..<count {
            servers.append(
                try await TestServer { configuration in
                    configuration.storage = .postgres(url: url)
                    configuration.nodeName = "node-\(index)"
                    configure(&configuration)
                })
        }
        return Nodes(cluster: cluster, databaseURL: url, servers: servers)
    }

    subscript(index: Int) -> TestServer { servers[index] }
}

@Suite("Many nodes over one PostgreSQL database")
struct ClusterTests {
    @Test("a reset through one node's admin API resets the live listeners of every node, and imports reach them all")
    func resetAcrossNodes() async throws {
        let nodes = try await Nodes.start(2)
        let writer = try await connect(nodes[0])
        _ = try await writer.create("shared", ["n": 1])
        _ = try await writer.create("shared", ["n": 2])
        let reader = try await connect(nodes[1])
        let feed = Feed()
        reader.listen(to: try path("shared"), handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent && feed.changes.count == 2 }
        let export = try await nodes[0].server.exportDocuments()

        #expect(try await nodes[0].server.reset(collection: path("shared")) == 2)
        try await waitUntil("node B's listener hears of the reset") { !feed.resets.isEmpty }
        try await waitUntil("and gets the empty snapshot") {
            feed.snapshots.last.map { $0.initial && !$0.hasMore && $0.changes.isEmpty } == true
        }
        let summary = try await nodes[0].server.importDocuments(export)
        #expect(summary.documents == 2 && summary.collections == 1)
        try await waitUntil("the imported documents reach node B's listener as added") {
            feed.changes.suffix(2).map(\.kind) == [.added, .added]
        }
        #expect(feed.changes.suffix(2).map { $0.document.fields["n"] } == [1, 2])
    }

    @Test("a listener on node B sees writes made through nodes A and C, in commit order, each once")
    func writesThroughOtherNodes() async throws {
        let nodes = try await Nodes.start(3)
        let reader = try await connect(nodes[1])
        let feed = Feed()
        reader.listen(to: try path("shared"), handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }

        let writers = [try await connect(nodes[0], as: "writer-a"), try await connect(nodes[2], as: "writer-c")]
        var written: [DocumentID] = []
        try await withThrowingTaskGroup(of: [DocumentID].self) { group in
            for (index, writer) in writers.enumerated() {
                group.addTask {
                    var ids: [DocumentID] = []
                    for n in 0..<60 {
                        let created = try await writer.create(
                            "shared", ["n": .int(Int64(n)), "by": .int(Int64(index))])
                        ids.append(created.id)
                        if n % 3 == 0 {
                            _ = try await writer.update(
                                "shared", created.id, ["n": .int(Int64(-n)), "by": .int(Int64(index))], base: 1)
                        }
                    }
                    return ids
                }
            }
            for try await ids in group { written += ids }
        }
        let final = try await nodes[1].server.documents(in: try path("shared"))
        try await waitUntil("B's listener has every document at its last version") {
            let seen = Dictionary(feed.changes.map { ($0.document.id, $0.document.version) }, uniquingKeysWith: max)
            return final.allSatisfy { seen[$0.id] == $0.version }
        }
        #expect(Set(written) == Set(final.map(\.id)))
        // In sequence order, with no change seen twice.
        let sequences = feed.snapshots.compactMap { ResumeToken($0.resumeToken)?.sequence }
        #expect(sequences == sequences.sorted())
        let pairs = feed.changes.map { "\($0.document.id) v\($0.document.version)" }
        #expect(pairs.count == Set(pairs).count, "a change was sent twice")
        // Each document's versions arrive in increasing order.
        var last: [DocumentID: Int64] = [:]
        for change in feed.changes {
            #expect(change.document.version > last[change.document.id] ?? 0)
            last[change.document.id] = change.document.version
        }
    }

    @Test("a resume token taken on one node resumes exactly there on another")
    func resumeOnAnotherNode() async throws {
        let nodes = try await Nodes.start(3)
        let writer = try await connect(nodes[0])
        let a = try await writer.create("notes", ["t": "a"])
        let b = try await writer.create("notes", ["t": "b"])
        let first = try await connect(nodes[0], as: "phone")
        let feed = Feed()
        first.listen(to: try path("notes"), handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }
        let token = try #require(feed.lastToken)
        first.close()

        let other = try await connect(nodes[1])
        _ = try await other.update("notes", a.id, ["t": "a2"], base: 1)
        let c = try await other.create("notes", ["t": "c"])
        _ = try await other.delete("notes", b.id)

        let again = try await connect(nodes[2], as: "phone")
        let resumed = Feed()
        again.listen(to: try path("notes"), resumeToken: token, handler: resumed.handler)
        try await waitUntil("current") { resumed.isCurrent }
        #expect(resumed.summary == ["modified \(a.id) v2", "added \(c.id) v1", "deleted \(b.id) v2"])
        #expect(resumed.resets.isEmpty)
    }

    @Test(
        "text that array literals must escape (quotes, backslashes, braces, commas, NULL, non-ASCII) is stored and read back exactly, by another node"
    )
    func awkwardTextRoundTrips() async throws {
        let nodes = try await Nodes.start(2)
        let awkward: [String] = [
            #"say "hi""#, #"back\slash \" and \\"#, "{braces},commas,\"quoted,\"", "NULL", "", " padded ",
            "accents é ü ñ, CJK 漢字, emoji 🦊🏳️‍🌈", "line\nbreak\ttab", #"{"json": ["in", "text"]}"#,
        ]
        let writer = try await connect(nodes[0])
        var ids: [DocumentID: String] = [:]
        // One write of them all, and each in a write of its own: the group's arrays, and arrays of one.
        let ops = try awkward.map { text in
            WriteOp.create(in: try path("texts"), fields: ["text": .string(text), text: true], idempotencyKey: key())
        }
        guard case .ack(let results) = try await writer.write(ops) else { throw TestFailure("refused") }
        for (result, text) in zip(results, awkward) { ids[result.id] = text }
        for text in awkward { ids[try await writer.create("texts", ["text": .string(text)]).id] = text }

        let stored = try await nodes[1].server.documents(in: try path("texts"))
        #expect(stored.count == awkward.count * 2)
        for document in stored {
            let text = try #require(ids[document.id])
            #expect(document.fields["text"] == .string(text))
            if document.fields.count == 2 { #expect(document.fields[text] == true) }
        }
    }

    @Test("an idempotency key resent to another node gets the first answer and changes nothing")
    func idempotentAcrossNodes() async throws {
        let nodes = try await Nodes.start(2)
        let ops = [WriteOp.create(in: try path("notes"), fields: ["t": "once"], idempotencyKey: key())]
        let first = try await connect(nodes[0], as: "device-1")
        guard case .ack(let answer) = try await first.write(ops) else { throw TestFailure("refused") }
        first.close()
        let second = try await connect(nodes[1], as: "device-1")
        guard case .ack(let again) = try await second.write(ops) else { throw TestFailure("refused") }
        #expect(again == answer)
        #expect(try await nodes[1].server.documents(in: try path("notes")).count == 1)
    }

    @Test("the same resend arriving at two nodes at once is applied once")
    func concurrentResends() async throws {
        let nodes = try await Nodes.start(2)
        for round in 0..<20 {
            let ops = [
                WriteOp.create(in: try path("race"), fields: ["round": .int(Int64(round))], idempotencyKey: key())
            ]
            let a = try await connect(nodes[0], as: "device-\(round)")
            let b = try await connect(nodes[1], as: "device-\(round)")
            async let one = a.write(ops)
            async let two = b.write(ops)
            guard case .ack(let first) = try await one, case .ack(let second) = try await two else {
                throw TestFailure("refused")
            }
            #expect(first == second, "round \(round)")
        }
        #expect(try await nodes[0].server.documents(in: try path("race")).count == 20)
    }

    @Test("a stale update through one node after a write through another is a conflict; merges commute across nodes")
    func conflictsAndMergesAcrossNodes() async throws {
        let nodes = try await Nodes.start(2)
        let a = try await connect(nodes[0])
        let b = try await connect(nodes[1])
        let created = try await a.create("notes", ["t": "v1"])
        guard case .ack = try await a.update("notes", created.id, ["t": "v2"], base: 1) else {
            throw TestFailure("update refused")
        }
        guard case .conflict(_, let server) = try await b.update("notes", created.id, ["t": "stale"], base: 1) else {
            throw TestFailure("expected a conflict")
        }
        #expect(server.version == 2)
        #expect(server.fields == ["t": "v2"])

        let notes = try path("merged")
        guard
            case .ack(let made) = try await a.write([
                WriteOp(
                    kind: .create, collection: notes, id: nil, fields: ["x": 0, "y": 0], baseVersion: nil,
                    idempotencyKey: key(), fieldTimes: ["x": 1, "y": 1])
            ])
        else { throw TestFailure("create refused") }
        let id = made[0].id
        async let fromA = a.write([
            WriteOp(
                kind: .update, collection: notes, id: id, fields: ["x": 10, "y": 10], baseVersion: nil,
                idempotencyKey: key(), fieldTimes: ["x": 5, "y": 2])
        ])
        async let fromB = b.write([
            WriteOp(
                kind: .update, collection: notes, id: id, fields: ["x": 20, "y": 20], baseVersion: nil,
                idempotencyKey: key(), fieldTimes: ["x": 3, "y": 4])
        ])
        _ = try await (fromA, fromB)
        let merged = try #require(try await nodes[1].server.document(in: notes, id: id))
        #expect(merged.fields == ["x": 10, "y": 20], "each field keeps its later write, whichever node took it")
        #expect(merged.version == 3)
    }

    @Test("access rules hold across nodes: a member removed through one node loses his listener on another")
    func revocationAcrossNodes() async throws {
        let access = try SampleAccess.control()
        let nodes = try await Nodes.start(2) { $0.access = access }
        let alice = try await ServerConnection.connect(to: nodes[0].url, clientId: "alice-1", token: "t-alice")
        _ = try await alice.create("accounts", ["owner": "alice", "members": ["bob"]], id: "A1")
        let bob = try await ServerConnection.connect(to: nodes[1].url, clientId: "bob-1", token: "t-bob")
        let transactions = try path("accounts/A1/transactions")
        let feed = Feed()
        bob.listen(to: transactions, handler: feed.handler)
        try await waitUntil("bob's listener is current") { feed.isCurrent }
        _ = try await alice.create(transactions.rawValue, ["amount": 1], id: "T1")
        try await waitUntil("bob hears T1 on the other node") { feed.changes.count == 1 }

        let reply = try await alice.write([
            .update(
                in: try path("accounts"), id: try DocumentID("A1"), fields: ["owner": "alice", "members": []],
                baseVersion: nil, idempotencyKey: key()),
            .create(in: transactions, id: try DocumentID("T2"), fields: ["amount": 2], idempotencyKey: key()),
        ])
        guard case .ack = reply else { throw TestFailure("\(reply)") }
        try await waitUntil("bob's listener is stopped") { !feed.errors.isEmpty }
        #expect(feed.errors.first?.code == .permissionDenied)
        #expect(!feed.changes.contains { $0.document.id.rawValue == "T2" })
        // And his writes are refused through either node.
        for node in 0..<2 {
            let connection = try await ServerConnection.connect(
                to: nodes[node].url, clientId: "bob-\(node + 2)", token: "t-bob")
            await #expect(throws: TandemError.self) { _ = try await connection.create(transactions.rawValue, ["x": 1]) }
        }
    }

    @Test(
        "excludeOwnWrites across nodes: the writer's node leaves out its writes for it; another node's listener, and a write through another node, reach it"
    )
    func ownWritesLeftOutAcrossNodes() async throws {
        let nodes = try await Nodes.start(2)
        let writer = try await connect(nodes[0], as: "writer")
        let own = Feed()
        writer.listen(to: try path("shared"), excludingOwnWrites: true, handler: own.handler)
        let reader = try await connect(nodes[1], as: "reader")
        let theirs = Feed()
        reader.listen(to: try path("shared"), excludingOwnWrites: true, handler: theirs.handler)
        try await waitUntil("both current") { own.isCurrent && theirs.isCurrent }

        let note = try await writer.create("shared", ["t": "a"])
        _ = try await writer.update("shared", note.id, ["t": "a2"], base: 1)
        // Node B may read both commits in one round: then the document comes once, at v2.
        try await waitUntil("node B's listener has the writer's update") {
            theirs.changes.last?.document.version == 2
        }
        // The reader's update, through node B, reaches the writer on node A.
        _ = try await reader.update("shared", note.id, ["t": "b"], base: 2)
        try await waitUntil("the reader's update reaches the writer") { !own.changes.isEmpty }
        #expect(own.summary == ["modified \(note.id) v3"], "none of its own writes")
        #expect(own.changes.last?.document.fields == ["t": "b"])
        #expect(
            own.snapshots.dropFirst().filter { !$0.changes.isEmpty }.count == 1, "its own writes as tokens alone")
        try await waitUntil("both listeners end at the same token") { own.lastToken == theirs.lastToken }
        #expect(!theirs.summary.contains("modified \(note.id) v3"), "nor the reader's own write, on node B")
    }

    @Test("devices on different nodes converge, each through its own node")
    func devicesOnDifferentNodes() async throws {
        let nodes = try await Nodes.start(3)
        let devices = try (0..<3).map { index in
            try TestDevice(name: "device-\(index)", serverURL: nodes[index].url)
        }
        for device in devices { device.service.start() }
        let account = try await devices[0].addAccount("Household")
        _ = account
        try await waitUntil("every device has the account") {
            for device in devices where try await device.accounts().count != 1 { return false }
            return true
        }
        for (index, device) in devices.enumerated() {
            let local = try await device.accounts()[0].id!
            for n in 0..<10 { try await device.addEntry("entry \(index)-\(n)", amount: Int64(n), account: local) }
        }
        let report = try await Convergence.waitUntilQuiet(server: nodes[1].server, devices: devices)
        #expect(report.isConverged, "\(report.firstDifferences)")
        for device in devices { #expect(try await device.entries().count == 30, "\(device.name)") }
    }

    @Test(
        "sequences follow commit order: a write on another node waits for the transaction that took the sequence before"
    )
    func sequencesFollowCommitOrder() async throws {
        let held = Checkpoint()
        let holding = Mutex(false)
        let nodes = try await Nodes.start(3) { configuration in
            if configuration.nodeName == "node-0" {
                configuration.hooks.beforeCommit = { if holding.withLock({ $0 }) { held.pause() } }
            }
        }
        defer { held.release() }
        let reader = try await connect(nodes[2])
        let feed = Feed()
        reader.listen(to: try path("ordered"), handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }
        let a = try await connect(nodes[0])
        let b = try await connect(nodes[1])

        // Node A takes its sequence and stops before committing.
        holding.withLock { $0 = true }
        let first = Task { try await a.create("ordered", ["by": "a"]) }
        try await held.reached()
        holding.withLock { $0 = false }
        // Node B writes the same collection: it must wait for A's commit, not take the next
        // sequence and commit before it. PostgreSQL shows it waiting on A's lock.
        let second = Task { try await b.create("ordered", ["by": "b"]) }
        try await waitUntil("node B's transaction waits for a lock") {
            try await onOwnThread { try nodes.waitingForLocks() } > 0
        }
        #expect(feed.changes.isEmpty, "nothing of the collection is visible while A holds its sequence")
        held.release()
        let firstId = try await first.value.id
        let secondId = try await second.value.id
        try await waitUntil("both arrive") { feed.changes.count == 2 }
        #expect(feed.changes.map(\.document.id) == [firstId, secondId], "in the order of their sequences")
        let sequences = feed.snapshots.compactMap { ResumeToken($0.resumeToken)?.sequence }
        #expect(sequences == sequences.sorted())
    }

    @Test(
        "a document another writer of the database stored as something other than a JSON object ends the collection's live query listeners with an error, never a view that skipped it; mended, it reaches a listener that listens again"
    )
    func unreadableStoredDocument() async throws {
        let nodes = try await Nodes.start(1)
        let writer = try await connect(nodes[0])
        let a = try await writer.create("notes", ["n": 1])
        let reader = try await connect(nodes[0])
        let byN = try Wire.decode(Query.self, from: Array(#"{"orderBy":[{"field":"n"}]}"#.utf8))
        let feed = Feed()
        reader.listen(to: try path("notes"), query: byN, handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }
        let token = try #require(feed.lastToken)

        // Written as a node writes: the collection's next sequence, the row, the notification.
        try await onOwnThread { try nodes.store(#"[1]"#, as: a.id, in: "notes") }
        try await waitUntil("the view ends with an error") { !feed.errors.isEmpty }
        #expect(feed.errors.map(\.code) == [.internal])
        #expect(feed.changes.count == 1, "the view went on without the document")
        #expect(reader.isOpen)

        // Listening again meets the same row while it stays.
        let again = Feed()
        reader.listen(to: try path("notes"), resumeToken: token, query: byN, handler: again.handler)
        try await waitUntil("the same error") { !again.errors.isEmpty }

        try await onOwnThread { try nodes.store(#"{"n":2}"#, as: a.id, in: "notes") }
        let mended = Feed()
        reader.listen(to: try path("notes"), resumeToken: token, query: byN, handler: mended.handler)
        try await waitUntil("the mended document") {
            mended.isCurrent && mended.changes.last?.document.fields["n"] == 2
        }
        #expect(mended.errors.isEmpty)
    }
}

extension Nodes {
    /// Stores `fields` as the document's text, as another writer of the database would: with
    /// the collection's next sequence and a notification to every node, bypassing each check.
    func store(_ fields: String, as id: DocumentID, in collection: String) throws {
        let database = PostgresCluster.databaseName(of: databaseURL) ?? ""
        try cluster.sql(
            """
            BEGIN;
            UPDATE tandem_collection SET last_sequence = last_sequence + 1 WHERE path = '\(collection)';
            UPDATE tandem_document SET fields = '\(fields)', version = version + 1,
                sequence = (SELECT last_sequence FROM tandem_collection WHERE path = '\(collection)')
            WHERE collection = '\(collection)' AND id = '\(id)';
            SELECT pg_notify('tandem_feed', '\(collection)');
            COMMIT;
            """, database: database)
    }

    /// How many of this database's sessions wait for a lock now.
    func waitingForLocks() throws -> Int {
        let database = PostgresCluster.databaseName(of: databaseURL) ?? ""
        let output = try cluster.query(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = '\(database)' AND wait_event_type = 'Lock'")
        return Int(output.trimmingCharacters(in: .whitespacesAndNewlines)) ?? 0
    }
}
