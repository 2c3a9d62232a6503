import Foundation
import TandemClient
import TandemServer
import TandemTesting
import TandemWire
import Testing

/// (kind, id, oldIndex, newIndex) of a change, for compact expectations.
private func positioned(_ change: Change) -> String {
    "\(change.kind) \(change.document.id) \(change.oldIndex ?? -9) \(change.newIndex ?? -9)"
}

private func query(_ json: String) throws -> Query {
    try Wire.decode(Query.self, from: Array(json.utf8))
}

@Suite("Listeners on queries: filters, order, limit and positioned changes")
struct QueryTests {
    @Test("values compare in one total order across JSON types")
    func totalOrder() {
        let ascending: [JSONValue] = [
            nil, false, true, -1, 0.5, 1, 2.5, "", "a", "b", "é", [], [1], [1, 2], [2], [:], ["a": 1], ["a": 2],
            ["b": 0],
        ]
        for (i, a) in ascending.enumerated() {
            for (j, b) in ascending.enumerated() {
                let order = JSONValue.queryOrder(a, b)
                #expect(order.signum() == (i == j ? 0 : (i < j ? -1 : 1)), "\(a) vs \(b)")
            }
        }
        #expect(JSONValue.queryOrder(1, 1.0) == 0)
        // Strings by their bytes: canonically equivalent spellings are different values.
        #expect(JSONValue.queryOrder("e\u{301}", "\u{e9}") == -1)
        // Integers and decimals by exact value, beyond what a Double holds.
        #expect(JSONValue.queryOrder(9_007_199_254_740_993, 9_007_199_254_740_992.0) == 1)
        #expect(JSONValue.queryOrder(.int(.max), 9_223_372_036_854_775_807.0) == -1)
        #expect(JSONValue.queryOrder(-3, -2.5) == -1)
        #expect(JSONValue.queryOrder(-2.5, -3) == 1)
    }

    @Test(
        "filters match as documented; a missing field matches no filter, not even != and not-in",
        arguments: [
            (#"{"field":"n","op":"==","value":1}"#, [true, false, false, false]),
            (#"{"field":"n","op":"!=","value":1}"#, [false, true, true, false]),
            (#"{"field":"n","op":"<","value":2}"#, [true, false, false, false]),
            (#"{"field":"n","op":">=","value":2}"#, [false, true, true, false]),
            (#"{"field":"n","op":"in","value":[1,"x"]}"#, [true, false, true, false]),
            (#"{"field":"n","op":"not-in","value":[1]}"#, [false, true, true, false]),
            (#"{"field":"tags","op":"array-contains","value":"a"}"#, [true, false, false, false]),
            (#"{"field":"tags","op":"array-contains-any","value":["b","z"]}"#, [true, true, false, false]),
            (#"{"field":"address.city","op":"==","value":"Oslo"}"#, [false, true, false, false]),
        ])
    func filters(clause: String, expected: [Bool]) throws {
        let documents: [JSONObject] = [
            ["n": 1, "tags": ["a", "b"]],
            ["n": 2, "tags": ["b"], "address": ["city": "Oslo"]],
            ["n": "x", "address": "Oslo"],
            ["other": true],
        ]
        let filter = try query(#"{"where":[\#(clause)]}"#)
        #expect(documents.map(filter.matches) == expected)
    }

    @Test("in takes any number of values")
    func manyValues() throws {
        let values = (0..<2000).map { JSONValue.string("member-\($0)") }
        let filter = Query(filters: [.init(try FieldPath("owner"), .in, .array(values))])
        #expect(filter.matches(["owner": "member-1999"]))
        #expect(!filter.matches(["owner": "member-2000"]))
    }

    @Test("a query listener sees the matching documents in order, cut at the limit, and how each commit moves them")
    func liveView() async throws {
        let server = try await TestServer()
        let writer = try await connect(server)
        func account(_ members: [String], _ rank: Int) async throws -> DocumentID {
            try await writer.create(
                "accounts", ["members": .array(members.map { .string($0) }), "rank": .int(Int64(rank))]
            ).id
        }
        let r3 = try await account(["alice", "bob"], 3)
        _ = try await account(["bob"], 1)
        let r2 = try await account(["alice"], 2)
        let r5 = try await account(["alice"], 5)

        let reader = try await connect(server)
        let feed = Feed()
        reader.listen(
            to: try path("accounts"),
            query: try query(
                #"{"where":[{"field":"members","op":"array-contains","value":"alice"}],"orderBy":[{"field":"rank","direction":"desc"}],"limit":2}"#
            ), handler: feed.handler)
        try await waitUntil("the first snapshot") { feed.isCurrent }
        #expect(feed.changes.map(positioned) == ["added \(r5) -1 0", "added \(r3) -1 1"])

        // r2 jumps to the top: r3 is pushed out by the limit, though it still matches.
        _ = try await writer.update("accounts", r2, ["members": ["alice"], "rank": 9], base: 1)
        try await waitUntil("r2 enters") { feed.changes.count == 4 }
        #expect(feed.changes.suffix(2).map(positioned) == ["removed \(r3) 1 -1", "added \(r2) -1 0"])
        #expect(feed.changes[2].document.deleted == false)

        // r5 stops matching: it leaves, and r3 comes back.
        _ = try await writer.update("accounts", r5, ["members": ["bob"], "rank": 5], base: 1)
        try await waitUntil("r5 leaves") { feed.changes.count == 6 }
        #expect(feed.changes.suffix(2).map(positioned) == ["removed \(r5) 1 -1", "added \(r3) -1 1"])

        // A deleted document is removed, marked deleted.
        _ = try await writer.delete("accounts", r2, base: 2)
        try await waitUntil("r2 goes") { feed.changes.count == 7 }
        #expect(feed.changes.last.map(positioned) == "removed \(r2) 0 -1")
        #expect(feed.changes.last?.document.deleted == true)

        // A modification that moves: r3 up past a newcomer.
        let r4 = try await account(["alice"], 4)
        try await waitUntil("r4 enters") { feed.changes.count == 8 }
        _ = try await writer.update("accounts", r3, ["members": ["alice"], "rank": 10], base: 1)
        try await waitUntil("r3 moves") { feed.changes.count == 9 }
        #expect(feed.changes.suffix(2).map(positioned) == ["added \(r4) -1 0", "modified \(r3) 1 0"])
    }

    @Test("one commit's changes come as removals, additions, modifications, each index in the view as it stands then")
    func docChangesOrder() async throws {
        let server = try await TestServer()
        let writer = try await connect(server)
        var ids: [String: DocumentID] = [:]
        for (name, rank) in [("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 4.0)] {
            ids[name] = try await writer.create("items", ["rank": .double(rank)], id: name).id
        }
        let reader = try await connect(server)
        let feed = Feed()
        reader.listen(
            to: try path("items"), query: try query(#"{"orderBy":[{"field":"rank"}],"limit":3}"#), handler: feed.handler
        )
        try await waitUntil("the first snapshot") { feed.isCurrent }
        #expect(feed.changes.map(positioned) == ["added a -1 0", "added b -1 1", "added c -1 2"])

        // In one write: a moves from 1 to 2.5, b is deleted, e arrives at 0.
        let items = try path("items")
        let reply = try await writer.write([
            .update(in: items, id: try DocumentID("a"), fields: ["rank": 2.5], baseVersion: 1, idempotencyKey: key()),
            .delete(in: items, id: try DocumentID("b"), baseVersion: 1, idempotencyKey: key()),
            .create(in: items, id: try DocumentID("e"), fields: ["rank": 0], idempotencyKey: key()),
        ])
        guard case .ack = reply else { throw TestFailure("the write was refused: \(reply)") }
        try await waitUntil("one snapshot with the three changes") { feed.changes.count == 6 }
        #expect(feed.snapshots.count == 2)
        #expect(feed.changes.suffix(3).map(positioned) == ["removed b 1 -1", "added e -1 0", "modified a 1 1"])
        _ = ids
    }

    @Test("a reset through the admin API empties a query listener's view; what comes after reaches it")
    func resetView() async throws {
        let server = try await TestServer()
        let writer = try await connect(server)
        _ = try await writer.create("notes", ["n": 1])
        let reader = try await connect(server)
        let feed = Feed()
        reader.listen(to: try path("notes"), query: try query(#"{"orderBy":[{"field":"n"}]}"#), handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }
        #expect(try await server.server.reset(collection: path("notes")) == 1)
        try await waitUntil("the reset and the empty view") {
            feed.resets.count == 1 && feed.snapshots.last.map { $0.initial && $0.changes.isEmpty } == true
        }
        let b = try await writer.create("notes", ["n": 2])
        try await waitUntil("the new document") { feed.changes.last.map(positioned) == "added \(b.id) -1 0" }
    }

    @Test("a first view larger than a connection's send queue arrives whole, frame by frame as the client reads")
    func largeView() async throws {
        // Frames of 64 KiB and a send queue of 256 KiB: the 1.5 MB view overflows the queue
        // unless the frames wait for it to drain.
        let server = try await TestServer { configuration in
            configuration.snapshotPageBytes = 64 << 10
            configuration.maxQueuedBytesPerConnection = 256 << 10
        }
        let writer = try await connect(server)
        let blob = String(repeating: "x", count: 1000)
        for start in stride(from: 0, to: 1500, by: 100) {
            let ops = (start..<start + 100).map { n in
                WriteOp.create(
                    in: try! CollectionPath("big"), fields: ["n": .int(Int64(n)), "blob": .string(blob)],
                    idempotencyKey: key())
            }
            guard case .ack = try await writer.write(ops) else { throw TestFailure("a write was refused") }
        }
        let reader = try await connect(server)
        let feed = Feed()
        reader.listen(
            to: try path("big"),
            query: try query(#"{"where":[{"field":"n","op":">=","value":0}],"orderBy":[{"field":"n"}]}"#),
            handler: feed.handler)
        try await waitUntil("the whole view", timeout: .seconds(120)) { feed.isCurrent }
        #expect(feed.changes.count == 1500)
        #expect(feed.changes.map(\.newIndex) == Array(0..<1500))
        #expect(feed.snapshots.count > 1 && feed.snapshots.dropLast().allSatisfy(\.hasMore))
        // Frames before the last carry where the listener was before (here, nothing): a client
        // cut off between frames resumes from there, not past changes it never got.
        let last = try #require(feed.snapshots.last?.resumeToken)
        #expect(feed.snapshots.dropLast().allSatisfy { $0.resumeToken != last && $0.resumeToken.hasSuffix(".0") })
        #expect(reader.isOpen)
    }

    @Test("a query listener that resumes gets a reset and its whole view")
    func resume() async throws {
        let server = try await TestServer()
        let writer = try await connect(server)
        let a = try await writer.create("notes", ["pinned": true])
        _ = try await writer.create("notes", ["pinned": false])
        let pinned = try query(#"{"where":[{"field":"pinned","op":"==","value":true}]}"#)
        let first = try await connect(server)
        let feed = Feed()
        first.listen(to: try path("notes"), query: pinned, handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }
        let token = try #require(feed.lastToken)
        first.close()

        let again = try await connect(server)
        let resumed = Feed()
        again.listen(to: try path("notes"), resumeToken: token, query: pinned, handler: resumed.handler)
        try await waitUntil("reset and current") { resumed.resets.count == 1 && resumed.isCurrent }
        #expect(resumed.changes.map(positioned) == ["added \(a.id) -1 0"])
    }
}

extension QueryTests {
    @Test(
        "a document of the view gone altogether (its tombstone purged) is removed on resume as a tombstone of version 0"
    )
    func resumeAfterPurge() async throws {
        let clock = ManualServerClock()
        let server = try await TestServer { configuration in
            configuration.clock = clock.read
            configuration.tombstoneRetention = .seconds(1)
        }
        let writer = try await connect(server)
        let a = try await writer.create("notes", ["n": 1])
        let b = try await writer.create("notes", ["n": 2])
        let all = try query("{}")
        let first = try await connect(server)
        let feed = Feed()
        first.listen(to: try path("notes"), query: all, handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }
        let token = try #require(feed.lastToken)
        first.close()
        _ = try await writer.delete("notes", a.id)
        clock.advance(by: 10_000)
        #expect(await server.server.purgeExpired().tombstones == 1)

        let again = try await connect(server)
        let resumed = Feed()
        again.listen(
            to: try path("notes"), resumeToken: token, query: all, view: [a.id, b.id], handler: resumed.handler)
        try await waitUntil("current") { resumed.isCurrent }
        #expect(resumed.resets.isEmpty)
        let removed = try #require(resumed.changes.first { $0.document.id == a.id })
        #expect(removed.kind == .removed)
        #expect(removed.document.deleted && removed.document.version == 0 && removed.document.fields.isEmpty)
    }
}

/// Malformed queries as raw frames (plain TCP, so not in the TLS pass, like BadInputTests).
@Suite("Listeners on queries: malformed queries")
struct QueryBadInputTests {
    @Test(
        "a malformed query is refused, naming what is wrong",
        arguments: [
            (#"{"where":[{"field":"a","op":"~","value":1}]}"#, "query.where[0].op: unknown operator '~'"),
            (#"{"where":[{"field":"a","op":"in","value":1}]}"#, "query.where[0].value: 'in' takes a non-empty array"),
            (#"{"where":[{"field":"a..b","op":"==","value":1}]}"#, "query.where[0].field: 'a..b' is not a field path"),
            (#"{"orderBy":[{"field":"a","direction":"up"}]}"#, "query.orderBy[0].direction: expected asc or desc"),
            (#"{"limit":0}"#, "query.limit: expected 1 or more, not 0"),
        ])
    func badQueries(json: String, expected: String) async throws {
        let server = try await TestServer()
        let raw = try await welcomedRawSocket(on: server, as: "q")
        try raw.send(text: #"{"type":"listen","target":"t","collection":"c","query":\#(json)}"#)
        let answer = try await raw.readText()
        #expect(answer.contains(#""code":"bad-message""#) && answer.contains(expected), "\(answer)")
    }

    @Test(
        "a malformed view is refused with its target, naming what is wrong, and leaves no listener behind",
        arguments: [
            (#""query":{},"view":["a"]"#, "view: only a query listener that resumes"),
            (#""resumeToken":"x.1","view":["a"]"#, "view: only a query listener that resumes"),
            (#""query":{},"resumeToken":"x.1","view":["a","a"]"#, "view[1]: 'a' appears twice"),
            (
                #""query":{"limit":1},"resumeToken":"x.1","view":["a","b"]"#,
                "view: 2 ids, more than the query's limit of 1"
            ),
            (#""query":{},"resumeToken":"x.1","view":[7]"#, "view[0]"),
            (#""query":{},"resumeToken":"x.1","view":"a""#, "view: expected an array"),
        ])
    func badViews(members: String, expected: String) async throws {
        let server = try await TestServer()
        let raw = try await welcomedRawSocket(on: server, as: "q")
        try raw.send(text: #"{"type":"listen","target":"t","collection":"c",\#(members)}"#)
        let answer = try await raw.readText()
        #expect(answer.contains(#""code":"bad-message""#) && answer.contains(expected), "\(answer)")
        #expect(answer.contains(#""target":"t""#), "\(answer)")
        // The target is free: a good listen on it is answered with a snapshot.
        try raw.send(text: #"{"type":"listen","target":"t","collection":"c","query":{}}"#)
        #expect(try await raw.readText().contains(#""type":"snapshot""#))
    }
}
