import GRDB
import TandemWire

/// A registered ``SyncTable`` checked against the database schema: which columns become
/// document fields, which are references, where rows go.
struct TableModel: Sendable {
    let definition: SyncTable
    /// Columns copied into documents (references included, the parent foreign key not).
    let fieldColumns: [String]
    /// Reference column → target table.
    let references: [String: String]
    /// Reference columns that accept NULL: a missing target is filled in when it arrives.
    let optionalReferences: Set<String>
    /// For root tables, the collection.
    let rootCollection: CollectionPath?
    /// How conflicts on this table are settled.
    let policy: ConflictPolicy

    /// Field-level tables keep a time per field (`tandem_field`) and merge on the server.
    var mergesFields: Bool {
        if case .fieldLevel = policy { true } else { false }
    }

    /// Whether the last server version's fields are kept, as the base of three-way merges.
    /// Last-write-wins compares whole rows by time and needs no base.
    var keepsServerFields: Bool {
        if case .lastWriteWins = policy { false } else { true }
    }

    /// Manual tables keep conflicts for the app (`tandem_conflict`).
    var isManual: Bool {
        if case .manual = policy { true } else { false }
    }

    var name: String { definition.name }
    var quotedName: String { SQL.quote(name) }
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
