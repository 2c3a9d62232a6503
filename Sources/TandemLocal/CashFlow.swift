import GRDB
import Tandem
import TandemHarness

/// The demo's data model, a shared cash-flow book: accounts, and entries in them. Two
/// entries can be linked (the two sides of a transfer).
///
/// It is also the model of the integration tests, and an example of making tables syncable.
public enum CashFlow {
    /// An account. Shared accounts sync to `accounts`.
    public struct Account: Codable, Equatable, FetchableRecord, MutablePersistableRecord, Sendable {
        public var id: Int64?
        public var name: String
        /// The app decides what it shares; only shared accounts (and their entries) sync.
        public var isShared: Bool

        public static let databaseTableName = "account"

        public init(id: Int64? = nil, name: String, isShared: Bool) {
            self.id = id
            self.name = name
            self.isShared = isShared
        }

        public mutating func didInsert(_ inserted: InsertionSuccess) { id = inserted.rowID }
    }

    /// An entry of an account, in cents. Syncs to `accounts/{account's server id}/entries`.
    public struct Entry: Codable, Equatable, FetchableRecord, MutablePersistableRecord, Sendable {
        public var id: Int64?
        public var accountId: Int64
        public var title: String
        public var amount: Int64
        /// The other side of a transfer.
        public var linkedEntryId: Int64?

        public static let databaseTableName = "entry"

        public init(id: Int64? = nil, accountId: Int64, title: String, amount: Int64, linkedEntryId: Int64? = nil) {
            self.id = id
            self.accountId = accountId
            self.title = title
            self.amount = amount
            self.linkedEntryId = linkedEntryId
        }

        public mutating func didInsert(_ inserted: InsertionSuccess) { id = inserted.rowID }
    }

    /// Creates the tables (the app's own migration; Tandem adds its columns later).
    public static func createTables(_ db: Database) throws {
        try db.create(table: Account.databaseTableName, ifNotExists: true) { table in
            table.autoIncrementedPrimaryKey("id")
            table.column("name", .text).notNull()
            table.column("isShared", .boolean).notNull().defaults(to: false)
        }
        try db.create(table: Entry.databaseTableName, ifNotExists: true) { table in
            table.autoIncrementedPrimaryKey("id")
            table.column("accountId", .integer).notNull().indexed()
                .references(Account.databaseTableName, onDelete: .cascade)
            table.column("title", .text).notNull()
            table.column("amount", .integer).notNull()
            table.column("linkedEntryId", .integer).references(Entry.databaseTableName, onDelete: .setNull)
            // A random identity given when the entry is first written, synced like any field:
            // two rows (or documents) with the same uid are one entry counted twice.
            table.column("uid", .text).notNull().defaults(sql: "(lower(hex(randomblob(16))))")
        }
    }

    public static let tables: [SyncTable] = [Account.syncTable, Entry.syncTable]
}

extension CashFlow.Account: SyncableRecord {
    public static let syncTable = SyncTable.root(CashFlow.Account.self, collection: "accounts")
}

extension CashFlow.Entry: SyncableRecord {
    public static let syncTable =
        SyncTable
        .nested(CashFlow.Entry.self, under: CashFlow.Account.self, foreignKey: "accountId", collection: "entries")
        .referencing("linkedEntryId", CashFlow.Entry.self)
}
