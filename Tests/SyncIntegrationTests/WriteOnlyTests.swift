import Foundation
import GRDB
@_spi(Testing) import Tandem
import TandemServer
import TandemTesting
import TandemWire
import Testing

/// A table that only pushes: its collection is one its user may write and not read.
@Suite("Write-only collections")
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
        await bob.service.stop()
    }
}
