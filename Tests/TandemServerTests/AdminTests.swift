import Foundation
import TandemClient
import TandemServer
import TandemTesting
import TandemWire
import Testing

/// Sends one request to a test server's admin API.
private func admin(
    _ server: TestServer, _ method: String, _ path: String, body: String = "", token: String? = nil
) async throws -> (status: Int, body: String) {
    try await HTTPGet.fetch(
        port: server.port, path: path, method: method, body: Array(body.utf8),
        headers: token.map { ["Authorization": "Bearer \($0)"] } ?? [:])
}

private func object(_ text: String) throws -> JSONObject {
    guard case .object(let object) = try Wire.parse(Array(text.utf8)) else {
        throw TestFailure("not an object: \(text)")
    }
    return object
}

@Suite("The admin API: export, import, reset, clients, faults")
struct AdminTests {
    @Test("an export imported into an empty server gives back every document with its version, times and tombstone")
    func exportImportRoundTrip() async throws {
        let source = try await TestServer()
        let writer = try await connect(source)
        let a = try await writer.create("notes", ["title": "a", "tags": ["x", 1, nil]])
        _ = try await writer.update("notes", a.id, ["title": "a2"], base: 1)
        let b = try await writer.create("notes", ["title": "b"])
        _ = try await writer.delete("notes", b.id, base: 1)
        _ = try await writer.create("accounts/A1/transactions", ["amount": -5.5])
        var merge = WriteOp.update(
            in: try path("notes"), id: a.id, fields: ["title": "a3"], baseVersion: nil, idempotencyKey: key())
        merge.fieldTimes = ["title": 9_000_000]
        let merged = try await writer.write([merge])
        guard case .ack = merged else { throw TestFailure("the merge was refused: \(merged)") }

        let export = try await admin(source, "GET", "/admin/export")
        #expect(export.status == 200)
        let lines = export.body.split(separator: "\n")
        #expect(try object(String(lines[0]))["format"] == "tandem-export")

        let target = try await TestServer()
        let imported = try await admin(target, "POST", "/admin/import", body: export.body)
        #expect(imported.status == 200, "\(imported.body)")
        #expect(try object(imported.body) == ["imported": 3, "collections": 2])

        let before = try await source.server.everyDocument().map { "\($0.collection)/\($0.document)" }.sorted()
        let after = try await target.server.everyDocument().map { "\($0.collection)/\($0.document)" }.sorted()
        #expect(before == after)
        let document = try #require(try await target.server.document(in: path("notes"), id: a.id))
        #expect(document.version == 3 && document.fieldTimes?["title"] == 9_000_000)
        #expect(try await target.server.document(in: path("notes"), id: b.id)?.deleted == true)

        // The imported documents are ordinary ones: a later write builds on their versions.
        let client = try await connect(target)
        let reply = try await client.update("notes", a.id, ["title": "a4"], base: 3)
        guard case .ack(let results) = reply else { throw TestFailure("update after import: \(reply)") }
        #expect(results[0].version == 4)
    }

    @Test(
        "export, reset, import gives back the same store, tombstones included; a token from before gets a reset and the same documents"
    )
    func exportResetImport() async throws {
        let server = try await TestServer()
        let writer = try await connect(server)
        let a = try await writer.create("notes", ["title": "a"])
        let b = try await writer.create("notes", ["title": "b"])
        _ = try await writer.delete("notes", b.id, base: 1)
        _ = try await writer.update("notes", a.id, ["title": "a2"], base: 1)
        _ = try await writer.create("accounts/A1/transactions", ["amount": 3])
        let reader = try await connect(server)
        let feed = Feed()
        reader.listen(to: try path("notes"), handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }
        let token = try #require(feed.lastToken)
        reader.close()

        let before = try await server.server.everyDocument().map { "\($0.collection) \($0.document)" }
        let export = try await admin(server, "GET", "/admin/export").body
        #expect(try await admin(server, "POST", "/admin/reset").status == 200)
        #expect(try await server.server.everyDocument().isEmpty)
        #expect(try await admin(server, "POST", "/admin/import", body: export).status == 200)
        let after = try await server.server.everyDocument().map { "\($0.collection) \($0.document)" }
        #expect(after == before)

        // The token is from before the reset: as documented, a reset, then the same documents.
        let late = try await connect(server)
        let resumed = Feed()
        late.listen(to: try path("notes"), resumeToken: token, handler: resumed.handler)
        try await waitUntil("reset and current") { !resumed.resets.isEmpty && resumed.isCurrent }
        #expect(resumed.summary == ["added \(a.id) v2"])
        #expect(resumed.changes.first?.document.fields == ["title": "a2"])
    }

    @Test("an import takes fields nested as deep as a write may carry them (61 levels), and a listener reads them")
    func deepestImport() async throws {
        let server = try await TestServer()
        let fields = String(repeating: #"{"a":"#, count: 60) + "{}" + String(repeating: "}", count: 60)
        let header = #"{"format":"tandem-export","version":1}"#
        let file = header + "\n" + #"{"collection":"notes","id":"x","version":1,"fields":"# + fields + "}\n"
        let answer = try await admin(server, "POST", "/admin/import", body: file)
        #expect(answer.status == 200, "\(answer.body)")
        let reader = try await connect(server)
        defer { reader.close() }
        let feed = Feed()
        reader.listen(to: try path("notes"), handler: feed.handler)
        try await waitUntil("the document arrived") { feed.changes.count == 1 }
        #expect(reader.isOpen)
    }

    @Test("an import that meets an existing document stores nothing and names it")
    func importNeverOverwrites() async throws {
        let server = try await TestServer()
        let writer = try await connect(server)
        let a = try await writer.create("notes", ["title": "a"])
        let export = try await admin(server, "GET", "/admin/export").body
        _ = try await writer.create("other", ["n": 1])
        let fresh = export.replacingOccurrences(of: #""collection":"notes""#, with: #""collection":"fresh""#)
        let clashing = fresh + export.split(separator: "\n").last.map { String($0) + "\n" }!

        let answer = try await admin(server, "POST", "/admin/import", body: clashing)
        #expect(answer.status == 409)
        #expect(answer.body.contains("notes/\(a.id) exists on this server already"), "\(answer.body)")
        #expect(try await server.server.documents(in: path("fresh")).isEmpty)
    }

    @Test(
        "a malformed export is refused with the line at fault and nothing stored",
        arguments: [
            (
                "{\"format\":\"tandem-export\",\"version\":1}\n{\"collection\":\"notes\",\"id\":\"a\",\"version\":1}\nnope\n",
                "line 3: not valid JSON"
            ),
            (
                "{\"format\":\"tandem-export\",\"version\":2}\n",
                "line 1: this server reads version 1 of the format, not 2"
            ),
            ("{\"collection\":\"notes\"}\n", "line 1: the first line must be the header"),
            (
                "{\"format\":\"tandem-export\",\"version\":1}\n{\"collection\":\"a/b\",\"id\":\"x\",\"version\":1}\n",
                "line 2:"
            ),
            (
                "{\"format\":\"tandem-export\",\"version\":1}\n{\"collection\":\"notes\",\"id\":\"x\",\"version\":0}\n",
                "line 2: version: expected 1 or more, not 0"
            ),
            (
                "{\"format\":\"tandem-export\",\"version\":1}\n{\"collection\":\"notes\",\"id\":\"x\",\"version\":1}\n"
                    + "{\"collection\":\"notes\",\"id\":\"x\",\"version\":2}\n", "line 3: notes/x is also on line 2"
            ),
            ("", "the file is empty"),
            (
                // Fields nested 62 levels: a write could not carry them (at its level 4).
                "{\"format\":\"tandem-export\",\"version\":1}\n{\"collection\":\"notes\",\"id\":\"x\",\"version\":1,"
                    + "\"fields\":" + String(repeating: "{\"a\":", count: 61) + "{}" + String(repeating: "}", count: 61)
                    + "}\n",
                "line 2: JSON nested deeper than 62 levels (a document's fields must fit in a write"
            ),
            ("{\"format\":\"tandem-export\",\"version\":1}\n{\"collection\":\"notes\",\"version\":1}\n", "line 2: id"),
        ])
    func malformedImport(file: String, expected: String) async throws {
        let server = try await TestServer()
        let answer = try await admin(server, "POST", "/admin/import", body: file)
        #expect(answer.status == 400 || (file.isEmpty && answer.status == 400))
        #expect(answer.body.contains(expected), "\(answer.body)")
        #expect(try await server.server.everyDocument().isEmpty)
    }

    @Test("a reset of a collection empties it, sends its live listeners a reset, and leaves other collections alone")
    func resetCollection() async throws {
        let server = try await TestServer()
        let writer = try await connect(server)
        _ = try await writer.create("notes", ["title": "a"])
        _ = try await writer.create("notes", ["title": "b"])
        let kept = try await writer.create("other", ["title": "kept"])

        let reader = try await connect(server)
        let feed = Feed()
        reader.listen(to: try path("notes"), handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }
        let oldToken = try #require(feed.lastToken)

        let answer = try await admin(server, "POST", "/admin/reset?collection=notes")
        #expect(answer.status == 200, "\(answer.body)")
        #expect(try object(answer.body) == ["reset": "notes", "documents": 2])
        try await waitUntil("the listener hears of the reset") { !feed.resets.isEmpty }
        try await waitUntil("and gets the empty snapshot") {
            feed.snapshots.last.map { $0.initial && !$0.hasMore && $0.changes.isEmpty } == true
        }
        #expect(try await server.server.documents(in: path("notes")).isEmpty)
        #expect(try await server.server.documents(in: path("other")).map(\.id) == [kept.id])

        // Later writes reach the listener as usual; a token from before the reset gets a reset.
        let c = try await writer.create("notes", ["title": "c"])
        try await waitUntil("the new document arrives") { feed.changes.last?.document.id == c.id }
        #expect(feed.resets.count == 1, "one reset, not one per callback: \(feed.resets)")
        let late = try await connect(server)
        let resumed = Feed()
        late.listen(to: try path("notes"), resumeToken: oldToken, handler: resumed.handler)
        try await waitUntil("the old token is reset") { !resumed.resets.isEmpty && resumed.isCurrent }
        #expect(resumed.summary == ["added \(c.id) v1"])
    }

    @Test("a reset of everything empties every collection")
    func resetEverything() async throws {
        let server = try await TestServer()
        let writer = try await connect(server)
        _ = try await writer.create("notes", ["title": "a"])
        _ = try await writer.create("accounts/A1/transactions", ["amount": 1])
        let answer = try await admin(server, "POST", "/admin/reset")
        #expect(try object(answer.body) == ["reset": "everything", "documents": 2])
        #expect(try await server.server.everyDocument().isEmpty)
    }

    @Test("with an admin token, a request without it or with another is refused and changes nothing")
    func adminToken() async throws {
        let server = try await TestServer { $0.adminToken = "s3cret" }
        let writer = try await connect(server)
        _ = try await writer.create("notes", ["title": "a"])
        for token in [nil, "wrong", "s3cre", "s3cret!"] {
            let answer = try await admin(server, "POST", "/admin/reset", token: token)
            #expect(answer.status == 401, "token \(token ?? "none"): \(answer.body)")
            #expect(try object(answer.body)["error"] == "unauthenticated")
        }
        #expect(try await server.server.documents(in: path("notes")).count == 1)
        // Refused before anything is looked at: an unknown endpoint is not revealed either.
        #expect(try await admin(server, "GET", "/admin/nothing-here").status == 401)
        let allowed = try await admin(server, "GET", "/admin/collections", token: "s3cret")
        #expect(allowed.status == 200)
        #expect(allowed.body == #"{"collections":[{"path":"notes","documents":1}]}"#)
    }

    @Test("a page of another site, or a name that is not loopback, cannot use the admin API through the browser")
    func crossSite() async throws {
        let server = try await TestServer()
        let writer = try await connect(server)
        _ = try await writer.create("notes", ["title": "a"])
        let fromPage = try await HTTPGet.fetch(
            port: server.port, path: "/admin/reset", method: "POST", headers: ["Origin": "http://evil.example"])
        #expect(fromPage.status == 403, "\(fromPage.body)")
        let rebound = try await HTTPGet.fetch(
            port: server.port, path: "/admin/reset", method: "POST", headers: ["Host": "evil.example:\(server.port)"])
        #expect(rebound.status == 403, "\(rebound.body)")
        #expect(try await server.server.documents(in: path("notes")).count == 1)
        // The console's own requests carry its origin, which is the server's.
        let own = try await HTTPGet.fetch(
            port: server.port, path: "/admin/collections", headers: ["Origin": "http://127.0.0.1:\(server.port)"])
        #expect(own.status == 200, "\(own.body)")
    }

    @Test("an empty admin token is refused at start: it would open the admin API")
    func emptyToken() async throws {
        await #expect(throws: ServerError.self) { _ = try await TestServer { $0.adminToken = "" } }
    }

    @Test("the collection to reset is found among several query arguments")
    func queryArguments() async throws {
        let server = try await TestServer()
        let writer = try await connect(server)
        _ = try await writer.create("notes", ["title": "a"])
        _ = try await writer.create("other", ["title": "b"])
        let answer = try await admin(server, "POST", "/admin/reset?dry=no&collection=notes&x=1")
        #expect(try object(answer.body) == ["reset": "notes", "documents": 1], "\(answer.body)")
        #expect(try await server.server.documents(in: path("other")).count == 1)
    }

    @Test("the clients endpoint lists each connection with its listens")
    func clients() async throws {
        let server = try await TestServer()
        let reader = try await ServerConnection.connect(to: server.url, clientId: "reader-1")
        let feed = Feed()
        reader.listen(to: try path("notes"), target: "mine", handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }
        let answer = try await admin(server, "GET", "/admin/clients")
        let clients = try #require(try object(answer.body)["clients"])
        guard case .array(let list) = clients, list.count == 1, case .object(let client) = list[0] else {
            throw TestFailure("expected one client: \(answer.body)")
        }
        #expect(client["clientId"] == "reader-1")
        #expect(client["listens"] == [["target": "mine", "collection": "notes", "live": true, "position": 0]])
    }

    @Test("faults switched on through the admin API take effect at once, and switch off")
    func faultSwitches() async throws {
        let server = try await TestServer()
        let on = try await admin(server, "POST", "/admin/faults", body: #"{"enabled":true,"rejectedWriteRate":1}"#)
        #expect(on.status == 200, "\(on.body)")
        #expect(try object(on.body)["rejectedWriteRate"] == 1.0)
        let client = try await connect(server)
        do {
            let reply = try await client.write([.create(in: try path("notes"), fields: ["a": 1], idempotencyKey: key())]
            )
            Issue.record("expected a refusal, got \(reply)")
        } catch let error as TandemError {
            #expect(error.message.contains("injected fault"), "\(error)")
        }

        let bad = try await admin(server, "POST", "/admin/faults", body: #"{"enabled":true,"lostAckRate":2}"#)
        #expect(bad.status == 400 && bad.body.contains("lostAckRate must be between 0 and 1"), "\(bad.body)")
        let off = try await admin(server, "POST", "/admin/faults", body: #"{"enabled":false}"#)
        #expect(off.body == #"{"enabled":false}"#)
        _ = try await client.create("notes", ["a": 2])
    }

    @Test("the admin API refuses unknown endpoints and wrong methods with a JSON error")
    func unknownEndpoints() async throws {
        let server = try await TestServer()
        let unknown = try await admin(server, "GET", "/admin/nope")
        #expect(unknown.status == 404 && unknown.body.contains("no such admin endpoint"))
        let wrongMethod = try await admin(server, "POST", "/admin/export")
        #expect(wrongMethod.status == 405, "\(wrongMethod.body)")
        let badPath = try await admin(server, "POST", "/admin/reset?collection=a/b")
        #expect(badPath.status == 400 && badPath.body.contains("invalid-path"), "\(badPath.body)")
    }
}
