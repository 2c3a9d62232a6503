import GRDB
import TandemWire

/// How one of the app's tables syncs: the collection its rows go to, which columns point at
/// other synced rows, which columns stay on the device.
///
/// A table syncs either to a fixed collection (a *root* table, such as `accounts`), or to a
/// collection under each row of a parent table (a *nested* table: the entries of account
/// `A1` go to `accounts/A1/entries`). Rows of a root table sync while their `isShared`
/// column is 1; rows of a nested table sync while their parent does.
///
/// For example:
///
/// ```swift
/// extension Account: SyncableRecord {
///     static let syncTable = SyncTable.root(Account.self, collection: "accounts")
/// }
///
/// extension Entry: SyncableRecord {
///     static let syncTable = SyncTable
///         .nested(Entry.self, under: Account.self, foreignKey: "accountId", collection: "entries")
///         .referencing("linkedEntryId", Entry.self)
/// }
/// ```
///
/// Every other column (except `id` and Tandem's sync columns) becomes a field of the
/// document, under the column's name.
public struct SyncTable: Sendable {
    public enum Location: Sendable, Hashable {
        /// All rows go to one collection.
        case root(collection: String)
        /// Each row goes to `<parent's collection>/<parent's serverId>/<name>`.
        case nested(parent: String, foreignKey: String, name: String)
    }

    /// A column holding the local id of another synced row. On the wire it carries that
    /// row's server id.
    public struct Reference: Sendable, Hashable {
        public var column: String
        public var table: String
    }

    /// The table's name.
    public var name: String
    public var location: Location
    public var references: [Reference] = []
    /// Columns that never leave the device.
    public var localColumns: Set<String> = []
    /// Columns that hold JSON text (an array, an object): they go to the server as JSON.
    public var jsonColumns: Set<String> = []
    /// How conflicts on this table are settled; nil for ``SyncConfiguration/conflictPolicy``.
    public var policy: ConflictPolicy?
    /// For a root table: the filters that say which documents of its collection the device
    /// syncs (all of them must hold); empty for every document.
    public var scope: [ScopeFilter] = []

    public init(name: String, location: Location) {
        self.name = name
        self.location = location
    }

    /// A table whose shared rows sync to `collection`.
    public static func root(_ table: String, collection: String) -> SyncTable {
        SyncTable(name: table, location: .root(collection: collection))
    }

    /// A table whose rows sync under their parent row's document.
    ///
    /// - Parameters:
    ///   - foreignKey: The column holding the parent row's local id.
    ///   - collection: The collection's name under the parent document.
    public static func nested(_ table: String, under parent: String, foreignKey: String, collection: String)
        -> SyncTable
    {
        SyncTable(name: table, location: .nested(parent: parent, foreignKey: foreignKey, name: collection))
    }

    public static func root<Record: TableRecord>(_ record: Record.Type, collection: String) -> SyncTable {
        root(Record.databaseTableName, collection: collection)
    }

    public static func nested<Record: TableRecord, Parent: TableRecord>(
        _ record: Record.Type, under parent: Parent.Type, foreignKey: String, collection: String
    ) -> SyncTable {
        nested(
            Record.databaseTableName, under: Parent.databaseTableName, foreignKey: foreignKey, collection: collection)
    }

    /// Declares that `column` holds the local id of a row of `table`.
    public func referencing(_ column: String, _ table: String) -> SyncTable {
        var copy = self
        copy.references.append(Reference(column: column, table: table))
        return copy
    }

    public func referencing<Target: TableRecord>(_ column: String, _ target: Target.Type) -> SyncTable {
        referencing(column, Target.databaseTableName)
    }

    /// Declares columns that stay on the device.
    public func keepingLocal(_ columns: String...) -> SyncTable {
        var copy = self
        copy.localColumns.formUnion(columns)
        return copy
    }

    /// Declares columns that hold JSON text, such as a list of members (`["alice","bob"]`):
    /// they go to the server as that JSON, so that queries and rules see an array (text that is
    /// not JSON goes as a string). Arrays and objects that arrive are stored as JSON text in
    /// any column.
    public func storingJSON(_ columns: String...) -> SyncTable {
        var copy = self
        copy.jsonColumns.formUnion(columns)
        return copy
    }

    /// Chooses how conflicts on this table are settled.
    ///
    /// For example:
    ///
    /// ```swift
    /// static let syncTable = SyncTable.root(Note.self, collection: "notes").resolvingConflicts(with: .fieldLevel)
    /// ```
    public func resolvingConflicts(with policy: ConflictPolicy) -> SyncTable {
        var copy = self
        copy.policy = policy
        return copy
    }

    /// Syncs only the documents of the collection whose `field` is an array holding `value`:
    /// for example the accounts that list the device's user among their members.
    ///
    /// ```swift
    /// static let syncTable = SyncTable.root(Account.self, collection: "accounts")
    ///     .where("members", arrayContains: .currentUser)
    /// ```
    ///
    /// The device listens to a query instead of the whole collection. A row whose document
    /// leaves the scope (an edit on another device, or its user losing access) is removed
    /// here with the rows nested under it, and nothing is deleted on the server. When it or a
    /// row under it has unpushed changes, it stays, and a conflict with reason
    /// ``ConflictReason/leftScope`` asks the app whether to drop them or push them first.
    /// A row the device writes outside the scope (a create or an edit the scope does not
    /// select, or whose document the read rules keep from its user) goes once the server has
    /// acknowledged it, as if it had left, with the rows under it once they are on the server
    /// too. Nested tables follow their parent rows. Only root tables take a scope.
    public func `where`(_ field: String, arrayContains value: ScopeValue) -> SyncTable {
        `where`(field, .arrayContains, value)
    }

    /// Syncs only the documents of the collection whose `field` equals `value`.
    public func `where`(_ field: String, isEqualTo value: ScopeValue) -> SyncTable {
        `where`(field, .equal, value)
    }

    /// Syncs only the documents of the collection that pass a filter (any operator of the
    /// protocol's queries; a list for `in`, `not-in` and `array-contains-any`).
    public func `where`(_ field: String, _ op: Query.Filter.Operator, _ value: ScopeValue) -> SyncTable {
        var copy = self
        copy.scope.append(ScopeFilter(field: field, op: op, value: value))
        return copy
    }

    /// The scope as a query, with ``ScopeValue/currentUser`` replaced by `user`; nil for a
    /// table without a scope.
    ///
    /// - Throws: ``TandemError`` `.invalidArgument` for a field that is not a path, and when
    ///   the scope names the current user and the server named none (an anonymous client).
    func scopeQuery(user: String?) throws -> Query? {
        guard !scope.isEmpty else { return nil }
        return Query(
            filters: try scope.map { filter in
                let path: FieldPath
                do throws(WireError) { path = try FieldPath(filter.field) } catch {
                    throw TandemError(.invalidArgument, "table \(name): scope: \(error.message)")
                }
                let value: JSONValue
                switch filter.value {
                case .value(let constant): value = constant
                case .currentUser:
                    guard let user else {
                        throw TandemError(
                            .invalidArgument,
                            "table \(name) is scoped to the current user, and the server named none: "
                                + "set SyncConfiguration.token to a token of the server's token file")
                    }
                    value = .string(user)
                }
                return Query.Filter(path, filter.op, value)
            })
    }

    var parentTable: String? {
        if case .nested(let parent, _, _) = location { parent } else { nil }
    }

    var foreignKey: String? {
        if case .nested(_, let foreignKey, _) = location { foreignKey } else { nil }
    }
}

/// A GRDB record type whose table syncs.
///
/// The table needs an `id INTEGER PRIMARY KEY AUTOINCREMENT` column; Tandem adds its sync
/// columns (`serverId`, `isDirty`, `updatedAt`, `isDeleted`, `isShared`, `localRevision`,
/// `serverVersion`) when the ``SyncService`` opens the database. Leave the sync columns out of
/// the record's encoded columns, apart from `isShared`, which the app sets on root rows it
/// wants to share: they are Tandem's to write, and Tandem refuses an update that would put
/// back a stale `serverId`, `serverVersion` or `localRevision`.
public protocol SyncableRecord: TableRecord {
    static var syncTable: SyncTable { get }
}

/// A filter of a table's scope (``SyncTable/where(_:arrayContains:)``).
public struct ScopeFilter: Sendable, Hashable {
    public var field: String
    public var op: Query.Filter.Operator
    public var value: ScopeValue
}

/// A value in a table's scope.
public enum ScopeValue: Sendable, Hashable, ExpressibleByStringLiteral {
    /// The user the server's token file names for ``SyncConfiguration/token``, as the server
    /// says in its `welcome`.
    case currentUser
    /// A constant.
    case value(JSONValue)

    public init(stringLiteral value: String) { self = .value(.string(value)) }
}
