import Foundation
import Synchronization
import GRDB
import Testing

@testable import Tandem
@testable import TandemWire

/// The local store on its own, without a server: one `item` table, applied snapshots written
/// by hand.
struct StoreFixture {
    let database: DatabaseQueue
    let store: Reconciler
    let items = try! CollectionPath("items")

    /// The models of the tables, as installed.
    let models: [TableModel]

    init(
        schema: String = """
        CREATE TABLE item (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL,
            isShared INTEGER NOT NULL DEFAULT 1)
        """,
        tables: [SyncTable] = [.root("item", collection: "items")]
    ) throws {
        database = try DatabaseQueue()
        let clock = HybridLogicalClock(wall: SystemClock())
        try SyncLedger.migrator.migrate(database)
        let models = try database.write { db in
            db.add(function: DatabaseFunction("tandem_now", argumentCount: 0, pure: false) { _ in clock.now() })
            try db.execute(sql: schema)
            return try SyncSchema.install(db, tables: tables, defaultPolicy: .lastWriteWins)
        }
        self.models = models
        store = Reconciler(tables: models, clock: clock)
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
        try apply(
            Document(
                id: try DocumentID(id), version: version, fields: ["title": .string(title)], createTime: 0,
                updateTime: 0),
            as: .modified)
    }

    /// Dirty rows the app inserted (no bookkeeping yet).
    func insertRows(_ titles: [String]) throws -> [Int64] {
        try database.write { db in
            try titles.map { title in
                try db.execute(sql: "INSERT INTO item (title) VALUES (?)", arguments: [title])
                return db.lastInsertedRowID
            }
        }
    }

    /// The ops of a push's first batch, as the push prepares and records them.
    func preparePush() throws -> [PreparedPush] {
        var cursor = PushCursor()
        return try database.write { db in try store.preparePush(maxOps: 100, maxBytes: 1 << 20, after: &cursor, db) }
    }

    /// A document the server made from `push`'s create, carrying its key.
    func document(of push: PreparedPush, id: String) throws -> Document {
        Document(
            id: try DocumentID(id), version: 1, fields: push.op.fields ?? [:], createTime: 0, updateTime: 0,
            createKey: push.op.idempotencyKey.rawValue)
    }

    /// Applies one change, as the listener does.
    func apply(_ document: Document, as kind: Change.Kind = .added) throws {
        let snapshot = ServerMessage.Snapshot(
            target: "items", changes: [Change(kind, document)], resumeToken: "e.\(document.version)", initial: false)
        _ = try database.write { db in
            try store.apply(
                SnapshotDelivery(
                    snapshot: snapshot, collection: items, target: ListenerTarget(table: "item", parentRowId: nil)),
                isolatingChanges: false, db)
        }
    }

    func count(_ sql: String) throws -> Int {
        try database.read { db in try Int.fetchOne(db, sql: sql) ?? 0 }
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
struct ReconcilerTests {
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

    // MARK: Creates recorded in a batch entry

    @Test("the creates of rows without bookkeeping are recorded as one batch entry, each under its key")
    func batchEntry() throws {
        let fixture = try StoreFixture()
        let rows = try fixture.insertRows(["a", "b", "c"])
        let pushes = try fixture.preparePush()
        #expect(pushes.map(\.rowId) == rows)
        let entry = try #require(pushes.first?.sendingEntry)
        #expect(pushes.allSatisfy { $0.sendingEntry == entry && $0.op.kind == .create })
        #expect(pushes.map(\.op.idempotencyKey.rawValue) == rows.map { "\(entry.rawValue)-\($0)" })
        #expect(try fixture.count("SELECT COUNT(*) FROM tandem_row") == 0)
        let listed = try #require(
            try fixture.database.read { db in
                try Row.fetchOne(
                    db, sql: "SELECT firstRowId, lastRowId, rows FROM tandem_sending WHERE key = ?",
                    arguments: [entry.rawValue])
            })
        #expect(listed["firstRowId"] == rows.first && listed["lastRowId"] == rows.last)
        #expect(listed["rows"] == "{" + rows.map { "\"\($0)\":1" }.joined(separator: ",") + "}")
    }

    @Test("a batch never answered goes out again at the next push under the same keys, recorded on its rows")
    func unansweredBatchKeepsItsKeys() throws {
        let fixture = try StoreFixture()
        let rows = try fixture.insertRows(["a", "b"])
        let first = try fixture.preparePush()
        // Edited since it was sent: the resend still carries the revision of the first sending,
        // so that the first answer, which the key brings back, leaves the row dirty.
        try fixture.database.write { db in
            try db.execute(sql: "UPDATE item SET title = 'a, edited' WHERE id = ?", arguments: [rows[0]])
        }
        // The next push starts: the entry's answer never came.
        let again = try fixture.preparePush()
        #expect(again.map(\.op.idempotencyKey) == first.map(\.op.idempotencyKey))
        #expect(again.allSatisfy { $0.sendingEntry == nil })
        #expect(again.map(\.revision) == first.map(\.revision))
        #expect(again.first?.op.fields?["title"] == "a, edited")
        #expect(try fixture.count("SELECT COUNT(*) FROM tandem_sending") == 0)
        #expect(try fixture.count("SELECT COUNT(*) FROM tandem_row WHERE pendingOp = 'create'") == 2)
    }

    @Test("the document of an unanswered create in a batch entry is adopted by its row, not inserted again")
    func batchEntryAdoptedFromListener() throws {
        let fixture = try StoreFixture()
        let rows = try fixture.insertRows(["a", "b"])
        let pushes = try fixture.preparePush()
        try fixture.apply(try fixture.document(of: pushes[1], id: "D1"))
        #expect(try fixture.count("SELECT COUNT(*) FROM item") == 2)
        let serverId = try fixture.database.read { db in
            try String.fetchOne(db, sql: "SELECT serverId FROM item WHERE id = ?", arguments: [rows[1]])
        }
        #expect(serverId == "D1")
        // The adopted row is synced: the next push sends only the other one, under its key.
        let again = try fixture.preparePush()
        #expect(again.map(\.rowId) == [rows[0]])
        #expect(again.first?.op.idempotencyKey == pushes[0].op.idempotencyKey)
    }

    /// Without the delete trigger's entry, the next push would drop the deleted row from the
    /// batch (it lists only rows that still exist), and its document would come back as a new row.
    @Test(
        "a row the app deletes while its create is on its way in a batch entry: its document, when it comes, is deleted"
    )
    func batchEntryRowDeletedByApp() throws {
        let fixture = try StoreFixture()
        let rows = try fixture.insertRows(["a", "b"])
        // A row between the batch's first and last that is not in it (not shared).
        let unshared = try fixture.insertRows(["not shared"])
        try fixture.database.write { db in
            try db.execute(sql: "UPDATE item SET isShared = 0 WHERE id = ?", arguments: [unshared[0]])
        }
        _ = try fixture.insertRows(["c"])
        let pushes = try fixture.preparePush()
        #expect(!pushes.map(\.rowId).contains(unshared[0]))
        // Rows out of the batch, inside its bounds and after it, leave nothing at their delete.
        let later = try fixture.insertRows(["d"])
        try fixture.database.write { db in
            try db.execute(
                sql: "DELETE FROM item WHERE id IN (?, ?, ?)", arguments: [rows[0], unshared[0], later[0]])
        }
        let entries = try fixture.database.read { db in
            try Row.fetchAll(db, sql: "SELECT rowId, pendingOp, idempotencyKey, pushedRevision FROM tandem_row")
        }
        #expect(entries.map { $0["rowId"] as Int64 } == [rows[0]])
        #expect(entries.first?["idempotencyKey"] == pushes[0].op.idempotencyKey.rawValue)
        #expect(entries.first?["pushedRevision"] == pushes[0].revision)
        _ = try fixture.preparePush()
        try fixture.apply(try fixture.document(of: pushes[0], id: "D0"))
        #expect(try fixture.count("SELECT COUNT(*) FROM item") == 2, "the deleted row did not come back")
        let row = try #require(try fixture.bookkeeping("D0"))
        #expect(row["pendingOp"] == "delete")
    }

    /// Found by review: a row the listener removes (its own create's document arrived deleted)
    /// must take its key with it. Left in the batch entry, the key went to the next push with
    /// whatever row then had that id, and a second delivery of the tombstone filed its delete
    /// again.
    @Test("a listed row removed by its own document's tombstone leaves no key behind")
    func batchEntryRowRemovedByTombstone() throws {
        let fixture = try StoreFixture()
        let rows = try fixture.insertRows(["a", "b"])
        let pushes = try fixture.preparePush()
        var tombstone = try fixture.document(of: pushes[0], id: "D0")
        tombstone.deleted = true
        tombstone.version = 2
        try fixture.apply(tombstone, as: .deleted)
        #expect(try fixture.count("SELECT COUNT(*) FROM item WHERE id = \(rows[0])") == 0)
        #expect(try fixture.count("SELECT COUNT(*) FROM tandem_sending") == 0)
        #expect(try fixture.count("SELECT COUNT(*) FROM tandem_row WHERE rowId = \(rows[0])") == 0)
        try fixture.apply(tombstone, as: .deleted)
        #expect(try fixture.count("SELECT COUNT(*) FROM tandem_row WHERE pendingOp = 'delete'") == 0)
        let again = try fixture.preparePush()
        #expect(again.map(\.rowId) == [rows[1]])
        #expect(again.map(\.op.idempotencyKey) == [pushes[1].op.idempotencyKey])
    }

    /// Found by review: the write-back filed a delete for any listed row it found gone, but a
    /// row Tandem removes itself (a conflict resolved for the server's side, which keeps the
    /// document) must not take its document with it.
    @Test(
        "a listed row gone at its acknowledgement: deleted by the app, its delete is filed; removed by Tandem, nothing is"
    )
    func acknowledgementOfRowsGoneMeanwhile() throws {
        let fixture = try StoreFixture()
        let rows = try fixture.insertRows(["deleted by the app", "removed by Tandem"])
        let pushes = try fixture.preparePush()
        let model = try #require(fixture.store.tables.first)
        try fixture.database.write { db in
            try db.execute(sql: "DELETE FROM item WHERE id = ?", arguments: [rows[0]])
            _ = try fixture.store.removeQuietly(model, rowId: rows[1], discardingChanges: true, db)
            let results = [
                WriteResult(id: try DocumentID("D0"), version: 1, updateTime: 0),
                WriteResult(id: try DocumentID("D1"), version: 1, updateTime: 0),
            ]
            _ = try fixture.store.recordAcknowledgement(pushes, results, db)
        }
        let filed = try fixture.database.read { db in
            try Row.fetchAll(db, sql: "SELECT rowId, serverId, collection, pendingOp FROM tandem_row")
        }
        #expect(filed.count == 1)
        #expect(filed.first?["rowId"] == rows[0])
        #expect(filed.first?["serverId"] == "D0")
        #expect(filed.first?["collection"] == "items", "a filed delete needs its collection")
        #expect(filed.first?["pendingOp"] == "delete")
        #expect(try fixture.count("SELECT COUNT(*) FROM tandem_sending") == 0)
    }

    @Test("a snapshot's new rows go in 64 per statement, in order; a later change of one of them finds its row")
    func newRowsManyPerStatement() throws {
        let fixture = try StoreFixture()
        let added = (1...70).map { index in
            Change(
                .added,
                Document(
                    id: try! DocumentID("doc\(index)"), version: 1, fields: ["title": .string("t\(index)")],
                    createTime: 0, updateTime: 0))
        }
        let modified = Change(
            .modified,
            Document(
                id: try DocumentID("doc67"), version: 2, fields: ["title": "changed"], createTime: 0, updateTime: 0))
        let snapshot = ServerMessage.Snapshot(
            target: "items", changes: added + [modified], resumeToken: "e.2", initial: false)
        let inserts = Mutex(0)
        let outcome = try fixture.database.write { db in
            db.trace { event in
                if case .statement(let statement) = event, statement.sql.hasPrefix("INSERT INTO \"item\"") {
                    inserts.withLock { $0 += 1 }
                }
            }
            defer { db.trace(nil) }
            return try fixture.store.apply(
                SnapshotDelivery(
                    snapshot: snapshot, collection: fixture.items,
                    target: ListenerTarget(table: "item", parentRowId: nil)),
                isolatingChanges: false, db)
        }
        #expect(outcome.inserted == 70 && outcome.updated == 1)
        // 64 in one statement; the 6 left go in (4, 1 and 1) before doc67's change looks for its row.
        #expect(inserts.withLock { $0 } == 4)
        let rows = try fixture.database.read { db in
            try Row.fetchAll(db, sql: "SELECT serverId, title, serverVersion, isDirty FROM item ORDER BY id")
        }
        #expect(rows.map { $0["serverId"] as String } == (1...70).map { "doc\($0)" })
        #expect(rows[66]["title"] == "changed" && rows[66]["serverVersion"] == 2)
        #expect(rows.allSatisfy { $0["isDirty"] == false })
    }

    @Test(
        "a snapshot of distinct documents reads their rows 64 server ids per statement: an echo, an update and new rows each as before"
    )
    func rowsLookedUpManyPerStatement() throws {
        let fixture = try StoreFixture()
        let echoed = try fixture.syncedRow(serverId: "old1", version: 3)
        let updated = try fixture.syncedRow(serverId: "old2", version: 1)
        func change(_ id: String, version: Int64, title: String) -> Change {
            Change(
                .added,
                Document(
                    id: try! DocumentID(id), version: version, fields: ["title": .string(title)], createTime: 0,
                    updateTime: 0))
        }
        let changes =
            [change("old1", version: 3, title: "echo"), change("old2", version: 2, title: "newer")]
            + (1...68).map { change("new\($0)", version: 1, title: "t\($0)") }
        let snapshot = ServerMessage.Snapshot(target: "items", changes: changes, resumeToken: "e.3", initial: false)
        let statements = Mutex<[String]>([])
        let outcome = try fixture.database.write { db in
            db.trace { event in
                if case .statement(let statement) = event { statements.withLock { $0.append(statement.sql) } }
            }
            defer { db.trace(nil) }
            return try fixture.store.apply(
                SnapshotDelivery(
                    snapshot: snapshot, collection: fixture.items,
                    target: ListenerTarget(table: "item", parentRowId: nil)),
                isolatingChanges: false, db)
        }
        #expect(outcome.unchanged == 1 && outcome.updated == 1 && outcome.inserted == 68)
        let sql = statements.withLock { $0 }
        // 70 server ids: statements of 64, 4, 1 and 1; none looked up alone.
        #expect(sql.filter { $0.hasPrefix("SELECT serverId, id") }.count == 4)
        #expect(!sql.contains { $0.contains("WHERE serverId = ?") })
        let titles = try fixture.database.read { db in
            try String.fetchAll(
                db, sql: "SELECT title FROM item WHERE id IN (?, ?) ORDER BY id", arguments: [echoed, updated])
        }
        #expect(titles == ["Rent", "newer"])
        #expect(try fixture.count("SELECT COUNT(*) FROM item") == 70)
    }

    @Test(
        "the server-id index leaves out rows without one, the lookups by server id use it, and an index of every row from before is made again"
    )
    func serverIdIndexIsPartial() throws {
        let fixture = try StoreFixture()
        let model = try #require(fixture.store.byName["item"])
        func isPartial(_ db: Database) throws -> Bool? {
            try Bool.fetchOne(
                db, sql: "SELECT partial FROM pragma_index_list('item') WHERE name = 'tandem_item_serverId'")
        }
        try fixture.database.write { db in
            #expect(try isPartial(db) == true)
            let lookups: [(String, StatementArguments)] = [
                (model.lookupSQL, StatementArguments(["x"])), (model.lookupHoldingSQL, StatementArguments(["x", 1])),
            ]
            for (sql, arguments) in lookups {
                let plan = try Row.fetchAll(db, sql: "EXPLAIN QUERY PLAN \(sql)", arguments: arguments)
                    .map { $0["detail"] as String }
                #expect(plan.contains { $0.contains("USING INDEX tandem_item_serverId") }, "\(sql): \(plan)")
            }
            // As an older Tandem made it: every row in it, the NULLs of the unsynced ones too.
            try db.execute(
                sql: """
                    DROP INDEX tandem_item_serverId;
                    CREATE UNIQUE INDEX tandem_item_serverId ON item(serverId);
                    INSERT INTO item (title) VALUES ('unsynced');
                    INSERT INTO item (title, serverId) VALUES ('synced', 'X');
                    """)
            #expect(try isPartial(db) == false)
            _ = try SyncSchema.install(db, tables: [.root("item", collection: "items")], defaultPolicy: .lastWriteWins)
            #expect(try isPartial(db) == true)
            // Still unique.
            #expect(throws: DatabaseError.self) {
                try db.execute(sql: "INSERT INTO item (title, serverId) VALUES ('again', 'X')")
            }
        }
    }
}

@Suite("What a push sends")
struct PushedFieldsTests {
    @Test(
        "a row's fields go out as the canonical text of the dictionary they stand for: every kind of value, escapes, JSON columns and references"
    )
    func canonicalFieldsFromTheRow() throws {
        let fixture = try StoreFixture(
            schema: """
                CREATE TABLE owner (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL,
                    isShared INTEGER NOT NULL DEFAULT 1);
                CREATE TABLE thing (id INTEGER PRIMARY KEY AUTOINCREMENT, zeta TEXT, amount INTEGER, ratio REAL,
                    data BLOB, meta TEXT, ownerId INTEGER, "naïve" TEXT, isShared INTEGER NOT NULL DEFAULT 1);
                """,
            tables: [
                .root("owner", collection: "owners"),
                .root("thing", collection: "things").storingJSON("meta").referencing("ownerId", "owner"),
            ])
        let (database, store) = (fixture.database, fixture.store)
        let model = try #require(fixture.models.first { $0.name == "thing" })
        let long = String(repeating: "lorem \"ipsum\" \\ dolor\n\t\u{1} é 😀 ", count: 9)
        let rows: [[DatabaseValueConvertible?]] = [
            ["plain", 42, 0.1 + 0.2, Data([0, 1, 2, 255]), #"{"b":[1,{"d":2,"c":3}],"a":null}"#, nil, "x"],
            [long, Int64.min, -0.0, nil, "not json {", nil, ""],
            [nil, nil, Double.infinity, Data(), "[1,2]", nil, "ü"],
            ["with owner", 7, 1e300, nil, nil, "owned", nil],
        ]
        try database.write { db in
            try db.execute(sql: "INSERT INTO owner (name) VALUES ('o')")
            try db.execute(
                sql: "UPDATE owner SET serverId = 'owner1', localRevision = localRevision + 1 WHERE id = 1")
            for values in rows {
                try db.execute(
                    sql: """
                        INSERT INTO thing (zeta, amount, ratio, data, meta, ownerId, "naïve")
                        VALUES (?, ?, ?, ?, ?, \(values[5] == nil ? "NULL" : "1"), ?)
                        """,
                    arguments: StatementArguments([values[0], values[1], values[2], values[3], values[4], values[6]]))
            }
            let read = try Row.fetchAll(
                db,
                sql: "SELECT id, updatedAt, \(model.fieldColumns.map(SQL.quote).joined(separator: ", ")) FROM thing")
            #expect(read.count == rows.count)
            for row in read {
                var fields: JSONObject = ["updatedAt": .int(row[1])]
                let cells = RowFields(row, from: 2, rowId: row[0])
                try store.addOutgoingFields(model, of: cells, to: &fields, db)
                let text = try store.outgoingFieldsJSON(model, of: cells, updatedAt: row[1], db) { _, _ in }
                let expected = String(decoding: Wire.encodeCanonical(fields), as: UTF8.self)
                #expect(String(decoding: text, as: UTF8.self) == expected)
                #expect(try Wire.decodeFields(text) == fields)
            }
        }
        // What the push sends is that text, and the server reads it as it stands.
        let pushes = try database.write { db in
            var cursor = PushCursor()
            return try store.preparePush(maxOps: 100, maxBytes: 1 << 20, after: &cursor, db)
        }
        let things = pushes.filter { $0.table == "thing" }
        #expect(things.count == rows.count)
        for push in things {
            let text = try #require(push.op.canonicalFieldsJSON)
            let read = text.withUnsafeBufferPointer { CanonicalJSON.read($0, from: 0, depthLeft: 64) }
            if let read { #expect(read.json == text) }
        }
    }
}

@Suite("The clock across restarts")
struct ClockStoreTests {
    @Test(
        "a Tandem write whose commit fails after it stored a moved clock leaves the next write to store it: a restart still starts past that time"
    )
    func clockStoredAfterFailedCommit() async throws {
        let database = try DatabaseQueue()
        try await database.write { db in
            try db.execute(
                sql: """
                    CREATE TABLE item (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL,
                        isShared INTEGER NOT NULL DEFAULT 1);
                    CREATE TABLE target (id INTEGER PRIMARY KEY);
                    CREATE TABLE pointer (target INTEGER REFERENCES target(id) DEFERRABLE INITIALLY DEFERRED);
                    """)
        }
        func service() throws -> SyncService {
            try SyncService(
                database: database, serverURL: "ws://127.0.0.1:1", clientId: "device",
                tables: [.root("item", collection: "items")])
        }
        let ahead = HybridLogicalClock.timestamp(milliseconds: Int64(Date().timeIntervalSince1970 * 1000) + 3_600_000)
        let first = try service()
        first.clock.receive(ahead)
        // The clock is stored in this transaction, whose commit then fails (a deferred foreign
        // key), and SQLite rolls it all back.
        await #expect(throws: DatabaseError.self) {
            try await first.ownWrite { db in try db.execute(sql: "INSERT INTO pointer (target) VALUES (42)") }
        }
        // The clock has not moved since: this write must store it all the same.
        try await first.ownWrite { _ in }

        let restarted = try service()
        #expect(restarted.clock.now() > ahead)
    }
}
