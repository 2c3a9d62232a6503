import Foundation
import GRDB
@_spi(Testing) import Tandem
import TandemServer
import TandemTesting
import TandemWire
import Testing

/// An installed app's database, made before Tandem's tables had versioned migrations, opens
/// under today's schema and syncs everything it held (Fixtures/README.md says what that is).
@Suite struct MigrationTests {
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .appendingPathComponent("Fixtures/schema-1")

    @Test(
        "a schema-1 database migrates and syncs its pending writes, pending delete, manual conflict and resume tokens, without loss or duplicates"
    )
    func schemaOne() async throws {
        let folder = try TemporaryDirectory(prefix: "tandem-migration")
        let serverFolder = folder.url.appendingPathComponent("server")
        try FileManager.default.createDirectory(at: serverFolder, withIntermediateDirectories: true)
        try FileManager.default.copyItem(
            at: Self.fixtures.appendingPathComponent("server.sqlite"),
            to: serverFolder.appendingPathComponent("tandem.sqlite"))
        try FileManager.default.copyItem(
            at: Self.fixtures.appendingPathComponent("laptop.sqlite"),
            to: folder.url.appendingPathComponent("laptop.sqlite"))
        var configuration = ServerConfiguration(dataDirectory: serverFolder)
        configuration.port = 0
        configuration.logger.logLevel = .warning
        let server = try await onOwnThread { [configuration] in try TandemServer(configuration: configuration) }
        defer { Thread.detachNewThread { server.shutdown() } }
        let url = "ws://127.0.0.1:\(server.port)"

        let tokensBefore = try Self.resumeTokens(folder.path("laptop.sqlite"))
        let foodId = try Self.read(folder.path("laptop.sqlite")) { db in
            try String.fetchOne(db, sql: "SELECT serverId FROM tandem_row WHERE pendingOp = 'delete'")
        }
        #expect(tokensBefore.count == 4)
        // Schema 1 kept each row's server version in its bookkeeping; the rows keep it now.
        let versionsBefore = try Self.read(folder.path("laptop.sqlite")) { db in
            try Row.fetchAll(
                db,
                sql: """
                    SELECT tableName, rowId, serverVersion FROM tandem_row
                    WHERE serverVersion > 0 AND pendingOp IS NOT 'delete'
                    """
            ).map { "\($0[0] as String)#\($0[1] as Int64)@\($0[2] as Int64)" }
        }
        #expect(versionsBefore.count >= 4)

        // Opening the service migrates; look before it syncs anything.
        let laptop = try TestDevice(name: "laptop", serverURL: url, model: MigrationModel.model, folder: folder)
        let applied = try await laptop.database.read { db in
            try String.fetchAll(db, sql: "SELECT identifier FROM grdb_migrations WHERE identifier LIKE 'tandem-%'")
        }
        #expect(Set(applied) == ["tandem-1", "tandem-2", "tandem-3", "tandem-4", "tandem-5"])
        let versionsAfter = try await laptop.database.read { db in
            try ["account", "entry", "note"].flatMap { table in
                try Row.fetchAll(db, sql: "SELECT id, serverVersion FROM \(table) WHERE serverVersion > 0").map {
                    "\(table)#\($0[0] as Int64)@\($0[1] as Int64)"
                }
            }
        }
        #expect(versionsAfter.sorted() == versionsBefore.sorted())
        #expect(try Self.resumeTokens(folder.path("laptop.sqlite")) == tokensBefore)
        #expect(laptop.service.status.pendingCount == 3, "the update, the create and the delete")
        let failed = try await laptop.service.failedRecords()
        #expect(failed.map(\.table) == ["entry"])
        #expect(failed.first?.error.code == .invalidArgument, "schema 1 kept only a message; migration 2 coded it")
        let conflict = try #require(try await laptop.service.conflicts().first)
        #expect(conflict.reason == .changed, "conflicts from before migration 3 were all of both sides")
        #expect(conflict.local["text"] == "buy oat milk")
        #expect(conflict.server.fields["text"] == "buy milk and eggs")

        laptop.service.start()
        try await laptop.service.resolve(conflict, with: .keepLocal)
        try await waitUntil("the laptop pushed everything and resumed its listeners") {
            let status = laptop.service.status
            let entries = try await laptop.entries().map(\.title).sorted()
            let names = try await laptop.accounts().map(\.name).sorted()
            return status.isConnected && status.pendingCount == 0 && status.openConflicts == 0
                && entries == ["Bonus", "Gym", "Rent", "Salary"] && names == ["Home", "Savings"]
        }

        // The server has each write once; the delete is a tombstone.
        let household = try await #require(
            try server.documents(in: CollectionPath("accounts")).first { $0.fields["name"] == "Home" })
        let entries = try await server.documents(in: CollectionPath("accounts/\(household.id)/entries"))
        let byTitle = Dictionary(grouping: entries) { $0.fields["title"]?.stringValue ?? "" }
        #expect(byTitle.keys.sorted() == ["Bonus", "Gym", "Rent", "Salary"])
        #expect(byTitle.values.allSatisfy { $0.count == 1 }, "no document twice")
        let rent = try #require(byTitle["Rent"]?.first)
        #expect(rent.fields["amount"] == -110)
        #expect(byTitle["Gym"]?.first?.fields["linkedEntryId"] == .string(rent.id.rawValue))
        let food = try #require(byTitle["Food"] == nil ? foodId : nil, "Food is deleted")
        #expect(try await server.everyDocument().contains { $0.document.id.rawValue == food && $0.document.deleted })
        #expect(try await server.documents(in: CollectionPath("notes")).map { $0.fields["text"] } == ["buy oat milk"])

        // The laptop has each row once, every synced one with its server id.
        let rows = try laptop.database.read { db in
            try Row.fetchAll(db, sql: "SELECT title, serverId, uid FROM entry ORDER BY title")
        }
        #expect(rows.count == 4)
        #expect(Set(rows.map { $0["uid"] as String }).count == 4)
        #expect(rows.allSatisfy { ($0["serverId"] as String?) != nil })
        // The moved row still fails, as before the migration: only the app can settle it.
        #expect(try await laptop.service.failedRecords().count == 1)

        // A device that starts fresh sees what the laptop sees.
        let desk = try TestDevice(name: "desk", serverURL: url, model: MigrationModel.model)
        desk.service.start()
        try await waitUntil("the desk has the entries") { try await desk.entries().count == 4 }
        try await waitUntil("the desk has the note") {
            try await desk.database.read { db in try String.fetchAll(db, sql: "SELECT text FROM note") }
                == ["buy oat milk"]
        }
        await laptop.service.stop()
        await desk.service.stop()
    }

    private static func resumeTokens(_ path: String) throws -> [String: String] {
        try read(path) { db in
            Dictionary(
                uniqueKeysWithValues: try Row.fetchAll(db, sql: "SELECT collection, resumeToken FROM tandem_listener")
                    .map { ($0[0] as String, $0[1] as String) })
        }
    }

    /// Reads the database file as it is on disk, past Tandem.
    private static func read<T>(_ path: String, _ body: (Database) throws -> T) throws -> T {
        try DatabaseQueue(path: path).read(body)
    }
}

/// The app of the fixture: the cash-flow tables and notes whose conflicts the app settles.
enum MigrationModel {
    static let model = DeviceModel(
        tables: CashFlow.tables + [SyncTable.root("note", collection: "notes").resolvingConflicts(with: .manual)],
        createTables: { db in
            try CashFlow.createTables(db)
            try db.create(table: "note", ifNotExists: true) { table in
                table.autoIncrementedPrimaryKey("id")
                table.column("text", .text).notNull()
                table.column("isShared", .boolean).notNull().defaults(to: false)
            }
        })
}
