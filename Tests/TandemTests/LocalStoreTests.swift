import Foundation
import GRDB
import Testing

@testable import Tandem
@testable import TandemWire

/// The local store on its own, without a server: one `item` table, applied snapshots written
/// by hand.
struct StoreFixture {
    let database: DatabaseQueue
    let store: LocalStore
    let items = try! CollectionPath("items")

    init() throws {
        database = try DatabaseQueue()
        let clock = HybridLogicalClock(wall: SystemClock())
        try SyncLedger.migrator.migrate(database)
        let models = try database.write { db in
            db.add(function: DatabaseFunction("tandem_now", argumentCount: 0, pure: false) { _ in clock.now() })
            try db.execute(
                sql: """
                    CREATE TABLE item (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL,
                        isShared INTEGER NOT NULL DEFAULT 1)
                    """)
            return try SyncSchema.install(
                db, tables: [.root("item", collection: "items")], defaultPolicy: .lastWriteWins)
        }
        store = LocalStore(tables: models, clock: clock)
    }

    /// A row the server has at `version`, as it is after its push was acknowledged (a synced
    /// row of a root last-write-wins table has no bookkeeping row).
    func syncedRow(serverId: String, version: Int64) throws -> Int64 {
        try database.write { db in
            try db.execute(sql: "INSERT INTO item (title) VALUES ('Rent')")
            let rowId = db.lastInsertedRowID
            try db.execute(
                sql: """
                    UPDATE item SET serverId = ?, serverVersion = ?, isDirty = 0, localRevision = localRevision + 1
                    WHERE id = ?
                    """, arguments: [serverId, version, rowId])
            return rowId
        }
    }

    func apply(_ id: String, version: Int64, title: String) throws {
        let document = Document(
            id: try DocumentID(id), version: version, fields: ["title": .string(title)], createTime: 0, updateTime: 0)
        let snapshot = ServerMessage.Snapshot(
            target: "items", changes: [Change(.modified, document)], resumeToken: "e.\(version)", initial: false)
        _ = try database.write { db in
            try store.apply(
                snapshot, collection: items, target: ListenerTarget(table: "item", parentRowId: nil),
                isolatingChanges: false, db)
        }
    }

    func bookkeeping(_ serverId: String) throws -> Row? {
        try database.read { db in
            try Row.fetchOne(
                db, sql: "SELECT serverVersion, pendingOp, idempotencyKey FROM tandem_row WHERE serverId = ?",
                arguments: [serverId])
        }
    }
}

@Suite("The local store")
struct LocalStoreTests {
    @Test("a snapshot older than what this device wrote leaves a filed delete at the newer version")
    func olderSnapshotAfterLocalDelete() throws {
        // Found by `tandem soak --seed 2`: the device wrote version 3, deleted the row, and then
        // applied a snapshot of version 2 that had waited behind its push. The filed delete
        // went back to version 2, so it went out with a stale base and met a needless conflict.
        let fixture = try StoreFixture()
        let rowId = try fixture.syncedRow(serverId: "X", version: 3)
        try fixture.database.write { db in
            try db.execute(sql: "DELETE FROM item WHERE id = ?", arguments: [rowId])
            try db.execute(sql: "UPDATE tandem_row SET idempotencyKey = 'k1' WHERE rowId = ?", arguments: [rowId])
        }
        try fixture.apply("X", version: 2, title: "Rent (older)")
        var row = try #require(try fixture.bookkeeping("X"))
        #expect(row["serverVersion"] == 3)
        #expect(row["pendingOp"] == "delete")
        #expect(row["idempotencyKey"] == "k1", "the key of a delete that may be in flight stays")

        // A newer version moves it on, and the delete goes out again under a new key.
        try fixture.apply("X", version: 4, title: "Rent (newer)")
        row = try #require(try fixture.bookkeeping("X"))
        #expect(row["serverVersion"] == 4)
        #expect((row["idempotencyKey"] as String?) == nil)
    }

    @Test("a snapshot older than the row's known version changes nothing")
    func olderSnapshotIsIgnored() throws {
        let fixture = try StoreFixture()
        _ = try fixture.syncedRow(serverId: "X", version: 3)
        try fixture.apply("X", version: 2, title: "Older")
        #expect(try fixture.database.read { db in try String.fetchOne(db, sql: "SELECT title FROM item") } == "Rent")
        try fixture.apply("X", version: 4, title: "Newer")
        #expect(try fixture.database.read { db in try String.fetchOne(db, sql: "SELECT title FROM item") } == "Newer")
    }
}
