import Foundation
import TandemClient
import TandemServer
import TandemTesting
import TandemWire
import Testing

/// What PROTOCOL.md promises about the shape of answers, checked as a client sees them.
@Suite("The protocol as written")
struct ProtocolPromiseTests {
    /// A document written with field-level merging, then merged once more.
    static func mergedDocument(_ connection: ServerConnection) async throws -> DocumentID {
        let notes = try path("notes")
        guard
            case .ack(let created) = try await connection.write([
                WriteOp(
                    kind: .create, collection: notes, id: nil, fields: ["title": "t", "amount": 1], baseVersion: nil,
                    idempotencyKey: key(), fieldTimes: ["title": 10, "amount": 10])
            ])
        else { throw TestFailure("create refused") }
        guard
            case .ack = try await connection.write([
                WriteOp(
                    kind: .update, collection: notes, id: created[0].id, fields: ["amount": 2], baseVersion: nil,
                    idempotencyKey: key(), fieldTimes: ["amount": 20])
            ])
        else { throw TestFailure("merge refused") }
        return created[0].id
    }

    @Test("fieldTimes travel with a document everywhere: get, initial snapshots, resumed and live snapshots")
    func fieldTimesEverywhere() async throws {
        let server = try await TestServer()
        let writer = try await connect(server)
        let id = try await Self.mergedDocument(writer)
        let expected: [String: Int64] = ["title": 10, "amount": 20]

        let got = try #require(try await writer.get(try path("notes"), id))
        #expect(got.fieldTimes == expected)

        let reader = try await connect(server)
        let initial = Feed()
        reader.listen(to: try path("notes"), handler: initial.handler)
        try await waitUntil("current") { initial.isCurrent }
        #expect(initial.changes.first?.document.fieldTimes == expected)

        let token = try #require(initial.lastToken)
        guard
            case .ack = try await writer.write([
                WriteOp(
                    kind: .update, collection: try path("notes"), id: id, fields: ["title": "u"], baseVersion: nil,
                    idempotencyKey: key(), fieldTimes: ["title": 30])
            ])
        else { throw TestFailure("merge refused") }
        try await waitUntil("the live change arrives") { initial.changes.count == 2 }
        #expect(initial.changes.last?.document.fieldTimes == ["title": 30, "amount": 20])

        let resumed = Feed()
        reader.listen(to: try path("notes"), target: "resumed", resumeToken: token, handler: resumed.handler)
        try await waitUntil("current") { resumed.isCurrent }
        #expect(resumed.changes.map(\.document.fieldTimes) == [["title": 30, "amount": 20]])
    }

    @Test("one commit gives each listener one snapshot, each document once in its latest state")
    func oneSnapshotPerCommit() async throws {
        let server = try await TestServer()
        let writer = try await connect(server)
        let existing = try await writer.create("a", ["v": 0])
        let reader = try await connect(server)
        let a = Feed(), b = Feed()
        reader.listen(to: try path("a"), handler: a.handler)
        reader.listen(to: try path("b"), handler: b.handler)
        try await waitUntil("current") { a.isCurrent && b.isCurrent }

        // Ops on a, b, a, and two updates of one document, in one write.
        let reply = try await writer.write([
            .create(in: try path("a"), fields: ["v": 1], idempotencyKey: key()),
            .create(in: try path("b"), fields: ["v": 2], idempotencyKey: key()),
            .update(in: try path("a"), id: existing.id, fields: ["v": 3], baseVersion: 1, idempotencyKey: key()),
            .update(in: try path("a"), id: existing.id, fields: ["v": 4], baseVersion: 2, idempotencyKey: key()),
        ])
        guard case .ack(let results) = reply else { throw TestFailure("\(reply)") }
        // A marker commit after it: once it arrives, everything of the first commit has.
        _ = try await writer.create("a", ["marker": true])
        try await waitUntil("the marker arrives") { a.changes.contains { $0.document.fields["marker"] == true } }
        try await waitUntil("b's change arrives") { b.changes.count == 1 }

        let live = a.snapshots.filter { !$0.initial }
        #expect(live.count == 2, "one snapshot for the commit, one for the marker: \(live.map(\.changes.count))")
        #expect(live.first?.changes.map(\.document.id) == [results[0].id, existing.id])
        #expect(live.first?.changes.last?.document.version == 3)
        #expect(live.first?.changes.last?.document.fields == ["v": 4])
        #expect(b.snapshots.filter { !$0.initial }.count == 1)
    }
}

@Suite("Resets seen from outside")
struct OutsideResetTests {
    @Test("tandem serve --tombstone-days 0 purges at once: a token from before a delete then gets reset")
    func expiredTokenFromOutside() async throws {
        let folder = try TemporaryDirectory()
        let server = try await ServerProcess(
            dataDirectory: folder.url, options: ["--tombstone-days", "0", "--maintenance-seconds", "1"])
        defer { server.send(SIGTERM) }
        let writer = try await ServerConnection.connect(to: server.url, clientId: "writer")
        let kept = try await writer.create("notes", ["t": "kept"])
        let doomed = try await writer.create("notes", ["t": "doomed"])
        let reader = try await ServerConnection.connect(to: server.url, clientId: "reader")
        let first = Feed()
        reader.listen(to: try path("notes"), handler: first.handler)
        try await waitUntil("current") { first.isCurrent }
        let token = try #require(first.lastToken)
        _ = try await writer.delete("notes", doomed.id)

        // Within a maintenance run or two the tombstone is purged; the old token then gets reset.
        var attempt = 0
        try await waitUntil("a resume from before the delete is reset", timeout: .seconds(30)) {
            attempt += 1
            let feed = Feed()
            reader.listen(to: try path("notes"), target: "try-\(attempt)", resumeToken: token, handler: feed.handler)
            try await waitUntil("answered") { feed.isCurrent || !feed.errors.isEmpty }
            reader.unlisten("try-\(attempt)")
            guard !feed.resets.isEmpty else { return false }
            #expect(feed.changes.map(\.document.id) == [kept.id], "the full snapshot follows the reset")
            return true
        }
    }
}
