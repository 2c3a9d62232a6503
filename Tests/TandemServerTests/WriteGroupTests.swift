import GRDB
import Logging
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
                client: client, user: nil)
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
}
