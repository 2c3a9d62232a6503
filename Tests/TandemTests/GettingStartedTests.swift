// The code of the README's "Making your tables syncable" and of the DocC getting-started
// article, compiled and run against a real server.

import Foundation
import GRDB
import Tandem
import TandemTesting
import TandemWire
import Testing

// 1. Record types, as usual with GRDB. They leave Tandem's columns out.
struct Account: Codable, FetchableRecord, MutablePersistableRecord {
    var id: Int64?
    var name: String
    /// Only shared accounts sync.
    var isShared: Bool

    mutating func didInsert(_ inserted: InsertionSuccess) { id = inserted.rowID }
}

struct Transaction: Codable, FetchableRecord, MutablePersistableRecord {
    var id: Int64?
    var accountId: Int64
    var label: String
    var amount: Int64

    mutating func didInsert(_ inserted: InsertionSuccess) { id = inserted.rowID }
}

// 2. Where they sync: accounts to `accounts`, transactions under their account.
extension Account: SyncableRecord {
    static let syncTable = SyncTable.root(Account.self, collection: "accounts")
}

extension Transaction: SyncableRecord {
    static let syncTable = SyncTable.nested(
        Transaction.self, under: Account.self, foreignKey: "accountId", collection: "transactions")
}

// 3. The app's own migration creates the tables; Tandem adds its columns when the sync
//    service opens the database.
func migrate(_ writer: some DatabaseWriter) throws {
    var migrator = DatabaseMigrator()
    migrator.registerMigration("v1") { db in
        try db.create(table: "account") { table in
            table.autoIncrementedPrimaryKey("id")
            table.column("name", .text).notNull()
            table.column("isShared", .boolean).notNull().defaults(to: false)
        }
        try db.create(table: "transaction") { table in
            table.autoIncrementedPrimaryKey("id")
            table.belongsTo("account", onDelete: .cascade).notNull()
            table.column("label", .text).notNull()
            table.column("amount", .integer).notNull()
        }
    }
    try migrator.migrate(writer)
}

/// A device of the guide: its own database and sync service.
func openDevice(path: String, serverURL: String, deviceId: String) throws -> (DatabaseQueue, SyncService) {
    var configuration = Configuration()
    configuration.journalMode = .wal
    let dbQueue = try DatabaseQueue(path: path, configuration: configuration)
    try migrate(dbQueue)
    // 4. The sync service: create it before writing synced tables (its triggers call a
    //    function it registers), then start it.
    let sync = try SyncService(
        database: dbQueue, serverURL: serverURL, clientId: deviceId, records: [Account.self, Transaction.self])
    sync.start()
    return (dbQueue, sync)
}

@Suite("The getting-started guide")
struct GettingStartedTests {
    @Test("the guide's code syncs an account and its transactions between two devices")
    func guide() async throws {
        let server = try await TestServer()
        let folder = try TemporaryDirectory()
        let (phone, phoneSync) = try openDevice(
            path: folder.path("phone.sqlite"), serverURL: server.url, deviceId: "phone")
        let (laptop, laptopSync) = try openDevice(
            path: folder.path("laptop.sqlite"), serverURL: server.url, deviceId: "laptop")

        // 5. Write as usual: Tandem's triggers mark the rows dirty and stamp updatedAt; the
        //    pusher sends them soon after the commit.
        try await phone.write { db in
            var account = Account(name: "Household", isShared: true)
            try account.insert(db)
            var rent = Transaction(accountId: account.id!, label: "Rent", amount: -120_000)
            try rent.insert(db)
        }
        try await phoneSync.syncNow()

        // 6. The other device's listener brings them in.
        try await waitUntil("the laptop has the transaction") {
            try await laptop.read { db in try Transaction.fetchCount(db) } == 1
        }
        let labels = try await laptop.read { db in try Transaction.fetchAll(db).map(\.label) }
        #expect(labels == ["Rent"])
        #expect(laptopSync.status.failedCount == 0)

        // 7. Status, as an app shows it.
        var updates = phoneSync.statusUpdates().makeAsyncIterator()
        let status = await updates.next()
        #expect(status?.isConnected == true)
        await phoneSync.stop()
        await laptopSync.stop()
    }
}

@Suite("README's getting-started example")
struct GettingStartedExampleTests {
    static let root = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// Runs the example's executable, built beside `tandem`.
    static func runExample(_ arguments: [String]) async throws -> (status: Int32, output: String) {
        let process = ChildProcess()
        process.executableURL = try ServerProcess.findExecutable().deletingLastPathComponent()
            .appendingPathComponent("tandem-getting-started")
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        return try await onOwnThread {
            let data = output.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            return (process.terminationStatus, String(decoding: data, as: UTF8.self))
        }
    }

    @Test("README shows the example's code verbatim")
    func readmeShowsTheExample() throws {
        let readme = try String(contentsOf: Self.root.appendingPathComponent("README.md"), encoding: .utf8)
        let example = try String(
            contentsOf: Self.root.appendingPathComponent("Examples/GettingStarted/main.swift"), encoding: .utf8)
        #expect(
            readme.contains("```swift\n" + example + "```"),
            "README's example differs from Examples/GettingStarted/main.swift")
    }

    @Test("without a server the example runs to its end: the changes wait, nothing crashes")
    func offline() async throws {
        let folder = try TemporaryDirectory()
        let run = try await Self.runExample(["ws://127.0.0.1:1", folder.path("app.sqlite")])
        #expect(run.status == 0)
        #expect(run.output.hasPrefix("offline: 2 changes wait for the server"), "\(run.output)")
    }

    @Test("with a server the example pushes its account and transaction")
    func online() async throws {
        let server = try await TestServer()
        let folder = try TemporaryDirectory()
        let run = try await Self.runExample([server.url, folder.path("app.sqlite"), "example-device"])
        #expect(run.status == 0)
        #expect(run.output == "synced: 0 changes pending, 0 failed\n", "\(run.output)")
        let accounts = try await server.server.documents(in: try CollectionPath("accounts"))
        #expect(accounts.map { $0.fields["name"] } == ["Household"])
        let transactions = try await server.server.documents(
            in: try CollectionPath("accounts/\(accounts[0].id)/transactions"))
        #expect(transactions.map { $0.fields["label"] } == ["Rent"])
    }
}
