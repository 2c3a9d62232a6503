import GRDB
import Tandem
import TandemHarness
import TandemServer

/// The shared-account app of the seeds: one `accounts` collection for every user, each account
/// listing its members, and each device syncing only the accounts its user is a member of
/// (`SyncTable.where("members", arrayContains: .currentUser)`), with their entries.
///
/// The server's rules say the same thing from its side: a user reads and writes the accounts
/// that list them, and the entries under those accounts.
public enum SharedAccounts {
    /// An account; `members` holds the user ids as JSON text (`["alice","bob"]`).
    public struct Account: Codable, Equatable, FetchableRecord, MutablePersistableRecord, Sendable {
        public var id: Int64?
        public var name: String
        public var members: String
        public var isShared: Bool

        public static let databaseTableName = "account"

        public init(id: Int64? = nil, name: String, members: [String]) {
            self.id = id
            self.name = name
            self.members = Self.encode(members)
            self.isShared = true
        }

        public static func encode(_ members: [String]) -> String {
            "[" + members.map { "\"\($0)\"" }.joined(separator: ",") + "]"
        }

        public mutating func didInsert(_ inserted: InsertionSuccess) { id = inserted.rowID }
    }

    public static let tokens = #"{"tokens": {"t-alice": "alice", "t-bob": "bob", "t-carol": "carol"}}"#
    public static let rules = #"""
        {"rules": [
          {"match": "accounts", "read": "user in resource.members", "create": "user in request.members",
           "update": "user in resource.members", "delete": "user in resource.members"},
          {"match": "accounts/{account}/entries",
           "read": "user in doc(accounts/{account}).members", "write": "user in doc(accounts/{account}).members"}
        ]}
        """#

    /// The parsed access control.
    public static func access() throws -> AccessControl {
        try AccessControl(tokens: (tokens, "tokens.json"), rules: (rules, "rules.json"))
    }

    public static let tables: [SyncTable] = [
        SyncTable.root(Account.self, collection: "accounts").where("members", arrayContains: .currentUser)
            .storingJSON("members"),
        CashFlow.Entry.syncTable,
    ]

    public static func createTables(_ db: Database) throws {
        try db.create(table: Account.databaseTableName, ifNotExists: true) { table in
            table.autoIncrementedPrimaryKey("id")
            table.column("name", .text).notNull()
            table.column("members", .text).notNull().defaults(to: "[]")
            table.column("isShared", .boolean).notNull().defaults(to: true)
        }
        try CashFlow.createTables(db)
    }
}

extension DeviceModel {
    /// Shared accounts scoped to the device's user (see ``SharedAccounts``).
    public static let sharedAccounts = DeviceModel(
        tables: SharedAccounts.tables, createTables: SharedAccounts.createTables)
}
