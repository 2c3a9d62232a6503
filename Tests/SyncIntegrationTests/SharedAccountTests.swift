import Foundation
import GRDB
import Tandem
import TandemTesting
import TandemWire
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
        let home = try #require(try serverDocuments(server, "accounts").first { $0.fields["name"] == "Home" })
        let homeEntries = try serverDocuments(server, "accounts/\(home.id)/entries")
        #expect(Set(homeEntries.map { $0.fields["title"] }) == ["Rent", "Food", "Gas"])
        // The link from Trip to Home's rent is kept on the server, though bob's device no
        // longer holds the rent.
        let rent = try #require(homeEntries.first { $0.fields["title"] == "Rent" })
        let trip = try #require(try serverDocuments(server, "accounts").first { $0.fields["name"] == "Trip" })
        let share = try #require(
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
}
