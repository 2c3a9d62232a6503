// Tandem's getting-started example: an app's own GRDB database, two synced tables, a sync
// service. Works offline: without a server the changes wait, and go out once it is there.
//
//     swift run tandem-getting-started [SERVER_URL] [DATABASE_PATH] [DEVICE_ID]

import Foundation
import GRDB
import Tandem

// 1. Record types, as usual with GRDB. Their encoded columns leave Tandem's out.
struct Account: Codable, FetchableRecord, MutablePersistableRecord {
    var id: Int64?
    var name: String
    var isShared: Bool  // only shared accounts sync
    mutating func didInsert(_ inserted: InsertionSuccess) { id = inserted.rowID }
}

struct Transaction: Codable, FetchableRecord, MutablePersistableRecord {
    var id: Int64?
    var accountId: Int64
    var label: String
    var amount: Int64
    mutating func didInsert(_ inserted: InsertionSuccess) { id = inserted.rowID }
}

// 2. Where each table syncs: accounts to `accounts`, transactions under their account
//    (`accounts/{account's server id}/transactions`).
extension Account: SyncableRecord {
    static let syncTable = SyncTable.root(Account.self, collection: "accounts")
}

extension Transaction: SyncableRecord {
    static let syncTable = SyncTable.nested(
        Transaction.self, under: Account.self, foreignKey: "accountId", collection: "transactions")
}

// 3. The app's database and its own migration (auto-increment ids); WAL, as GRDB recommends,
//    and temporary files in memory (README, "What to know").
let arguments = CommandLine.arguments.dropFirst()
let serverURL = arguments.first ?? "ws://127.0.0.1:7878"
let path = arguments.dropFirst().first ?? "getting-started.sqlite"
var configuration = Configuration()
configuration.journalMode = .wal
configuration.prepareDatabase { db in try db.execute(sql: "PRAGMA temp_store = MEMORY") }
let dbQueue = try DatabaseQueue(path: path, configuration: configuration)
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
try migrator.migrate(dbQueue)

// 4. A client id that stays the same for this install (an app keeps it in its settings), and
//    the sync service: create it before writing synced tables, then start it.
let deviceId = arguments.dropFirst(2).first ?? "getting-started-device"
let sync = try SyncService(
    database: dbQueue, serverURL: serverURL, clientId: deviceId, records: [Account.self, Transaction.self])
sync.start()

// 5. Write as usual, online or not: Tandem's triggers mark the rows for pushing.
try dbQueue.write { db in
    var account = Account(name: "Household", isShared: true)
    try account.insert(db)
    var rent = Transaction(accountId: account.id!, label: "Rent", amount: -120_000)
    try rent.insert(db)
}

// 6. Optional: push now and wait for the answer. Offline is normal, not an error to crash on:
//    the changes stay pending and go out when the server can be reached.
do {
    let report = try await sync.syncNow(connectionWait: .seconds(2))
    print("synced: \(report.pending) changes pending, \(report.failed) failed")
} catch let error as TandemError where error.code == .disconnected || error.code == .timedOut {
    print("offline: \(sync.status.pendingCount) changes wait for the server (\(error.message))")
}
await sync.stop()
