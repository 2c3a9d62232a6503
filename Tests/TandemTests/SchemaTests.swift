import Foundation
import GRDB
import Tandem
import TandemTesting
import TandemWire
import Testing

/// The triggers Tandem installs, on a real SQLite database (no server needed).
@Suite("Local change tracking")
struct SchemaTests {
    private func prepared(clock: TestClock = TestClock(now: 1000)) throws -> (DatabaseQueue, SyncService) {
        let database = try DatabaseQueue()
        try database.write(CashFlow.createTables)
        var configuration = SyncConfiguration()
        configuration.clock = clock
        let service = try SyncService(
            database: database, serverURL: "ws://127.0.0.1:1", clientId: "device", tables: CashFlow.tables,
            configuration: configuration)
        return (database, service)
    }

    private func syncColumns(_ database: DatabaseQueue, _ table: String, _ id: Int64) throws -> Row {
        try database.read { db in
            try Row.fetchOne(
                db,
                sql:
                    "SELECT serverId, isDirty, updatedAt, isDeleted, localRevision, serverVersion FROM \(table) WHERE id = ?",
                arguments: [id])!
        }
    }

    @Test("SQLite's memory statistics cannot be turned off once a database is open, and say so")
    func memoryStatisticsAfterOpening() throws {
        let database = try DatabaseQueue()
        try database.write { db in try db.execute(sql: "CREATE TABLE t (x)") }
        #expect(!SQLiteProcess.disableMemoryStatistics())
        // This test process never turned them off: SQLite counts.
        #expect(SQLiteProcess.keepsMemoryStatistics)
    }

    @Test("Tandem adds its sync columns, a unique serverId index, and its metadata tables")
    func columns() throws {
        let (database, _) = try prepared()
        try database.read { db in
            let names = Set(try db.columns(in: "entry").map(\.name))
            #expect(
                names.isSuperset(of: ["serverId", "isDirty", "updatedAt", "isDeleted", "isShared", "localRevision"]))
            #expect(try db.indexes(on: "entry").contains { $0.isUnique && $0.columns == ["serverId"] })
            #expect(try db.tableExists("tandem_row"))
            #expect(try db.tableExists("tandem_listener"))
        }
    }

    @Test("tandem_row's server-id index leaves out entries without a server id, and the lookups by server id use it")
    func serverIdIndexIsPartial() throws {
        let (database, _) = try prepared()
        try database.read { db in
            let partial = try Bool.fetchOne(
                db, sql: "SELECT partial FROM pragma_index_list('tandem_row') WHERE name = 'tandem_row_server'")
            #expect(partial == true, "a create on its way (no server id yet) writes no entry of this index")
            for lookup in [
                "DELETE FROM tandem_row WHERE tableName = ? AND serverId = ?",
                "SELECT 1 FROM tandem_row WHERE tableName = ? AND serverId = ? AND pendingOp = 'delete'",
            ] {
                let plan = try Row.fetchAll(db, sql: "EXPLAIN QUERY PLAN \(lookup)", arguments: ["entry", "x"])
                    .map { $0["detail"] as String }
                #expect(plan.contains { $0.contains("USING INDEX tandem_row_server") }, "\(lookup): \(plan)")
            }
        }
    }

    @Test("an insert by the app marks the row dirty and stamps updatedAt from the sync clock")
    func insertMarksDirty() throws {
        let (database, _) = try prepared(clock: TestClock(now: 42_000))
        let account = try database.write { db in
            var account = CashFlow.Account(name: "Home", isShared: true)
            try account.insert(db)
            return account
        }
        let row = try syncColumns(database, "account", account.id!)
        #expect(row["isDirty"] == true)
        #expect(row["updatedAt"] == HybridLogicalClock.timestamp(milliseconds: 42_000))
        #expect(row["localRevision"] == 1)
    }

    @Test("an update by the app of a synced column marks the row dirty again and bumps its revision")
    func updateMarksDirty() throws {
        let clock = TestClock(now: 1000)
        let (database, _) = try prepared(clock: clock)
        try database.write { db in
            try db.execute(sql: "INSERT INTO account (name, isShared) VALUES ('Home', 1)")
            try db.execute(sql: "UPDATE account SET isDirty = 0, localRevision = localRevision + 1")
        }
        clock.advance(by: 500)
        try database.write { db in try db.execute(sql: "UPDATE account SET name = 'House'") }
        let row = try syncColumns(database, "account", 1)
        #expect(row["isDirty"] == true)
        #expect(row["updatedAt"] == HybridLogicalClock.timestamp(milliseconds: 1500))
        #expect(row["localRevision"] == 3)
    }

    @Test("an update of a column that does not sync leaves the row clean")
    func localOnlyColumn() throws {
        let database = try DatabaseQueue()
        try database.write { db in
            try db.execute(
                sql:
                    "CREATE TABLE note (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT, expanded INTEGER, isShared INTEGER NOT NULL DEFAULT 1)"
            )
        }
        _ = try SyncService(
            database: database, serverURL: "ws://127.0.0.1:1", clientId: "device",
            tables: [SyncTable.root("note", collection: "notes").keepingLocal("expanded")])
        try database.write { db in
            try db.execute(sql: "INSERT INTO note (body) VALUES ('x')")
            try db.execute(sql: "UPDATE note SET isDirty = 0, localRevision = localRevision + 1")
            try db.execute(sql: "UPDATE note SET expanded = 1")
        }
        #expect(try syncColumns(database, "note", 1)["isDirty"] == false)
    }

    @Test("an update that would put back a stale serverId or serverVersion is refused with an explanation")
    func staleServerIdRefused() throws {
        let (database, _) = try prepared()
        try database.write { db in
            try db.execute(sql: "INSERT INTO account (name, isShared) VALUES ('Home', 1)")
            // As Tandem does after a push: the server id, with the revision bumped.
            try db.execute(sql: "UPDATE account SET serverId = 'S1', localRevision = localRevision + 1")
        }
        #expect {
            try database.write { db in try db.execute(sql: "UPDATE account SET serverId = NULL") }
        } throws: { error in
            "\(error)".contains("maintained by Tandem")
        }
        #expect {
            try database.write { db in try db.execute(sql: "UPDATE account SET localRevision = 0, name = 'x'") }
        } throws: { error in
            "\(error)".contains("maintained by Tandem")
        }
        // A record that saved an old copy of the server version (its next push would carry a
        // stale base, and an echo would look new).
        try database.write { db in
            try db.execute(sql: "UPDATE account SET serverVersion = 5, localRevision = localRevision + 1")
        }
        #expect {
            try database.write { db in try db.execute(sql: "UPDATE account SET serverVersion = 2, name = 'x'") }
        } throws: { error in
            "\(error)".contains("maintained by Tandem")
        }
        #expect(try syncColumns(database, "account", 1)["serverId"] == "S1")
        #expect(try syncColumns(database, "account", 1)["serverVersion"] == 5)
    }

    @Test("deleting a row the server knows files the delete for pushing; the row is gone at once")
    func deleteIsFiled() throws {
        let (database, service) = try prepared()
        try database.write { db in
            try db.execute(sql: "INSERT INTO account (name, isShared) VALUES ('Home', 1)")
            // Synced at version 3: a root last-write-wins row holds all of its sync state itself.
            try db.execute(
                sql: """
                    UPDATE account SET serverId = 'S1', serverVersion = 3, isDirty = 0,
                        localRevision = localRevision + 1
                    """)
            #expect(try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM tandem_row") == 0)
            try db.execute(sql: "DELETE FROM account WHERE id = 1")
        }
        let filed = try database.read { db in
            try Row.fetchOne(
                db, sql: "SELECT pendingOp, serverId, collection, serverVersion FROM tandem_row WHERE rowId = 1")
        }
        #expect(filed?["pendingOp"] == "delete")
        #expect(filed?["serverId"] == "S1")
        #expect(filed?["collection"] == "accounts")
        #expect(filed?["serverVersion"] == 3)
        #expect(try database.read { db in try CashFlow.Account.fetchCount(db) } == 0)
        _ = service
    }

    @Test("rows of unshared accounts are local-only; rows of shared ones are pending")
    func pendingCounts() async throws {
        let (database, service) = try prepared()
        try await database.write { db in
            try db.execute(sql: "INSERT INTO account (name, isShared) VALUES ('Private', 0), ('Household', 1)")
            try db.execute(
                sql: "INSERT INTO entry (accountId, title, amount) VALUES (1, 'a', 1), (2, 'b', 2), (2, 'c', 3)")
        }
        try await waitUntil("the status counts them") { service.status.pendingCount == 3 }
        #expect(service.status.pendingCount == 3, "the shared account and its two entries")
    }

    @Test(
        "registrations that cannot work are refused with a clear error",
        arguments: [
            (SyncTable.root("missing", collection: "m"), "does not exist"),
            (SyncTable.root("account", collection: "bad/path"), "even number of segments"),
            (
                SyncTable.nested("entry", under: "ghost", foreignKey: "accountId", collection: "entries"),
                "not registered"
            ),
            (SyncTable.root("entry", collection: "entries").referencing("nope", "account"), "has no column nope"),
            (
                SyncTable.nested("entry", under: "account", foreignKey: "accountId", collection: "entries")
                    .where("title", isEqualTo: "Rent"),
                "is nested: its rows follow their parent's, it takes no scope"
            ),
            (
                SyncTable.root("account", collection: "accounts").where("members..x", arrayContains: .currentUser),
                "scope: 'members..x' is not a field path"
            ),
        ])
    func badRegistrations(table: SyncTable, message: String) throws {
        let database = try DatabaseQueue()
        try database.write(CashFlow.createTables)
        var tables = [SyncTable.root("account", collection: "accounts")]
        if table.name != "account" { tables.append(table) } else { tables = [table] }
        #expect {
            try SyncService(database: database, serverURL: "ws://127.0.0.1:1", clientId: "d", tables: tables)
        } throws: { error in
            (error as? TandemError)?.code == .invalidArgument && "\(error)".contains(message)
        }
    }

    @Test("tables nested deeper than a collection path can reach are refused; seven nestings are not")
    func nestingDepth() throws {
        func chain(_ nestings: Int) -> [SyncTable] {
            [SyncTable.root("t0", collection: "c0")]
                + (1...nestings).map { n in
                    SyncTable.nested("t\(n)", under: "t\(n - 1)", foreignKey: "p", collection: "c\(n)")
                }
        }
        let database = try DatabaseQueue()
        func refusal(_ tables: [SyncTable]) -> String {
            do {
                _ = try SyncService(database: database, serverURL: "ws://127.0.0.1:1", clientId: "d", tables: tables)
                return "accepted"
            } catch {
                return "\(error)"
            }
        }
        let tooDeep = refusal(chain(8))
        #expect(tooDeep.contains("table t8 nests too deep (t0 → t1"), "\(tooDeep)")
        #expect(tooDeep.contains("17 segments"), "\(tooDeep)")
        // Seven pass the check, and fail only for want of the tables themselves.
        #expect(refusal(chain(7)).contains("table t0 does not exist"))
    }
}
