import GRDB
import TandemSQLite
import TandemWire

/// A registered ``SyncTable`` checked against the database schema: which columns become
/// document fields, which are references, where rows go.
struct TableModel: Sendable {
    let definition: SyncTable
    /// Columns copied into documents (references included, the parent foreign key not).
    let fieldColumns: [String]
    /// The keys of a pushed document in canonical order (the order `JSONWriter(sortsKeys:
    /// true)` writes them in): each field column's, and `updatedAt`.
    let pushedKeys: [PushedKey]

    /// A key of a pushed document, and where its value comes from.
    struct PushedKey {
        let key: String
        /// As written, once: `"title":`.
        let encoded: [UInt8]
        /// The column's index in `fieldColumns`; nil for `updatedAt`.
        let column: Int?
        /// The column holds JSON text (``SyncTable/storingJSON(_:)``).
        let isJSON: Bool
        /// The table the column references, if it is a reference.
        let target: String?

        init(_ key: String, column: Int?, isJSON: Bool = false, target: String? = nil) {
            self.key = key
            encoded = JSONWriter.encodedKey(key)
            self.column = column
            self.isJSON = isJSON
            self.target = target
        }
    }
    /// Reference column → target table.
    let references: [String: String]
    /// Reference columns that accept NULL: a missing target is filled in when it arrives.
    let optionalReferences: Set<String>
    /// For root tables, the collection.
    let rootCollection: CollectionPath?
    /// How conflicts on this table are settled.
    let policy: ConflictPolicy
    let quotedName: String
    /// The insert of 1, 4, 16 or 64 documents that carry every field, in one statement (see
    /// ``SnapshotRows``): the common case, prepared once.
    let insertRowsSQL: [Int: String]
    /// The insert of one document that carries every field.
    var insertEveryFieldSQL: String { insertRowsSQL[1]! }
    /// The rows of 1, 4, 16 or 64 server ids: server id, id, whether dirty, server version
    /// (see ``SnapshotRows``).
    let lookupRowsSQL: [Int: String]
    /// Finds a row by server id: its id and whether it has unpushed changes, packed in one
    /// integer (`id << 1 | (isDirty != 0)`, read by ``SyncLedger/lookup(_:serverId:_:)``).
    let lookupSQL: String
    /// As `lookupSQL`, and whether the row holds a given server version or a newer one:
    /// `id << 2 | ((isDirty != 0) << 1) | (serverVersion >= ?2)` (SQLite's bit operators share
    /// one precedence, left to right: hence the parentheses).
    let lookupHoldingSQL: String

    init(
        definition: SyncTable, fieldColumns: [String], references: [String: String], optionalReferences: Set<String>,
        rootCollection: CollectionPath?, policy: ConflictPolicy
    ) {
        self.definition = definition
        self.fieldColumns = fieldColumns
        pushedKeys =
            (fieldColumns.enumerated().map { index, column in
                PushedKey(
                    column, column: index, isJSON: definition.jsonColumns.contains(column), target: references[column])
            } + [PushedKey("updatedAt", column: nil)]).sorted { $0.key < $1.key }
        self.references = references
        self.optionalReferences = optionalReferences
        self.rootCollection = rootCollection
        self.policy = policy
        quotedName = SQL.quote(definition.name)
        lookupSQL = "SELECT id << 1 | (isDirty != 0) FROM \(quotedName) WHERE serverId = ?"
        lookupHoldingSQL =
            "SELECT id << 2 | ((isDirty != 0) << 1) | (serverVersion >= ?2) FROM \(quotedName) WHERE serverId = ?1"
        let everyField = fieldColumns + (definition.foreignKey.map { [$0] } ?? [])
        let quotedName = quotedName
        insertRowsSQL = Dictionary(
            uniqueKeysWithValues: StatementRows.groupSizes.map {
                ($0, Self.insertSQL(quotedName, columns: everyField, rows: $0))
            })
        lookupRowsSQL = Dictionary(
            uniqueKeysWithValues: StatementRows.groupSizes.map {
                (
                    $0,
                    "SELECT serverId, id, isDirty != 0, serverVersion FROM \(quotedName) WHERE serverId IN "
                        + StatementRows.placeholders(rows: 1, columns: $0)
                )
            })
    }

    /// `INSERT INTO table (columns…, serverId, isDirty, updatedAt, isShared, localRevision, serverVersion)
    /// VALUES (?, …)`, with as many rows of values as `rows`.
    static func insertSQL(_ quotedName: String, columns: [String], rows: Int = 1) -> String {
        let all = columns + ["serverId", "isDirty", "updatedAt", "isShared", "localRevision", "serverVersion"]
        return "INSERT INTO \(quotedName) (\(all.map(SQL.quote).joined(separator: ", "))) VALUES "
            + StatementRows.placeholders(rows: rows, columns: all.count)
    }

    /// Field-level tables keep a time per field (`tandem_field`) and merge on the server.
    var mergesFields: Bool {
        if case .fieldLevel = policy { true } else { false }
    }

    /// Whether the last server version's fields are kept, as the base of three-way merges.
    /// Last-write-wins compares whole rows by time and needs no base.
    var keepsServerFields: Bool {
        if case .lastWriteWins = policy { false } else { true }
    }

    /// Whether a synced row of this table has a bookkeeping row (`tandem_row`): when the
    /// table keeps the server's fields, or is nested (the row's collection is recorded, since
    /// it depends on its parent, which may be gone when the row's delete is pushed). A synced
    /// row of a root table that does not merge holds all its sync state itself.
    var recordsSyncedRows: Bool { keepsServerFields || parentTable != nil }

    /// Manual tables keep conflicts for the app (`tandem_conflict`).
    var isManual: Bool {
        if case .manual = policy { true } else { false }
    }

    var name: String { definition.name }
    var parentTable: String? { definition.parentTable }
    var foreignKey: String? { definition.foreignKey }

    /// Columns whose change marks a row dirty: the fields and the parent foreign key.
    var trackedColumns: [String] { fieldColumns + (foreignKey.map { [$0] } ?? []) }
}

/// Small SQL helpers.
enum SQL {
    /// `"name"`, with embedded quotes doubled.
    static func quote(_ identifier: String) -> String {
        "\"" + doubling(identifier, "\"") + "\""
    }

    /// `'text'`, with embedded quotes doubled.
    static func literal(_ text: String) -> String {
        "'" + doubling(text, "'") + "'"
    }

    /// Doubles every `quote` (on hot paths: no Foundation, no copy when there is none).
    private static func doubling(_ text: String, _ quote: Character) -> String {
        guard text.contains(quote) else { return text }
        var result = ""
        for character in text {
            result.append(character)
            if character == quote { result.append(quote) }
        }
        return result
    }
}
