import Foundation
import GRDB
@_spi(Testing) import Tandem
import TandemServer
import TandemTesting
import TandemWire
import Synchronization
import Testing

/// The shared-account app of the seeds, end to end: three users' devices, each syncing only the
/// accounts that list its user (`SyncTable.where("members", arrayContains: .currentUser)`) and
/// their entries, against a server whose read rules look at each account.
@Suite("Shared accounts: devices scoped to their user")
struct SharedAccountTests {
    typealias Account = SharedAccounts.Account

    /// What a device holds: account name → the titles of its entries.
    static func holdings(_ device: TestDevice) throws -> [String: Set<String>] {
        try device.database.read { db in
            var result: [String: Set<String>] = [:]
            for account in try Account.fetchAll(db) {
                let titles = try String.fetchAll(
                    db, sql: "SELECT title FROM entry WHERE accountId = ?", arguments: [account.id])
                result[account.name] = Set(titles)
            }
            return result
        }
    }

    @Test(
        "three users: each device holds exactly the accounts and entries its user may read, as members are added and removed"
    )
    func scopedDevices() async throws {
        let access = try SharedAccounts.access()
        let server = try await TestServer { $0.access = access }
        var devices: [String: TestDevice] = [:]
        for user in ["alice", "bob", "carol"] {
            let device = try TestDevice(name: user, serverURL: server.url, model: .sharedAccounts) {
                $0.token = "t-\(user)"
            }
            device.service.start()
            devices[user] = device
        }
        defer { for device in devices.values { Task { await device.service.stop() } } }

        // The model: each account's members and entries.
        var members: [String: [String]] = [:]
        var entries: [String: Set<String>] = [:]
        func quietPoint(_ moment: String) async throws {
            for (user, device) in devices {
                let expected = Dictionary(
                    uniqueKeysWithValues: members.filter { $0.value.contains(user) }.map {
                        ($0.key, entries[$0.key] ?? [])
                    })
                try await waitUntil("\(moment): \(user) holds \(expected)") { try Self.holdings(device) == expected }
            }
        }
        func create(_ name: String, by user: String, members list: [String], entries titles: [String]) throws {
            let device = devices[user]!
            try device.database.write { db in
                var account = Account(name: name, members: list)
                try account.insert(db)
                for (index, title) in titles.enumerated() {
                    var entry = CashFlow.Entry(accountId: account.id!, title: title, amount: Int64(-10 * (index + 1)))
                    try entry.insert(db)
                }
            }
            members[name] = list
            entries[name] = Set(titles)
        }
        func addEntry(_ title: String, to name: String, by user: String) async throws {
            try await devices[user]!.database.write { db in
                let account = try Int64.fetchOne(db, sql: "SELECT id FROM account WHERE name = ?", arguments: [name])!
                var entry = CashFlow.Entry(accountId: account, title: title, amount: -25)
                try entry.insert(db)
            }
            entries[name]!.insert(title)
        }
        func setMembers(_ name: String, by user: String, to list: [String]) throws {
            try devices[user]!.database.write { db in
                try db.execute(
                    sql: "UPDATE account SET members = ? WHERE name = ?", arguments: [Account.encode(list), name])
            }
            members[name] = list
        }

        try create("Home", by: "alice", members: ["alice", "bob"], entries: ["Rent", "Food"])
        try create("Private", by: "alice", members: ["alice"], entries: ["Savings"])
        try create("Trip", by: "bob", members: ["bob", "carol"], entries: ["Tickets"])
        try await quietPoint("three accounts")

        // Bob adds an entry to Home: alice gets it; carol never hears of Home.
        try await addEntry("Gas", to: "Home", by: "bob")
        // And in Trip an entry linked to Home's rent (a reference across accounts).
        try await devices["bob"]!.database.write { db in
            let trip = try Int64.fetchOne(db, sql: "SELECT id FROM account WHERE name = 'Trip'")!
            let rent = try Int64.fetchOne(db, sql: "SELECT id FROM entry WHERE title = 'Rent'")!
            var entry = CashFlow.Entry(accountId: trip, title: "Share of rent", amount: -5, linkedEntryId: rent)
            try entry.insert(db)
        }
        entries["Trip"]!.insert("Share of rent")
        try await quietPoint("bob's entry in Home")

        // Alice takes bob out of Home: it leaves his device with its entries, and nothing of
        // it is deleted on the server.
        try setMembers("Home", by: "alice", to: ["alice"])
        try await quietPoint("bob removed from Home")
        let home = try #require(try await serverDocuments(server, "accounts").first { $0.fields["name"] == "Home" })
        let homeEntries = try await serverDocuments(server, "accounts/\(home.id)/entries")
        #expect(Set(homeEntries.map { $0.fields["title"] }) == ["Rent", "Food", "Gas"])
        // The link from Trip to Home's rent is kept on the server, though bob's device no
        // longer holds the rent.
        let rent = try #require(homeEntries.first { $0.fields["title"] == "Rent" })
        let trip = try #require(try await serverDocuments(server, "accounts").first { $0.fields["name"] == "Trip" })
        let share = try await #require(
            try serverDocuments(server, "accounts/\(trip.id)/entries").first { $0.fields["title"] == "Share of rent" })
        #expect(share.fields["linkedEntryId"] == .string(rent.id.rawValue))
        #expect(
            try await devices["bob"]!.database.read { db in
                try Bool.fetchOne(db, sql: "SELECT isDirty FROM entry WHERE title = 'Share of rent'")
            } == false)

        // Alice brings carol into Private: it arrives on her device, entries and all.
        try setMembers("Private", by: "alice", to: ["alice", "carol"])
        try await quietPoint("carol added to Private")

        // Carol adds an entry to Private, and leaves Trip herself.
        try await addEntry("Gift", to: "Private", by: "carol")
        try setMembers("Trip", by: "carol", to: ["bob"])
        try await quietPoint("carol's entry, carol left Trip")

        // A device that restarts resumes its scoped listener with the ids it holds, and
        // catches up with what changed while it was away: bob back in Home.
        await devices["bob"]!.service.stop()
        try setMembers("Home", by: "alice", to: ["alice", "bob"])
        try await waitUntil("alice pushed") { devices["alice"]!.service.status.pendingCount == 0 }
        try await devices["bob"]!.restart()
        try await quietPoint("bob back in Home after a restart")
        // His Trip entry points at Home's rent again.
        let relinked = try await devices["bob"]!.database.read { db in
            try Bool.fetchOne(
                db,
                sql: """
                    SELECT s.linkedEntryId = r.id FROM entry s, entry r
                    WHERE s.title = 'Share of rent' AND r.title = 'Rent'
                    """)
        }
        #expect(relinked == true)
        #expect(devices.values.allSatisfy { $0.service.status.failedCount == 0 })
    }

    /// Alice and bob's devices on a server with `rules`; alice has made Home (alice and bob,
    /// one entry, "Rent"), and both hold it.
    static func homeOfTwo(
        rules: String, policy: ConflictPolicy = .fieldLevel,
        bob configure: @escaping @Sendable (inout SyncConfiguration) -> Void = { _ in }
    )
        async throws -> (server: TestServer, alice: TestDevice, bob: TestDevice)
    {
        let access = try AccessControl(tokens: (SharedAccounts.tokens, "tokens.json"), rules: (rules, "rules.json"))
        let server = try await TestServer { $0.access = access }
        let alice = try TestDevice(name: "alice", serverURL: server.url, model: .sharedAccounts) {
            $0.token = "t-alice"
            $0.conflictPolicy = policy
        }
        let bob = try TestDevice(name: "bob", serverURL: server.url, model: .sharedAccounts) {
            $0.token = "t-bob"
            $0.conflictPolicy = policy
            configure(&$0)
        }
        alice.service.start()
        bob.service.start()
        try await alice.database.write { db in
            var account = Account(name: "Home", members: ["alice", "bob"])
            try account.insert(db)
            var entry = CashFlow.Entry(accountId: account.id!, title: "Rent", amount: -100)
            try entry.insert(db)
        }
        try await waitUntil("bob holds Home") { try Self.holdings(bob) == ["Home": ["Rent"]] }
        return (server, alice, bob)
    }

    /// Alice's scope never held the account she made for bob, so no view tells her of it. Its
    /// entry could not go out before the account had its server id, so at the account's answer
    /// the entry still waited: without marking the account out of scope then, it stayed on her
    /// device, stale, with its entry.
    @Test(
        "an account alice makes for bob alone, with an entry, leaves her device once both are on the server, and reaches bob's"
    )
    func accountMadeForAnother() async throws {
        let open = #"""
            {"rules": [{"match": "accounts", "read": true, "write": true},
                       {"match": "accounts/{account}/entries", "read": true, "write": true}]}
            """#
        let (server, alice, bob) = try await Self.homeOfTwo(rules: open)
        defer { Task { await alice.service.stop() } }
        defer { Task { await bob.service.stop() } }
        try await alice.database.write { db in
            var account = Account(name: "Gift", members: ["bob"])
            try account.insert(db)
            var entry = CashFlow.Entry(accountId: account.id!, title: "Book", amount: -20)
            try entry.insert(db)
        }
        try await waitUntil("bob holds the gift, and alice only Home") {
            try Self.holdings(bob) == ["Home": ["Rent"], "Gift": ["Book"]] && Self.holdings(alice) == ["Home": ["Rent"]]
        }
        #expect(try await serverDocuments(server, "accounts").count == 2)
        #expect(try await alice.service.conflicts().isEmpty)
        try await waitUntil("alice has nothing left to push") { alice.service.status.pendingCount == 0 }
    }

    static func setMembers(_ device: TestDevice, _ name: String, to list: [String]) async throws {
        try await device.database.write { db in
            try db.execute(
                sql: "UPDATE account SET members = ? WHERE name = ?", arguments: [Account.encode(list), name])
        }
        try await waitUntil("\(device.name) pushed") { device.service.status.pendingCount == 0 }
    }

    @Test(
        "bob edits Home and adds an entry offline, and is taken out of Home: the rows stay as a left-scope conflict, and resolving it for the server lets them go"
    )
    func dirtyRowLeavesScopeAndIsDropped() async throws {
        let (server, alice, bob) = try await Self.homeOfTwo(rules: SharedAccounts.rules)
        defer { Task { await alice.service.stop() } }
        defer { Task { await bob.service.stop() } }
        await bob.service.stop()
        try await bob.database.write { db in
            try db.execute(sql: "UPDATE account SET name = 'Home (bob)' WHERE name = 'Home'")
            let home = try Int64.fetchOne(db, sql: "SELECT id FROM account")!
            var entry = CashFlow.Entry(accountId: home, title: "Gas", amount: -30)
            try entry.insert(db)
        }
        try await Self.setMembers(alice, "Home", to: ["alice"])
        try await bob.restart()

        // The server refuses his changes (he is no longer a member), and the account, now
        // unreadable to him, leaves his scope without its content: a conflict, not a removal.
        try await waitUntil("a left-scope conflict") { try await bob.service.conflicts().count == 1 }
        let conflict = try #require(try await bob.service.conflicts().first)
        #expect(conflict.reason == .leftScope)
        #expect(conflict.table == "account" && conflict.local["name"] == "Home (bob)")
        #expect(conflict.server.version == 0 && conflict.server.fields.isEmpty, "withheld: \(conflict.server)")
        #expect(try Self.holdings(bob) == ["Home (bob)": ["Rent", "Gas"]], "nothing is lost before the app decides")
        try await waitUntil("both refusals recorded") { bob.service.status.failedCount == 2 }

        try await bob.service.resolve(conflict, with: .useServer)
        #expect(try Self.holdings(bob) == [:])
        #expect(bob.service.status.failedCount == 0 && bob.service.status.openConflicts == 0)
        #expect(try await bob.service.conflicts().isEmpty)
        // Nothing of bob's reached the server, and nothing was deleted there.
        let home = try #require(try await serverDocuments(server, "accounts").first)
        #expect(home.fields["name"] == "Home" && home.fields["members"] == ["alice"])
        #expect(try await serverDocuments(server, "accounts/\(home.id)/entries").map { $0.fields["title"] } == ["Rent"])
        #expect(try Self.holdings(alice) == ["Home": ["Rent"]])
    }

    /// Home on a server where everyone may read and write every account, so that it leaves
    /// bob's scope only because it no longer lists him, and his edit may still be written. Bob
    /// renames Home, and his push waits (a long `pushDelay`) while alice takes him out: the
    /// removal reaches him before his push.
    ///
    /// Under last-write-wins, a synced account has no bookkeeping row until it leaves the scope.
    /// The name Home ends with once bob's rename meets alice's later member changes: field by
    /// field both stay; by whole rows, alice's later write wins.
    static func settledName(_ policy: ConflictPolicy) -> String {
        if case .lastWriteWins = policy { "Home" } else { "Home (bob)" }
    }

    static func bobRenamesWhileTakenOut(
        _ policy: ConflictPolicy, bob configure: @escaping @Sendable (inout SyncConfiguration) -> Void = { _ in }
    ) async throws -> (server: TestServer, alice: TestDevice, bob: TestDevice) {
        let open = #"""
            {"rules": [{"match": "accounts", "read": true, "write": true},
                       {"match": "accounts/{account}/entries", "read": true, "write": true}]}
            """#
        let (server, alice, bob) = try await Self.homeOfTwo(rules: open, policy: policy) { configuration in
            configuration.pushDelay = .seconds(3600)
            configuration.pushInterval = .seconds(3600)
            configure(&configuration)
        }
        try await bob.database.write { db in
            try db.execute(sql: "UPDATE account SET name = 'Home (bob)' WHERE name = 'Home'")
        }
        try await Self.setMembers(alice, "Home", to: ["alice"])
        try await waitUntil("a left-scope conflict") { try await bob.service.conflicts().count == 1 }
        return (server, alice, bob)
    }

    @Test(
        "an edit not pushed yet when its row stops matching the scope: a left-scope conflict; kept, it is pushed (settled with the server's side by the policy) and then the row goes",
        arguments: [ConflictPolicy.fieldLevel, .lastWriteWins])
    func dirtyRowLeavesScopeAndIsKept(policy: ConflictPolicy) async throws {
        let (server, alice, bob) = try await Self.bobRenamesWhileTakenOut(policy)
        let name = Self.settledName(policy)
        defer { Task { await alice.service.stop() } }
        defer { Task { await bob.service.stop() } }
        let conflict = try #require(try await bob.service.conflicts().first)
        #expect(conflict.reason == .leftScope)
        #expect(conflict.server.fields["members"] == ["alice"], "readable, so sent whole: \(conflict.server)")
        #expect(try Self.holdings(bob) == ["Home (bob)": ["Rent"]])

        try await bob.service.resolve(conflict, with: .keepLocal)
        // The push meets alice's newer version, merges field by field, is acknowledged, and
        // then nothing keeps the rows here.
        try await waitUntil("the rows went") { try Self.holdings(bob) == [:] }
        let home = try #require(try await serverDocuments(server, "accounts").first)
        #expect(home.fields["name"] == .string(name) && home.fields["members"] == ["alice"])
        try await waitUntil("alice has the settled name") { try Self.holdings(alice) == [name: ["Rent"]] }
        #expect(try await bob.service.conflicts().isEmpty)
        // The status follows the rows' removal; it must get there, not already be there.
        try await waitUntil("bob's status shows nothing pending") {
            bob.service.status.failedCount == 0 && bob.service.status.pendingCount == 0
        }
    }

    /// Bob's rename leaves his scope with Home, and he keeps it: the account stays out of
    /// scope, bookkeeping and all, while its push is on its way. An edit meanwhile must go out
    /// as a new op once that push is answered: with the answered op's key left on the row's
    /// entry, it would go as a resend of that op, and the server would answer it with the
    /// first result and apply nothing.
    ///
    /// Under last-write-wins, bob's later row wins whole, his membership included: Home comes
    /// back into his scope once his push is through, by the listener's echo of it. With that
    /// echo held until the edit's push is on its way (`echoAfterEdit`), the edit's answer
    /// finds the row still out of scope and removes it, Rent with it, and the echo brings it
    /// back as a new row. Home's entries must come back with it: their listener, open since
    /// before, would go on from where bob's device left them and never send Rent again, so it
    /// opens again, from the whole collection. (Under load that order came by itself, and
    /// bob's Home stayed without Rent.)
    @Test(
        "a row out of scope edited while its push is on its way: once the push is answered, the edit goes out as a new op, and the rows under it stay or come back",
        arguments: [false, true])
    func outOfScopeRowEditedWhilePushed(echoAfterEdit: Bool) async throws {
        let holding = Atomic<Bool>(false)
        let afterAck = Checkpoint()
        let echo = Checkpoint()
        let editSent = Checkpoint()
        let (server, alice, bob) = try await Self.bobRenamesWhileTakenOut(.lastWriteWins) { configuration in
            configuration.hooks.afterAck = { _ in
                if holding.load(ordering: .sequentiallyConsistent) { afterAck.pause() }
            }
            guard echoAfterEdit else { return }
            configuration.hooks.snapshotReceived = { snapshot in
                if snapshot.changes.contains(where: { $0.document.fields["name"] == "Home (bob, later)" }) {
                    echo.pause()
                }
            }
            configuration.hooks.beforeSend = { ops in
                if ops.contains(where: { $0.fields?["name"] == "Home (bob, again)" }) { editSent.pause() }
            }
        }
        defer { Task { await alice.service.stop() } }
        defer { Task { await bob.service.stop() } }
        // Renamed once more, after alice's change, so that his side wins the server's
        // `conflict` answer and the push goes again, to be acknowledged.
        try await bob.database.write { db in try db.execute(sql: "UPDATE account SET name = 'Home (bob, later)'") }
        let conflict = try #require(try await bob.service.conflicts().first)

        holding.store(true, ordering: .sequentiallyConsistent)
        try await bob.service.resolve(conflict, with: .keepLocal)
        try await afterAck.reached()
        #expect(
            try await bob.database.read { db in
                try Bool.fetchOne(db, sql: "SELECT outOfScope FROM tandem_row WHERE tableName = 'account'")
            } == true, "still out of scope when the answer is written back")
        // The echo arrived and waits on the connection's queue, not yet queued for applying.
        if echoAfterEdit { try await echo.reached() }
        try await bob.database.write { db in try db.execute(sql: "UPDATE account SET name = 'Home (bob, again)'") }
        afterAck.release()
        // The edit's push (this device pushes only when asked).
        let push = Task { try await bob.service.syncNow() }
        if echoAfterEdit {
            // The edit's push holds the sync queue: the echo, let go now, is applied after its
            // answer.
            try await editSent.reached()
            echo.release()
            editSent.release()
        }
        _ = try await push.value

        try await waitUntil("the server has bob's second rename") {
            try await serverDocuments(server, "accounts").first?.fields["name"] == "Home (bob, again)"
        }
        for device in [alice, bob] {
            try await waitUntil("\(device.name) holds the second rename and its entry") {
                try Self.holdings(device) == ["Home (bob, again)": ["Rent"]]
            }
        }
        try await waitUntil("bob's row is clean") { bob.service.status.pendingCount == 0 }
        #expect(try await bob.service.conflicts().isEmpty)
    }

    @Test(
        "a row out of scope whose document comes back before the app decides: the conflict closes by itself",
        arguments: [ConflictPolicy.fieldLevel, .lastWriteWins])
    func rowComesBackIntoScope(policy: ConflictPolicy) async throws {
        let (server, alice, bob) = try await Self.bobRenamesWhileTakenOut(policy)
        let name = Self.settledName(policy)
        defer { Task { await alice.service.stop() } }
        defer { Task { await bob.service.stop() } }
        try await Self.setMembers(alice, "Home", to: ["alice", "bob"])
        try await waitUntil("the conflict closed") { try await bob.service.conflicts().isEmpty }
        // The document that came back met his edit, and the policy settled them (field by field
        // his name stays, and goes out when he pushes; by whole rows alice's later write wins).
        #expect(try Self.holdings(bob) == [name: ["Rent"]])
        _ = try await bob.service.syncNow()
        try await waitUntil("both have the settled name") {
            try Self.holdings(alice) == [name: ["Rent"]] && Self.holdings(bob) == [name: ["Rent"]]
        }
        #expect(try await serverDocuments(server, "accounts").first?.fields["members"] == ["alice", "bob"])
    }
}
