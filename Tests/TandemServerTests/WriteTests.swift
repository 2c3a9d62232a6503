import Foundation
import TandemClient
import TandemServer
import TandemTesting
import TandemWire
import Testing

@Suite("Writes: atomicity, preconditions and idempotency")
struct WriteTests {
    @Test("the same write sent twice creates one document and answers the same id both times")
    func idempotentResend() async throws {
        let server = try await TestServer()
        let connection = try await connect(server, as: "device-1")
        let ops = [WriteOp.create(in: try path("notes"), fields: ["t": "once"], idempotencyKey: key())]
        guard case .ack(let first) = try await connection.write(ops) else { throw TestFailure("refused") }
        guard case .ack(let second) = try await connection.write(ops) else { throw TestFailure("refused") }
        #expect(first == second)

        // From a new connection of the same client, as after a lost acknowledgement.
        connection.close()
        let reconnected = try await connect(server, as: "device-1")
        guard case .ack(let third) = try await reconnected.write(ops) else { throw TestFailure("refused") }
        #expect(third == first)
        #expect(try await server.server.documents(in: try path("notes")).count == 1)

        // Another client with the same key is another operation.
        let other = try await connect(server, as: "device-2")
        guard case .ack(let fourth) = try await other.write(ops) else { throw TestFailure("refused") }
        #expect(fourth[0].id != first[0].id)
    }

    @Test(
        "a resend of a write whose document was deleted since is answered with the delete, as a conflict, not its first answer"
    )
    func resendAfterDelete() async throws {
        let server = try await TestServer()
        let phone = try await connect(server, as: "phone")
        let created = try await phone.create("notes", ["t": "draft"])
        let rename = [
            WriteOp.update(
                in: try path("notes"), id: created.id, fields: ["t": "final"], baseVersion: 1, idempotencyKey: key())
        ]
        let create = [WriteOp.create(in: try path("notes"), fields: ["t": "other"], idempotencyKey: key())]
        guard case .ack = try await phone.write(rename), case .ack(let made) = try await phone.write(create) else {
            throw TestFailure("refused")
        }
        let laptop = try await connect(server, as: "laptop")
        _ = try await laptop.delete("notes", created.id)
        _ = try await laptop.delete("notes", made[0].id)

        // The phone never heard its answers, and sends both again.
        for (ops, id, tombstone) in [(rename, created.id, 3), (create, made[0].id, 2)] {
            guard case .conflict(let op, let document) = try await phone.write(ops) else {
                throw TestFailure("expected a conflict for \(id)")
            }
            #expect(op == 0)
            #expect(document.id == id && document.deleted && document.version == Int64(tombstone))
        }
        #expect(try await server.server.documents(in: try path("notes")).isEmpty)

        // Removed by an admin reset (no tombstone): a tombstone of version 0 and nothing else.
        let kept = [WriteOp.create(in: try path("notes"), fields: ["t": "kept"], idempotencyKey: key())]
        guard case .ack(let keptAnswer) = try await phone.write(kept) else { throw TestFailure("refused") }
        _ = try await server.server.reset(collection: path("notes"))
        guard case .conflict(_, let none) = try await phone.write(kept) else {
            throw TestFailure("expected a conflict after the reset")
        }
        let tombstone = Document(
            id: keptAnswer[0].id, version: 0, fields: [:], createTime: 0, updateTime: 0, deleted: true)
        #expect(none == tombstone)
    }

    @Test(
        "fields in any key order and spacing are stored and sent as canonical JSON, read straight or parsed",
        .disabled(if: TestServer.usesTLS, "raw frames over plain TCP"),
        arguments: [
            // Read into canonical text as they come.
            (#"{ "b" : [ 2 , 1 ] , "a" : { "d" : 1 , "c" : "x" } }"#, #"{"a":{"c":"x","d":1},"b":[2,1]}"#),
            (#"{"a":1,"b":-2.5,"c":null,"d":true}"#, #"{"a":1,"b":-2.5,"c":null,"d":true}"#),
            // Left to the parser: escapes, numbers printed otherwise, a key outside ASCII.
            (#"{"b":"x\u0041\/","a":1}"#, #"{"a":1,"b":"xA/"}"#),
            (#"{"n":1E2,"m":-0}"#, #"{"m":0,"n":100.0}"#),
            (#"{"é":1,"e":2}"#, #"{"e":2,"é":1}"#),
        ])
    func canonicalFields(sent: String, stored: String) async throws {
        let server = try await TestServer()
        let listener = try await welcomedRawSocket(on: server, as: "listener")
        try listener.send(text: #"{"type":"listen","target":"t","collection":"notes"}"#)
        _ = try await listener.readText()  // the initial snapshot, empty
        let writer = try await welcomedRawSocket(on: server, as: "writer")
        for (id, fields) in [("n1", sent), ("n2", "{}")] {
            try writer.send(
                text: #"{"type":"write","request":"r","ops":[{"op":"create","collection":"notes","id":"\#(id)","#
                    + #""fields":\#(fields),"idempotencyKey":"\#(id)"}]}"#)
            #expect(try await writer.readText().contains(#""type":"ack""#))
        }
        // Live, as the write stored it; then to a new listener, read back from the store (the
        // write after it keeps its own rows in memory for the feed, not these).
        #expect(try await listener.readText().contains(#""fields":"# + stored))
        let late = try await welcomedRawSocket(on: server, as: "late")
        try late.send(text: #"{"type":"listen","target":"t","collection":"notes"}"#)
        let snapshot = try await late.readText()
        #expect(snapshot.contains(#""id":"n1""#) && snapshot.contains(#""fields":"# + stored), "\(snapshot)")
    }

    /// The answer carries the fields one level deeper than the write did; a client that read
    /// server messages to the write's 64 levels could not read it, and dropped the connection.
    @Test("a merge's answer carries fields nested as deep as a write may send them, and the client reads it")
    func deepestMergeAnswered() async throws {
        let server = try await TestServer()
        let writer = try await connect(server)
        defer { writer.close() }
        // The fields nest 61 levels: at level 4 of the write, its deepest object is at 64.
        var deep: JSONValue = .object([:])
        for _ in 0..<59 { deep = .object(["a": deep]) }
        let op = WriteOp(
            kind: .create, collection: try CollectionPath("notes"), id: nil, fields: ["a": deep], baseVersion: nil,
            idempotencyKey: .random(), fieldTimes: ["a": 1])
        guard case .ack(let results) = try await writer.write([op]) else { throw TestFailure("the write was refused") }
        #expect(results.first?.document?.fields["a"] == deep)
        #expect(writer.isOpen)
    }

    @Test("an update with a stale baseVersion gets conflict with the server's document and changes nothing")
    func staleBaseVersion() async throws {
        let server = try await TestServer()
        let connection = try await connect(server)
        let created = try await connection.create("notes", ["t": "v1"])
        guard case .ack = try await connection.update("notes", created.id, ["t": "v2"], base: 1) else {
            throw TestFailure("first update refused")
        }
        let reply = try await connection.update("notes", created.id, ["t": "stale"], base: 1)
        guard case .conflict(let op, let document) = reply else {
            throw TestFailure("expected a conflict, got \(reply)")
        }
        #expect(op == 0)
        #expect(document.version == 2)
        #expect(document.fields == ["t": "v2"])
        let stored = try #require(try await server.server.document(in: try path("notes"), id: created.id))
        #expect(stored.version == 2)
        #expect(stored.fields == ["t": "v2"])
    }

    @Test("a write is all or nothing: one failed precondition rolls back the ops before it")
    func atomic() async throws {
        let server = try await TestServer()
        let connection = try await connect(server)
        let existing = try await connection.create("notes", ["t": "x"])
        let reply = try await connection.write([
            .create(in: try path("notes"), fields: ["t": "new"], idempotencyKey: key()),
            .update(in: try path("notes"), id: existing.id, fields: ["t": "y"], baseVersion: 7, idempotencyKey: key()),
        ])
        guard case .conflict(let op, _) = reply else { throw TestFailure("expected a conflict") }
        #expect(op == 1)
        #expect(try await server.server.documents(in: try path("notes")).count == 1)
    }

    @Test("a proposed id is used, and proposing an existing one is a conflict")
    func proposedID() async throws {
        let server = try await TestServer()
        let connection = try await connect(server)
        let first = try await connection.create("notes", ["t": 1], id: "my-id")
        #expect(first.id.rawValue == "my-id")
        let reply = try await connection.write([
            .create(in: try path("notes"), id: try DocumentID("my-id"), fields: ["t": 2], idempotencyKey: key())
        ])
        guard case .conflict(_, let document) = reply else { throw TestFailure("expected a conflict") }
        #expect(document.fields == ["t": 1])
    }

    @Test("server-assigned ids are 20 characters and versions count every write")
    func versions() async throws {
        let server = try await TestServer()
        let connection = try await connect(server)
        let created = try await connection.create("notes", ["t": 1])
        #expect(created.id.rawValue.count == 20)
        #expect(created.version == 1)
        guard case .ack(let updated) = try await connection.update("notes", created.id, ["t": 2], base: nil) else {
            throw TestFailure("refused")
        }
        #expect(updated[0].version == 2)
        guard case .ack(let deleted) = try await connection.delete("notes", created.id, base: 2) else {
            throw TestFailure("refused")
        }
        #expect(deleted[0].version == 3)
        #expect(try await connection.get(try path("notes"), created.id) == nil)
        let tombstone = try #require(try await server.server.document(in: try path("notes"), id: created.id))
        #expect(tombstone.deleted)
    }

    @Test("an update or delete of a deleted document is a conflict showing the tombstone; no resurrection")
    func noResurrection() async throws {
        let server = try await TestServer()
        let connection = try await connect(server)
        let created = try await connection.create("notes", ["t": 1])
        _ = try await connection.delete("notes", created.id)
        let reply = try await connection.update("notes", created.id, ["t": "late"], base: 1)
        guard case .conflict(_, let document) = reply else { throw TestFailure("expected a conflict") }
        #expect(document.deleted)
        #expect(try await connection.get(try path("notes"), created.id) == nil)
    }

    @Test("get returns the stored document")
    func get() async throws {
        let server = try await TestServer()
        let connection = try await connect(server)
        let created = try await connection.create("a/b/c", ["nested": ["x": [1, 2]]])
        let document = try #require(try await connection.get(try path("a/b/c"), created.id))
        #expect(document.fields == ["nested": ["x": [1, 2]]])
        #expect(document.version == 1)
    }
}

@Suite("Field-level merge on the server")
struct ServerMergeTests {
    @Test("the same two conflicting writes applied in both orders give identical documents")
    func commutative() async throws {
        let server = try await TestServer()
        let connection = try await connect(server, as: "merger")
        let notes = try path("notes")
        var ids: [DocumentID] = []
        for _ in 0..<2 {
            guard
                case .ack(let results) = try await connection.write([
                    WriteOp(
                        kind: .create, collection: notes, id: nil, fields: ["title": "t0", "amount": 0, "note": "n0"],
                        baseVersion: nil, idempotencyKey: key(), fieldTimes: ["title": 1, "amount": 1, "note": 1])
                ])
            else { throw TestFailure("create refused") }
            ids.append(results[0].id)
        }
        func x(_ id: DocumentID) -> WriteOp {
            WriteOp(
                kind: .update, collection: notes, id: id, fields: ["title": "from X", "amount": 10, "note": "x"],
                baseVersion: nil, idempotencyKey: key(), fieldTimes: ["title": 5, "amount": 2, "note": 3])
        }
        func y(_ id: DocumentID) -> WriteOp {
            WriteOp(
                kind: .update, collection: notes, id: id, fields: ["title": "from Y", "amount": 20, "note": "y"],
                baseVersion: nil, idempotencyKey: key(), fieldTimes: ["title": 3, "amount": 4, "note": 3])
        }
        _ = try await connection.write([x(ids[0])])
        _ = try await connection.write([y(ids[0])])
        _ = try await connection.write([y(ids[1])])
        guard case .ack(let last) = try await connection.write([x(ids[1])]) else { throw TestFailure("refused") }

        let first = try #require(try await server.server.document(in: notes, id: ids[0]))
        let second = try #require(try await server.server.document(in: notes, id: ids[1]))
        #expect(first.fields == second.fields)
        #expect(first.fieldTimes == second.fieldTimes)
        #expect(
            first.fields == ["title": "from X", "amount": 20, "note": "y"],
            "later title from X, amount from Y, tie by value")
        #expect(last[0].document?.fields == second.fields, "a merge answers with the stored document")
    }

    @Test("a merged write sent twice with its key changes nothing the second time and answers the same")
    func idempotent() async throws {
        let server = try await TestServer()
        let connection = try await connect(server, as: "merger")
        let notes = try path("notes")
        let created = try await connection.create("notes", ["a": 1])
        let op = WriteOp(
            kind: .update, collection: notes, id: created.id, fields: ["a": 2], baseVersion: nil,
            idempotencyKey: key(), fieldTimes: ["a": 9])
        guard case .ack(let first) = try await connection.write([op]) else { throw TestFailure("refused") }
        guard case .ack(let second) = try await connection.write([op]) else { throw TestFailure("refused") }
        #expect(first == second)
        #expect(try await server.server.document(in: notes, id: created.id)?.version == 2)
    }
}
