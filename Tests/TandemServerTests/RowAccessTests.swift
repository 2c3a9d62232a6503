import Foundation
import Synchronization
import TandemClient
import TandemServer
import TandemTesting
import TandemWire
import Testing

/// Read rules that look at each document (`resource.…`): the shared-account app of the seeds,
/// where every user listens to "the accounts where I am a member" in one `accounts` collection.
@Suite("Row-level read rules")
struct RowAccessTests {
    static let tokens = #"{"tokens": {"t-alice": "alice", "t-bob": "bob", "t-carol": "carol"}}"#
    static let rules = #"""
        {"rules": [
          {"match": "accounts", "read": "user in resource.members",
           "create": "user in request.members", "update": "user in resource.members",
           "delete": "user in resource.members"},
          {"match": "accounts/{account}/transactions",
           "read": "user in doc(accounts/{account}).members", "write": "user in doc(accounts/{account}).members"},
          {"match": "notes", "read": "resource.owner == user || user in doc(teams/t1).members",
           "write": true},
          {"match": "teams", "write": true}
        ]}
        """#

    static func server() async throws -> TestServer {
        let access = try AccessControl(tokens: (tokens, "tokens.json"), rules: (rules, "rules.json"))
        return try await TestServer { $0.access = access }
    }

    static func session(_ server: TestServer, _ user: String) async throws -> ServerConnection {
        try await ServerConnection.connect(
            to: server.url, clientId: "\(user)-\(UUID().uuidString.prefix(6))", token: "t-\(user)",
            timeout: .seconds(60))
    }

    static func members(_ users: [String]) -> JSONObject { ["members": .array(users.map { .string($0) })] }

    /// One user's listeners: the accounts where the user is a member (a query on `members`),
    /// every account the user may read (the empty query), and the transactions of each account.
    final class Device: Sendable {
        let user: String
        let connection: ServerConnection
        let mine = Feed()
        let readable = Feed()
        private let transactionFeeds = Mutex<[String: Feed]>([:])

        init(_ server: TestServer, _ user: String) async throws {
            self.user = user
            connection = try await RowAccessTests.session(server, user)
            let accounts = try CollectionPath("accounts")
            connection.listen(
                to: accounts, target: "mine",
                query: Query(filters: [.init(try FieldPath("members"), .arrayContains, .string(user))]),
                handler: mine.handler)
            connection.listen(to: accounts, target: "readable", query: Query(), handler: readable.handler)
        }

        /// Listens to an account's transactions (once).
        func follow(_ account: String) throws {
            let feed = Feed()
            guard transactionFeeds.withLock({ $0[account] == nil ? ($0[account] = feed) == () : false }) else { return }
            connection.listen(
                to: try CollectionPath("accounts/\(account)/transactions"), target: "t-\(account)",
                handler: feed.handler)
        }

        func transactions(_ account: String) -> Feed? { transactionFeeds.withLock { $0[account] } }
    }

    /// The ids a query listener's client holds, by applying its positioned changes.
    static func view(_ feed: Feed) -> [DocumentID] {
        var list: [DocumentID] = []
        for change in feed.changes {
            if let old = change.oldIndex, old >= 0 { list.remove(at: old) }
            if let new = change.newIndex, new >= 0 { list.insert(change.document.id, at: new) }
        }
        return list
    }

    /// The live documents a collection listener's client holds.
    static func documents(_ feed: Feed) -> Set<DocumentID> {
        var held: Set<DocumentID> = []
        for change in feed.changes {
            if change.kind == .deleted { held.remove(change.document.id) } else { held.insert(change.document.id) }
        }
        return held
    }

    @Test(
        "three users share accounts in one collection: each device holds exactly the accounts and transactions its user may read, at every quiet point"
    )
    func sharedAccounts() async throws {
        let server = try await Self.server()
        let users = ["alice", "bob", "carol"]
        var devices: [String: Device] = [:]
        for user in users { devices[user] = try await Device(server, user) }
        // The model: the members of each account, and its transactions.
        var accountMembers: [String: [String]] = [:]
        var transactions: [String: Set<DocumentID>] = [:]

        func quietPoint(_ moment: String) async throws {
            for user in users {
                let device = devices[user]!
                let expected = Set(accountMembers.filter { $0.value.contains(user) }.keys)
                for account in expected { try device.follow(account) }
                try await waitUntil("\(moment): \(user)'s accounts are \(expected.sorted())") {
                    Set(Self.view(device.mine).map(\.rawValue)) == expected
                        && Set(Self.view(device.readable).map(\.rawValue)) == expected
                }
                for account in expected {
                    let feed = try #require(device.transactions(account))
                    let want = transactions[account] ?? []
                    try await waitUntil("\(moment): \(user) holds the transactions of \(account)") {
                        feed.errors.isEmpty && Self.documents(feed) == want
                    }
                }
                // An account the user left: its transactions listener was stopped, refused.
                for account in accountMembers.keys where !expected.contains(account) {
                    guard let feed = device.transactions(account) else { continue }
                    try await waitUntil("\(moment): \(user)'s listener on \(account) was stopped") {
                        feed.errors.map(\.code) == [.permissionDenied]
                    }
                }
                // Whatever the removed account's fields, a removal says nothing of them.
                for change in device.mine.changes + device.readable.changes where change.kind == .removed {
                    if let members = accountMembers[change.document.id.rawValue], !members.contains(user) {
                        #expect(change.document.fields.isEmpty && change.document.version == 0, "\(moment)")
                    }
                }
            }
        }

        let alice = devices["alice"]!.connection
        let bob = devices["bob"]!.connection
        _ = try await alice.create("accounts", Self.members(["alice", "bob"]), id: "A1")
        _ = try await alice.create("accounts", Self.members(["alice"]), id: "A2")
        _ = try await bob.create("accounts", Self.members(["bob", "carol"]), id: "B1")
        (accountMembers["A1"], accountMembers["A2"], accountMembers["B1"]) = (
            ["alice", "bob"], ["alice"], ["bob", "carol"]
        )
        try await quietPoint("three accounts")

        for (writer, account, amount) in [(alice, "A1", 10), (bob, "A1", -3), (alice, "A2", 7), (bob, "B1", 1)] {
            let id = try await writer.create("accounts/\(account)/transactions", ["amount": .int(Int64(amount))]).id
            transactions[account, default: []].insert(id)
        }
        try await quietPoint("four transactions")

        // Alice takes bob out of A1: it leaves his views, his transactions listener on A1 is
        // stopped, and a get of it is refused as for an account that does not exist.
        _ = try await alice.update("accounts", try DocumentID("A1"), Self.members(["alice"]), base: 1)
        accountMembers["A1"] = ["alice"]
        try await quietPoint("bob removed from A1")
        var answers: [String] = []
        for id in ["A1", "NO-SUCH-ACCOUNT"] {
            do {
                _ = try await bob.get(try CollectionPath("accounts"), try DocumentID(id))
                answers.append("read \(id)")
            } catch let error as TandemError {
                answers.append("\(error.serverError?.code.rawValue ?? "?"): \(error.message)")
            }
        }
        #expect(answers[0] == answers[1] && answers[0].hasPrefix("permission-denied"), "\(answers)")
        #expect(try await alice.get(try CollectionPath("accounts"), try DocumentID("A1"))?.id.rawValue == "A1")
        // Nor does a create that proposes its id learn anything of it (no conflict answer with
        // its version): it is refused as a create the rules refuse.
        var creates: [String] = []
        for (id, members) in [("A1", ["bob"]), ("B9", ["alice"])] {
            do {
                _ = try await bob.create("accounts", Self.members(members), id: id)
                creates.append("created \(id)")
            } catch let error as TandemError {
                creates.append("\(error.serverError?.code.rawValue ?? error.code.rawValue): \(error.message)")
            }
        }
        #expect(creates[0] == creates[1] && creates[0].hasPrefix("permission-denied"), "\(creates)")

        // Alice brings carol into A2: it arrives in carol's views, and she may read its
        // transactions from then on.
        _ = try await alice.update("accounts", try DocumentID("A2"), Self.members(["alice", "carol"]), base: 1)
        accountMembers["A2"] = ["alice", "carol"]
        try await quietPoint("carol added to A2")

        // Bob leaves B1 himself, and carol deletes it.
        _ = try await bob.update("accounts", try DocumentID("B1"), Self.members(["carol"]), base: 1)
        accountMembers["B1"] = ["carol"]
        try await quietPoint("bob left B1")
        let carol = devices["carol"]!.connection
        _ = try await carol.delete("accounts", try DocumentID("B1"), base: 2)
        accountMembers["B1"] = nil
        try await quietPoint("B1 deleted")
        #expect(devices["carol"]!.mine.changes.last.map { $0.kind == .removed && $0.document.deleted } == true)
    }

    @Test("a listener on the whole collection is refused when the read rule looks at each document, and told why")
    func wholeCollectionRefused() async throws {
        let server = try await Self.server()
        let bob = try await Self.session(server, "bob")
        let feed = Feed()
        bob.listen(to: try CollectionPath("accounts"), handler: feed.handler)
        try await waitUntil("refused") { !feed.errors.isEmpty }
        #expect(feed.errors.map(\.code) == [.permissionDenied])
        #expect(feed.errors[0].message.contains("listen with a query"), "\(feed.errors[0].message)")
    }

    @Test(
        "when a document the rule reads with doc(…) changes, every query view on the collection is read again: documents come and go"
    )
    func viewsFollowDependencies() async throws {
        let server = try await Self.server()
        let alice = try await Self.session(server, "alice")
        let bob = try await Self.session(server, "bob")
        _ = try await alice.create("teams", ["members": []], id: "t1")
        let a = try await alice.create("notes", ["owner": "alice", "n": 1]).id
        let b = try await bob.create("notes", ["owner": "bob", "n": 2]).id
        let c = try await alice.create("notes", ["owner": "alice", "n": 3]).id
        let feed = Feed()
        bob.listen(
            to: try CollectionPath("notes"), query: Query(orderBy: [.init(try FieldPath("n"))]), handler: feed.handler)
        try await waitUntil("bob sees his own note") { feed.isCurrent }
        #expect(Self.view(feed) == [b])

        // Bob joins the team: alice's notes come into his view, in order.
        _ = try await alice.update("teams", try DocumentID("t1"), ["members": ["bob"]], base: 1)
        try await waitUntil("alice's notes arrive") { Self.view(feed) == [a, b, c] }
        #expect(
            feed.changes.suffix(2).map { "\($0.kind) \($0.document.id) \($0.oldIndex!) \($0.newIndex!)" } == [
                "added \(a) -1 0", "added \(c) -1 2",
            ])

        // He leaves it: they go, withheld.
        _ = try await alice.update("teams", try DocumentID("t1"), ["members": []], base: 2)
        try await waitUntil("alice's notes leave") { Self.view(feed) == [b] }
        #expect(feed.changes.suffix(2).allSatisfy { $0.kind == .removed && $0.document.fields.isEmpty })
        #expect(feed.errors.isEmpty)
    }

    @Test(
        "a query listener that resumes with its view gets exactly what changed in it: what left, what came, what moved"
    )
    func exactResume() async throws {
        let server = try await TestServer()
        let writer = try await connect(server)
        var ids: [String: DocumentID] = [:]
        for (name, rank) in [("a", 1), ("b", 2), ("c", 3), ("d", 4), ("e", 5)] {
            ids[name] = try await writer.create("items", ["rank": .int(Int64(rank))], id: name).id
        }
        let query = Query(orderBy: [.init(try FieldPath("rank"))], limit: 3)
        let first = try await connect(server)
        let feed = Feed()
        first.listen(to: try CollectionPath("items"), query: query, handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }
        #expect(Self.view(feed).map(\.rawValue) == ["a", "b", "c"])
        let token = try #require(feed.lastToken)
        first.close()

        // While it is away: b is deleted, c moves to the top, e leaves the collection's
        // order (its rank goes), and f arrives in second place.
        _ = try await writer.delete("items", ids["b"]!, base: 1)
        _ = try await writer.update("items", ids["c"]!, ["rank": 0], base: 1)
        _ = try await writer.update("items", ids["e"]!, ["other": true], base: 1)
        _ = try await writer.create("items", ["rank": 0.5], id: "f")

        let again = try await connect(server)
        let resumed = Feed()
        again.listen(
            to: try CollectionPath("items"), resumeToken: token, query: query, view: Self.view(feed),
            handler: resumed.handler)
        try await waitUntil("current") { resumed.isCurrent }
        #expect(resumed.resets.isEmpty)
        var list = Self.view(feed)
        for change in resumed.changes {
            if let old = change.oldIndex, old >= 0 { list.remove(at: old) }
            if let new = change.newIndex, new >= 0 { list.insert(change.document.id, at: new) }
        }
        #expect(list.map(\.rawValue) == ["c", "f", "a"])
        #expect(
            resumed.changes.map { "\($0.kind) \($0.document.id) \($0.oldIndex!) \($0.newIndex!)" } == [
                "removed b 1 -1", "added f -1 0", "modified c 2 0",
            ])
        #expect(resumed.changes[0].document.deleted)
    }
}
