import Foundation
import Synchronization
import TandemClient
import TandemServer
import TandemTesting
import TandemWire
import Testing

/// The access setup of these tests: alice owns account A1 and bob is its member; carol is a
/// stranger to it. Members read and write the account's transactions; only the owner changes
/// the account itself.
enum AccessFixture {
    static let tokens = SampleAccess.tokens
    static let rules = SampleAccess.rules

    static func server() async throws -> TestServer {
        let access = try SampleAccess.control()
        return try await TestServer { $0.access = access }
    }

    /// The server with account A1 (owner alice, member bob) and one transaction T1 in it.
    static func seeded() async throws -> TestServer {
        let server = try await server()
        let alice = try await connect(server, token: "t-alice")
        defer { alice.close() }
        _ = try await alice.create("accounts", ["owner": "alice", "members": ["bob"]], id: "A1")
        _ = try await alice.create("accounts/A1/transactions", ["amount": 10], id: "T1")
        return server
    }

    static func connect(_ server: TestServer, token: String?) async throws -> ServerConnection {
        try await ServerConnection.connect(
            to: server.url, clientId: "c-\(UUID().uuidString.prefix(6))", token: token)
    }
}

@Suite("Access control: tokens and rules")
struct AccessTests {
    enum Actor: String, CaseIterable, CustomTestStringConvertible {
        case owner, member, stranger
        var token: String {
            switch self {
            case .owner: "t-alice"
            case .member: "t-bob"
            case .stranger: "t-carol"
            }
        }
        var allowed: Bool { self != .stranger }
        var testDescription: String { rawValue }
    }

    enum Operation: String, CaseIterable, CustomTestStringConvertible {
        case listen, get, create, update, delete
        var testDescription: String { rawValue }
    }

    @Test(
        "listen, get, create, update and delete of an account's transactions: owner and member may, a stranger may not",
        arguments: Actor.allCases, Operation.allCases)
    func matrix(actor: Actor, operation: Operation) async throws {
        let server = try await AccessFixture.seeded()
        let client = try await AccessFixture.connect(server, token: actor.token)
        defer { client.close() }
        let transactions = try CollectionPath("accounts/A1/transactions")
        let before = try await server.server.documents(in: transactions)

        let outcome: Result<Void, TandemError>
        do {
            switch operation {
            case .listen:
                let feed = Feed()
                client.listen(to: transactions, handler: feed.handler)
                try await waitUntil("the listen is answered") { feed.isCurrent || !feed.errors.isEmpty }
                if let error = feed.errors.first { throw TandemError(.server, error.message, serverError: error) }
                #expect(feed.changes.map(\.document.id.rawValue) == ["T1"])
            case .get:
                let document = try await client.get(transactions, try DocumentID("T1"))
                #expect(document?.fields["amount"] == 10)
            case .create:
                _ = try await client.create(transactions.rawValue, ["amount": 20], id: "T2")
            case .update:
                let reply = try await client.update(
                    transactions.rawValue, try DocumentID("T1"), ["amount": 11], base: 1)
                guard case .ack = reply else { throw TestFailure("update: \(reply)") }
            case .delete:
                let reply = try await client.delete(transactions.rawValue, try DocumentID("T1"))
                guard case .ack = reply else { throw TestFailure("delete: \(reply)") }
            }
            outcome = .success(())
        } catch let error as TandemError {
            outcome = .failure(error)
        }

        if actor.allowed {
            #expect(throws: Never.self) { try outcome.get() }
        } else {
            #expect(throws: TandemError.self) { try outcome.get() }
            if case .failure(let error) = outcome {
                #expect(error.serverError?.code == .permissionDenied, "\(error)")
                #expect(error.message.contains("user 'carol' may not"), "\(error.message)")
            }
            // Nothing was stored.
            #expect(try await server.server.documents(in: transactions) == before)
        }
    }

    @Test("without a token, or with one the server does not know, hello is refused with unauthenticated")
    func unauthenticated() async throws {
        let server = try await AccessFixture.seeded()
        for token in [nil, "", "t-mallory"] as [String?] {
            do {
                let connection = try await AccessFixture.connect(server, token: token)
                connection.close()
                Issue.record("token \(token ?? "nil") was accepted")
            } catch let error as TandemError {
                #expect(error.serverError?.code == .unauthenticated, "\(error)")
            }
        }
    }

    @Test("a batch with one forbidden op is refused whole: nothing of it is stored")
    func forbiddenOpRejectsTheBatch() async throws {
        let server = try await AccessFixture.seeded()
        let carol = try await AccessFixture.connect(server, token: "t-carol")
        defer { carol.close() }
        do {
            _ = try await carol.write([
                .create(in: try CollectionPath("users/carol/notes"), fields: ["text": "mine"], idempotencyKey: key()),
                .create(in: try CollectionPath("users/alice/notes"), fields: ["text": "hers"], idempotencyKey: key()),
            ])
            Issue.record("the batch was accepted")
        } catch let error as TandemError {
            #expect(error.serverError?.code == .permissionDenied)
            #expect(error.serverError?.op == 1)
        }
        #expect(try await server.server.documents(in: try CollectionPath("users/carol/notes")).isEmpty)
        #expect(try await server.server.documents(in: try CollectionPath("users/alice/notes")).isEmpty)
        // Her own note alone goes through.
        _ = try await carol.create("users/carol/notes", ["text": "mine"])
    }

    @Test("rules read the document being written: only the owner changes or deletes an account")
    func resourceAndRequest() async throws {
        let server = try await AccessFixture.seeded()
        let bob = try await AccessFixture.connect(server, token: "t-bob")
        defer { bob.close() }
        let a1 = try DocumentID("A1")
        await #expect(throws: TandemError.self) {
            _ = try await bob.update("accounts", a1, ["owner": "bob", "members": []], base: nil)
        }
        await #expect(throws: TandemError.self) { _ = try await bob.delete("accounts", a1) }
        // Nor can he create an account in someone else's name.
        await #expect(throws: TandemError.self) { _ = try await bob.create("accounts", ["owner": "alice"]) }
        _ = try await bob.create("accounts", ["owner": "bob", "members": []], id: "B1")
        #expect(
            try await server.server.document(in: try CollectionPath("accounts"), id: a1)?.fields["owner"] == "alice")
    }

    @Test("removing a member stops his live listener: he hears permission-denied and no later change")
    func revocationStopsListeners() async throws {
        let server = try await AccessFixture.seeded()
        let alice = try await AccessFixture.connect(server, token: "t-alice")
        let bob = try await AccessFixture.connect(server, token: "t-bob")
        defer {
            alice.close()
            bob.close()
        }
        let transactions = try CollectionPath("accounts/A1/transactions")
        let feed = Feed()
        bob.listen(to: transactions, handler: feed.handler)
        try await waitUntil("bob's listener is current") { feed.isCurrent }
        // A collection both may write and bob keeps reading: the marker that shows what bob
        // heard by when.
        _ = try await bob.create("accounts", ["owner": "bob", "members": ["alice"]], id: "B1")
        let markers = Feed()
        bob.listen(to: try CollectionPath("accounts/B1/transactions"), handler: markers.handler)
        try await waitUntil("bob's marker listener is current") { markers.isCurrent }

        _ = try await alice.create(transactions.rawValue, ["amount": 1], id: "T2")
        try await waitUntil("bob hears T2") { feed.changes.contains { $0.document.id.rawValue == "T2" } }

        // Alice removes bob, and in the same write adds a transaction: he must not hear it.
        let reply = try await alice.write([
            .update(
                in: try CollectionPath("accounts"), id: try DocumentID("A1"),
                fields: ["owner": "alice", "members": []], baseVersion: nil, idempotencyKey: key()),
            .create(in: transactions, id: try DocumentID("T3"), fields: ["amount": 2], idempotencyKey: key()),
        ])
        guard case .ack = reply else { throw TestFailure("\(reply)") }
        try await waitUntil("bob's listener is stopped") { !feed.errors.isEmpty }
        #expect(feed.errors.first?.code == .permissionDenied)
        #expect(feed.errors.first?.target == transactions.rawValue)

        _ = try await alice.create(transactions.rawValue, ["amount": 3], id: "T4")
        // Committed after T3 and T4: once bob has it, he would have had them.
        _ = try await alice.create("accounts/B1/transactions", ["marker": true], id: "M1")
        try await waitUntil("bob hears the marker") { markers.changes.contains { $0.document.id.rawValue == "M1" } }
        #expect(!feed.changes.contains { ["T3", "T4"].contains($0.document.id.rawValue) })
        #expect(await server.server.stats.listeners == 1, "only the marker listener is left")
        // And he cannot listen again.
        let again = Feed()
        bob.listen(to: transactions, target: "again", handler: again.handler)
        try await waitUntil("the new listen is answered") { !again.errors.isEmpty }
        #expect(again.errors.first?.code == .permissionDenied)
    }

    @Test("bad token and rules files are refused with what is wrong and where")
    func badFiles() {
        let cases: [(tokens: String?, rules: String?, message: String)] = [
            ("{", nil, "tokens.json: not JSON"),
            (#"{"alice": "t"}"#, nil, #"expected {"tokens""#),
            (#"{"tokens": {"t": 3}}"#, nil, "must be a non-empty string"),
            (nil, #"{"rules": [{"match": "a/b"}]}"#, "even number of segments"),
            (nil, #"{"rules": [{"match": "a", "reed": "true"}]}"#, "unknown key 'reed'"),
            (nil, #"{"rules": [{"match": "a", "read": "user =="}]}"#, "expected a value"),
            (nil, #"{"rules": [{"match": "a", "read": "user == {uid}"}]}"#, "uses {uid}, which a does not define"),
            (nil, #"{"rules": [{"match": "a", "read": "request.owner == user"}]}"#, "read cannot use request"),
            (nil, #"{"rules": [{"match": "a/{x}/b", "read": "user in doc(a).members"}]}"#, "needs a document path"),
            (nil, #"{"rules": [{"match": "a", "read": "(true"}]}"#, "expected ')'"),
        ]
        for (tokens, rules, message) in cases {
            do {
                _ = try AccessControl(
                    tokens: tokens.map { ($0, "tokens.json") }, rules: rules.map { ($0, "rules.json") })
                Issue.record("accepted: \(tokens ?? rules ?? "")")
            } catch {
                #expect(error.message.contains(message), "\(error.message)")
            }
        }
    }

    @Test("tandem serve --tokens --rules, and tandem put / get with --token or TANDEM_TOKEN")
    func commandLine() async throws {
        let folder = try TemporaryDirectory()
        let tokens = folder.url.appendingPathComponent("tokens.json")
        let rules = folder.url.appendingPathComponent("rules.json")
        try AccessFixture.tokens.write(to: tokens, atomically: true, encoding: .utf8)
        try AccessFixture.rules.write(to: rules, atomically: true, encoding: .utf8)
        let server = try await ServerProcess(
            dataDirectory: folder.url.appendingPathComponent("data"),
            options: ["--tokens", tokens.path, "--rules", rules.path])
        defer { server.send(SIGTERM) }

        let put = try await runTandem([
            "put", "users/alice/notes", #"{"text":"hi"}"#, "--server", server.url, "--token", "t-alice",
        ])
        #expect(put.status == 0, "\(put.error)")
        let denied = try await runTandem([
            "put", "users/alice/notes", #"{"text":"x"}"#, "--server", server.url, "--token", "t-bob",
        ])
        #expect(denied.status != 0)
        #expect(denied.error.contains("may not create in users/alice/notes"), "\(denied.error)")
        let anonymous = try await runTandem(["get", "users/alice/notes/x", "--server", server.url])
        #expect(anonymous.status != 0)
        #expect(anonymous.error.contains("--token TOKEN or set TANDEM_TOKEN"), "\(anonymous.error)")

        let badRules = folder.url.appendingPathComponent("bad.json")
        try #"{"rules": [{"match": "a", "read": "user ="}]}"#.write(to: badRules, atomically: true, encoding: .utf8)
        let refused = try await runTandem([
            "serve", "--port", "0", "--data", folder.path("data2"), "--rules", badRules.path,
        ])
        #expect(refused.status != 0)
        #expect(refused.error.contains("bad.json: rules[0].read"), "\(refused.error)")
    }
}

@Suite("Access is decided first: a refusal reveals nothing")
struct AccessFirstTests {
    /// Alice's note N1 (with a secret) and its tombstone twin N2, in her own notes, which bob
    /// may neither read nor write.
    static func aliceNotes() async throws -> TestServer {
        let server = try await AccessFixture.server()
        let alice = try await AccessFixture.connect(server, token: "t-alice")
        defer { alice.close() }
        _ = try await alice.create("users/alice/notes", ["secret": 1], id: "N1")
        _ = try await alice.create("users/alice/notes", ["secret": 2], id: "N2")
        _ = try await alice.delete("users/alice/notes", try DocumentID("N2"))
        return server
    }

    /// What bob hears for an op on alice's notes: the server's error, or the whole answer.
    static func answer(_ bob: ServerConnection, _ op: WriteOp) async -> String {
        do {
            let reply = try await bob.write([op])
            return "answered \(reply)"
        } catch let error as TandemError {
            return "\(error.serverError?.code.rawValue ?? "?"): \(error.serverError?.message ?? error.message)"
        } catch {
            return "\(error)"
        }
    }

    @Test(
        "a write bob may not make is permission-denied whether the document exists, is deleted or never was; no conflict, no not-found, no fields"
    )
    func refusalRevealsNothing() async throws {
        let server = try await Self.aliceNotes()
        let bob = try await AccessFixture.connect(server, token: "t-bob")
        defer { bob.close() }
        let notes = try CollectionPath("users/alice/notes")
        func id(_ name: String) throws -> DocumentID { try DocumentID(name) }
        let probes: [(String, [WriteOp])] = [
            (
                "create with a taken id",
                [
                    .create(in: notes, id: try id("N1"), fields: ["x": 1], idempotencyKey: key()),
                    .create(in: notes, id: try id("N2"), fields: ["x": 1], idempotencyKey: key()),
                    .create(in: notes, id: try id("N0"), fields: ["x": 1], idempotencyKey: key()),
                ]
            ),
            (
                "update with a stale base",
                [
                    .update(in: notes, id: try id("N1"), fields: ["x": 1], baseVersion: 7, idempotencyKey: key()),
                    .update(in: notes, id: try id("N2"), fields: ["x": 1], baseVersion: 7, idempotencyKey: key()),
                    .update(in: notes, id: try id("N0"), fields: ["x": 1], baseVersion: 7, idempotencyKey: key()),
                ]
            ),
            (
                "delete",
                [
                    .delete(in: notes, id: try id("N1"), baseVersion: nil, idempotencyKey: key()),
                    .delete(in: notes, id: try id("N2"), baseVersion: nil, idempotencyKey: key()),
                    .delete(in: notes, id: try id("N0"), baseVersion: nil, idempotencyKey: key()),
                ]
            ),
        ]
        for (name, ops) in probes {
            var answers: [String] = []
            for op in ops {
                answers.append(await Self.answer(bob, op).replacingOccurrences(of: op.id!.rawValue, with: "ID"))
            }
            // Existing, deleted and never-existing documents are answered alike.
            #expect(Set(answers).count == 1, "\(name): \(answers)")
            #expect(answers[0].hasPrefix("permission-denied: "), "\(name): \(answers[0])")
            #expect(!answers[0].contains("secret"), "\(name): \(answers[0])")
        }
        #expect(try await server.server.document(in: notes, id: try id("N1"))?.fields == ["secret": 1])
    }

    @Test("a get bob may not make is permission-denied whether the document exists or not")
    func getRevealsNothing() async throws {
        let server = try await Self.aliceNotes()
        let bob = try await AccessFixture.connect(server, token: "t-bob")
        defer { bob.close() }
        var answers: [String] = []
        for name in ["N1", "N2", "N0"] {
            do {
                _ = try await bob.get(try CollectionPath("users/alice/notes"), try DocumentID(name))
                answers.append("found")
            } catch let error as TandemError {
                answers.append("\(error.serverError?.code.rawValue ?? "?"): \(error.message)")
            }
        }
        #expect(Set(answers).count == 1, "\(answers)")
        #expect(answers[0].hasPrefix("permission-denied"), "\(answers[0])")
    }

    @Test(
        "an idempotency key belongs to the user who sent it: bob resending alice's client id and key gets no answer of hers"
    )
    func idempotencyKeysBelongToTheirUser() async throws {
        let server = try await AccessFixture.seeded()
        let transactions = try CollectionPath("accounts/A1/transactions")
        let shared = "device-\(UUID().uuidString.prefix(6))"
        let alice = try await ServerConnection.connect(to: server.url, clientId: shared, token: "t-alice")
        defer { alice.close() }
        // A field-level merge answers with the stored document.
        let mergeKey = key()
        let merge = WriteOp(
            kind: .update, collection: transactions, id: try DocumentID("T1"), fields: ["amount": 11],
            baseVersion: nil, idempotencyKey: mergeKey, fieldTimes: ["amount": 5])
        guard case .ack(let first) = try await alice.write([merge]) else { throw TestFailure("alice's merge") }
        #expect(first[0].document?.fields["amount"] == 11)
        let noteKey = key()
        let note = WriteOp.create(
            in: try CollectionPath("users/alice/notes"), fields: ["secret": "hers"], idempotencyKey: noteKey)
        guard case .ack(let aliceNote) = try await alice.write([note]) else { throw TestFailure("alice's note") }

        // Carol, a stranger to A1, under alice's client id and keys.
        let carol = try await ServerConnection.connect(to: server.url, clientId: shared, token: "t-carol")
        defer { carol.close() }
        let resent = await AccessFirstTests.answer(carol, merge)
        #expect(resent.hasPrefix("permission-denied"), "\(resent)")
        // Bob, a member of A1, under the same client id and key: a new op of his, not a replay.
        let bob = try await ServerConnection.connect(to: server.url, clientId: shared, token: "t-bob")
        defer { bob.close() }
        guard case .ack(let bobs) = try await bob.write([merge]) else { throw TestFailure("bob's merge") }
        #expect(bobs[0].version == first[0].version + 1, "applied again, as bob's own op")
        let stolen = await AccessFirstTests.answer(bob, note)
        #expect(stolen.hasPrefix("permission-denied"), "\(stolen)")
        #expect(!stolen.contains(aliceNote[0].id.rawValue))
        // Alice's own resend is still a replay.
        guard case .ack(let again) = try await alice.write([note]) else { throw TestFailure("alice's resend") }
        #expect(again == aliceNote)
    }

    @Test(
        "a resend whose document was deleted since gets its first answer when the rules would not let its user make the op now: it learns nothing of the delete"
    )
    func resendAfterDeleteUnderRules() async throws {
        let rules = #"""
            {"rules": [{"match": "items", "read": "resource.owner == user", "create": "request.owner == user",
                        "update": "resource.owner == user", "delete": "true"}]}
            """#
        let access = try AccessControl(tokens: (AccessFixture.tokens, "tokens.json"), rules: (rules, "rules.json"))
        let server = try await TestServer { $0.access = access }
        let alice = try await AccessFixture.connect(server, token: "t-alice")
        defer { alice.close() }
        let created = try await alice.create("items", ["owner": "alice", "t": "a"])
        let update = [
            WriteOp.update(
                in: try path("items"), id: created.id, fields: ["owner": "alice", "t": "b"], baseVersion: 1,
                idempotencyKey: key())
        ]
        guard case .ack(let first) = try await alice.write(update) else { throw TestFailure("refused") }
        let bob = try await AccessFixture.connect(server, token: "t-bob")
        defer { bob.close() }
        _ = try await bob.delete("items", created.id)
        let reply = try await alice.write(update)
        guard case .ack(let again) = reply else { throw TestFailure("expected the first answer: \(reply)") }
        #expect(again == first)
    }

    @Test(
        "an ack carries the document withheld, without its content, for a write whose result its user may not read, and nothing for one it may"
    )
    func unreadableResultsWithheld() async throws {
        let rules = #"""
            {"rules": [{"match": "items", "read": "resource.owner == user", "create": "true", "update": "true"},
                       {"match": "inbox", "create": "true"}, {"match": "open", "read": "true", "create": "true"}]}
            """#
        let access = try AccessControl(tokens: (AccessFixture.tokens, "tokens.json"), rules: (rules, "rules.json"))
        let server = try await TestServer { $0.access = access }
        let alice = try await AccessFixture.connect(server, token: "t-alice")
        defer { alice.close() }
        let ops = [
            WriteOp.create(in: try path("items"), fields: ["owner": "bob", "t": "x"], idempotencyKey: key()),
            .create(in: try path("inbox"), fields: ["t": "x"], idempotencyKey: key()),
            .create(in: try path("items"), fields: ["owner": "alice"], idempotencyKey: key()),
            .create(in: try path("open"), fields: ["t": "x"], idempotencyKey: key()),
        ]
        guard case .ack(let results) = try await alice.write(ops) else { throw TestFailure("refused") }
        for result in results.prefix(2) {
            let document = try #require(result.document)
            #expect(document.id == result.id && document.version == 1 && document.fields.isEmpty)
            #expect(document.createTime == 0 && document.updateTime == 0 && !document.deleted)
        }
        #expect(results.suffix(2).allSatisfy { $0.document == nil })
        // Taken out of her reach by an update: withheld too.
        let mine = results[2].id
        let reply = try await alice.write([
            .update(in: try path("items"), id: mine, fields: ["owner": "bob"], baseVersion: 1, idempotencyKey: key())
        ])
        guard case .ack(let given) = reply else { throw TestFailure("refused: \(reply)") }
        #expect(given[0].document.map { $0.fields.isEmpty && $0.version == 2 } == true)
    }

    @Test(
        "a user who may write but not read a collection gets a conflict without the document's content; a create proposing its id is refused"
    )
    func writeOnlyConflictsAreRedacted() async throws {
        let rules = #"""
            {"rules": [{"match": "inbox", "create": "true", "update": "true"},
                       {"match": "inbox", "read": "user == 'alice'"}]}
            """#
        let access = try AccessControl(tokens: (AccessFixture.tokens, "tokens.json"), rules: (rules, "rules.json"))
        let server = try await TestServer { $0.access = access }
        let alice = try await AccessFixture.connect(server, token: "t-alice")
        defer { alice.close() }
        _ = try await alice.create("inbox", ["letter": "private"], id: "L1")
        let bob = try await AccessFixture.connect(server, token: "t-bob")
        defer { bob.close() }
        let inbox = try CollectionPath("inbox")
        // A create that proposes the id learns nothing of the document, not even its version.
        let create = await AccessFirstTests.answer(
            bob, .create(in: inbox, id: try DocumentID("L1"), fields: ["x": 1], idempotencyKey: key()))
        #expect(create == "permission-denied: ops[0]: user 'bob' may not create in inbox", "\(create)")
        // An update, which bob may make, with a stale base: the conflict gives the version to
        // write on, without the content.
        let reply = try await bob.write([
            .update(in: inbox, id: try DocumentID("L1"), fields: ["x": 1], baseVersion: 7, idempotencyKey: key())
        ])
        guard case .conflict(_, let document) = reply else { throw TestFailure("expected a conflict: \(reply)") }
        #expect(document.id.rawValue == "L1")
        #expect(document.version == 1)
        #expect(document.fields.isEmpty)
        // Alice, who may read, sees it all.
        let hers = try await alice.write([
            .create(in: inbox, id: try DocumentID("L1"), fields: ["x": 1], idempotencyKey: key())
        ])
        guard case .conflict(_, let full) = hers else { throw TestFailure("expected a conflict: \(hers)") }
        #expect(full.fields == ["letter": "private"])
    }
}
