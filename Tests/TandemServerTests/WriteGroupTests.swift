import GRDB
import Logging
import Synchronization
import TandemTesting
import TandemWire
import Testing

@testable import TandemServer

/// A write group on the embedded store: what its messages save, each all or nothing.
@Suite("A write group")
struct WriteGroupTests {
    private let collection = try! CollectionPath("notes")

    @Test(
        "a group's documents under ids the server picked are saved with the others; a resend gets its first answer, a refused message leaves nothing"
    )
    func groupWithServerPickedIds() throws {
        let folder = try TemporaryDirectory()
        let store = try SQLiteStore(directory: folder.url, logger: Logger(label: "test"))
        let client = try ClientName("device")
        func request(_ ops: [WriteOp]) -> WriteRequest {
            WriteRequest(
                ops: ops,
                fieldsJSON: ops.map { String(decoding: $0.canonicalFieldsJSON ?? Array("{}".utf8), as: UTF8.self) },
                client: client, identity: .anonymous)
        }
        let proposed = try DocumentID("proposed")
        let requests = [
            request([
                .create(in: collection, fields: ["n": 1], idempotencyKey: try ClientName("k1")),
                .create(in: collection, id: proposed, fields: ["n": 2], idempotencyKey: try ClientName("k2")),
            ]),
            request([
                .update(
                    in: collection, id: proposed, fields: ["n": 3], baseVersion: 1, idempotencyKey: try ClientName("k3")
                ),
                .create(in: collection, fields: ["n": 1], idempotencyKey: try ClientName("k1")),
            ]),
            request([
                .create(in: collection, fields: ["n": 4], idempotencyKey: try ClientName("k4")),
                .update(
                    in: collection, id: try DocumentID("missing"), fields: ["n": 5], baseVersion: nil,
                    idempotencyKey: try ClientName("k5")),
            ]),
        ]
        let outcomes = try store.write(locking: [collection]) { transaction in
            let group = try WriteGroup(
                transaction, requests: requests, access: nil, now: 1_000, maxDocumentBytes: 1 << 20)
            let outcomes = try requests.map { try group.apply($0) }
            try group.save()
            return outcomes
        }
        guard case .applied(let first, _) = outcomes[0], case .applied(let second, let sequences) = outcomes[1] else {
            Issue.record("the first two messages apply: \(outcomes)")
            return
        }
        #expect(second[1] == first[0], "the resend of k1 gets its first answer")
        #expect(sequences[1] == nil)
        guard case .refused(let error) = outcomes[2] else {
            Issue.record("the third message is refused: \(outcomes[2])")
            return
        }
        #expect(error.code == .notFound)
        let rows = try store.database.read { db in
            try Row.fetchAll(db, sql: "SELECT id, version, sequence, fields, createKey FROM document ORDER BY sequence")
        }
        #expect(rows.map { $0["id"] as String } == [first[0].id.rawValue, "proposed"])
        #expect(rows.map { $0["version"] as Int64 } == [1, 2])
        #expect(rows.map { $0["fields"] as String } == [#"{"n":1}"#, #"{"n":3}"#])
        #expect(rows.map { $0["createKey"] as String } == ["k1", "k2"])
        let keys = try store.database.read { db in
            try String.fetchAll(db, sql: "SELECT key FROM idempotency ORDER BY key")
        }
        #expect(keys == ["k1", "k2", "k3"])
    }

    @Test(
        "a group's recorded keys are found alike whether a batch's keys share a prefix (one range of the key index each) or not, other records under the prefix left out"
    )
    func recordedKeysByPrefix() throws {
        let folder = try TemporaryDirectory()
        let store = try SQLiteStore(directory: folder.url, logger: Logger(label: "test"))
        // Batch keys as Tandem's push makes them: eight characters of time, twelve random, the row.
        let (a, b, crowded, fresh) = (
            "0MxAbCdEaaaaaaaaaaaa-", "0MxAbCdEbbbbbbbbbbbb-", "0MxAbCdEcccccccccccc-", "0MxAbCdEdddddddddddd-"
        )
        func record(_ key: String, client: String = "device", user: String = "") throws -> IdempotencyRecord {
            IdempotencyRecord(
                user: user, client: client, key: key,
                result: WriteResult(id: try DocumentID("doc-\(key)"), version: 1, updateTime: 5), recordedAt: 5)
        }
        // A batch answered before (1–40), more records under its prefix (1000–1005), the same
        // keys for another client and another user, a second batch, and many under one prefix.
        var records = try (1...40).map { try record(a + "\($0)") }
        records += try (1000...1005).map { try record(a + "\($0)") }
        records += try (1...40).map { try record(a + "\($0)", client: "other") }
        records += try (1...40).map { try record(a + "\($0)", user: "someone") }
        records += try (1...40).map { try record(b + "\($0)") }
        records += try (1...100).map { try record(crowded + "\($0)") }
        try store.write(locking: []) { transaction in try transaction.save([], records: records, sequences: [:]) }

        func keys(_ prefix: String, _ rows: ClosedRange<Int>) -> [String] { rows.map { prefix + "\($0)" } }
        // What each case reads: a range of a prefix, the probes (json_each), in order.
        let cases: [(keys: [String], found: [String], reads: [String])] = [
            // A resend of 1–20 with 21 new keys: a range of the batch's prefix.
            (keys(a, 1...20) + keys(a, 41...61), keys(a, 1...20), ["range"]),
            // Two batches and three other keys: a range each, then the probes.
            (
                keys(a, 1...20) + keys(b, 1...20) + ["k1", "k2", a + "3"], keys(a, 1...20) + keys(b, 1...20),
                ["range", "range", "probes"]
            ),
            // Too few keys, or no long prefix from one key to the next: the probes.
            (keys(a, 1...5), keys(a, 1...5), ["probes"]),
            (
                (1...20).map { ($0 % 2 == 0 ? a : b) + "\($0)" }, (1...20).map { ($0 % 2 == 0 ? a : b) + "\($0)" },
                ["probes"]
            ),
            // 100 records under the prefix against 16 keys: past the range's limit, the probes.
            (keys(crowded, 1...16), keys(crowded, 1...16), ["range", "probes"]),
            // Nothing recorded yet.
            (keys(fresh, 1...30), [], ["range"]),
        ]
        let reads = Mutex<[String]>([])
        store.database.writeWithoutTransaction { db in
            db.trace { event in
                guard case .statement(let statement) = event, statement.sql.contains("FROM idempotency") else { return }
                reads.withLock { $0.append(statement.sql.contains("json_each") ? "probes" : "range") }
            }
        }
        defer { store.database.writeWithoutTransaction { db in db.trace(nil) } }
        for (keys, expected, expectedReads) in cases {
            reads.withLock { $0 = [] }
            let found = try store.write(locking: []) { transaction in
                try transaction.recordedResults(user: "", client: "device", keys: keys)
            }
            #expect(reads.withLock { $0 } == expectedReads, "\(keys.prefix(3))…")
            #expect(Set(found.keys) == Set(expected), "\(keys.prefix(3))…")
            for (key, result) in found { #expect(result.id.rawValue == "doc-\(key)") }
        }
    }
}
