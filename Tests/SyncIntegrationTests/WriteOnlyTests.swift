import Foundation
import GRDB
@_spi(Testing) import Tandem
import TandemServer
import TandemTesting
import TandemWire
import Testing

/// Writes whose result their user may not read: a table that only pushes (its collection is one
/// its user may write and not read), and a scoped table whose scope selects documents that the
/// read rules keep from its user.
@Suite("Writes whose result their user may not read")
struct WriteOnlyTests {
    static let rules = #"""
        {"rules": [{"match": "inbox", "create": "true", "update": "true"},
                   {"match": "inbox", "read": "user == 'alice'"}]}
        """#

    static let letters = DeviceModel(
        tables: [SyncTable.root("letter", collection: "inbox").resolvingConflicts(with: .fieldLevel)]
    ) { db in
        try db.execute(
            sql: """
                CREATE TABLE letter (
                    id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL, isShared INTEGER NOT NULL DEFAULT 1)
                """)
    }

    /// A merge's answer to a user who may not read the result carries the document withheld:
    /// its id and version, no fields, times 0. Taken for the stored document, it set the row's
    /// time to 0 and its known server fields to none.
    @Test(
        "a letter bob drops into alice's inbox, and edits, keeps its text and its time on his device under field-level merging"
    )
    func mergedLetterKeepsItsFields() async throws {
        let access = try AccessControl(
            tokens: (SharedAccounts.tokens, "tokens.json"), rules: (Self.rules, "rules.json"))
        let server = try await TestServer { $0.access = access }
        let bob = try TestDevice(name: "bob", serverURL: server.url, model: Self.letters) { $0.token = "t-bob" }
        bob.service.start()
        try await bob.database.write { db in try db.execute(sql: "INSERT INTO letter (body) VALUES ('Dear Alice')") }
        try await waitUntil("the letter is in the inbox") { try await serverDocuments(server, "inbox").count == 1 }
        try await bob.database.write { db in try db.execute(sql: "UPDATE letter SET body = 'Dear Alice, hello'") }
        try await waitUntil("the edit is in the inbox, and its answer written back") {
            try await bob.database.read { db in
                try Bool.fetchOne(db, sql: "SELECT serverVersion = 2 AND NOT isDirty FROM letter") ?? false
            }
        }
        let letter = try await bob.database.read { db in
            try Row.fetchOne(db, sql: "SELECT body, updatedAt FROM letter").map { row -> (String, Int64) in
                (row["body"], row["updatedAt"])
            }
        }
        let (body, updatedAt) = try #require(letter)
        #expect(body == "Dear Alice, hello")
        #expect(updatedAt > 0, "the edit's time was lost")
        // What the device knows the server holds, the base of its next merge: not nothing.
        let known = try await bob.database.read { db in
            try String.fetchOne(db, sql: "SELECT serverFields FROM tandem_row WHERE tableName = 'letter'")
        }
        #expect(known.map { $0.contains("Dear Alice, hello") } == true, "known server fields: \(known ?? "none")")
        await bob.service.stop()
    }

    /// The scope selects items not archived; the read rules, the user's own. The listener's
    /// view says nothing of a document that was never in it: without the answer saying that its
    /// user may not read the result, the item made for bob stayed on alice's device, stale.
    @Test(
        "an item alice makes for bob, which her scope selects and the read rules keep from her, leaves her device once answered"
    )
    func itemMadeForAnother() async throws {
        let rules = #"""
            {"rules": [{"match": "items", "read": "resource.owner == user", "create": "true",
                        "update": "resource.owner == user"}]}
            """#
        let access = try AccessControl(tokens: (SharedAccounts.tokens, "tokens.json"), rules: (rules, "rules.json"))
        let server = try await TestServer { $0.access = access }
        let model = DeviceModel(
            tables: [SyncTable.root("item", collection: "items").where("archived", isEqualTo: .value(.int(0)))]
        ) { db in
            try db.execute(
                sql: """
                    CREATE TABLE item (
                        id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, owner TEXT NOT NULL,
                        archived INTEGER NOT NULL DEFAULT 0, isShared INTEGER NOT NULL DEFAULT 1)
                    """)
        }
        let alice = try TestDevice(name: "alice", serverURL: server.url, model: model) { $0.token = "t-alice" }
        let bob = try TestDevice(name: "bob", serverURL: server.url, model: model) { $0.token = "t-bob" }
        alice.service.start()
        bob.service.start()
        try await alice.database.write { db in
            try db.execute(sql: "INSERT INTO item (title, owner) VALUES ('Mine', 'alice'), ('For Bob', 'bob')")
        }
        try await waitUntil("both items on the server, and alice holding her own") {
            guard try await alice.itemTitles() == ["Mine"] else { return false }
            return try await serverDocuments(server, "items").count == 2
        }
        try await waitUntil("bob holds his") { try await bob.itemTitles() == ["For Bob"] }
        #expect(try await alice.service.conflicts().isEmpty)
        await alice.service.stop()
        await bob.service.stop()
    }
}
