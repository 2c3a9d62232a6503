import GRDB
import TandemWire

/// Checks the registered tables against the app's schema and adds Tandem's sync columns and
/// indexes to them. Tandem's own tables come from ``SyncLedger/migrator``, and the triggers
/// that record the app's writes from ``SyncLedger/installTriggers(_:_:)``, which says what each
/// of them does.
enum SyncSchema {
    static let syncColumns: [(name: String, definition: String)] = [
        ("serverId", "TEXT"),
        ("isDirty", "INTEGER NOT NULL DEFAULT 1"),
        ("updatedAt", "INTEGER NOT NULL DEFAULT 0"),
        ("isDeleted", "INTEGER NOT NULL DEFAULT 0"),
        ("isShared", "INTEGER NOT NULL DEFAULT 0"),
        ("localRevision", "INTEGER NOT NULL DEFAULT 0"),
        // The server version the row holds (0: none yet). Kept on the row, not in Tandem's
        // bookkeeping, so that a synced row of a root table that does not merge needs no
        // bookkeeping row at all (see ``SyncLedger``).
        ("serverVersion", "INTEGER NOT NULL DEFAULT 0"),
    ]

    static var syncColumnNames: Set<String> { Set(syncColumns.map(\.name)) }

    /// Checks the registered tables against the schema, adds sync columns, indexes and
    /// triggers, and returns the tables in push order (parents first).
    static func install(_ db: Database, tables: [SyncTable], defaultPolicy: ConflictPolicy) throws -> [TableModel] {
        let byName = Dictionary(tables.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        guard byName.count == tables.count else {
            throw TandemError(.invalidArgument, "a table is registered twice")
        }
        let ordered = try pushOrder(tables, byName)
        for table in ordered { try checkDepth(table, byName) }
        var models: [TableModel] = []
        for table in ordered {
            models.append(try install(db, table, byName, defaultPolicy: defaultPolicy))
        }
        return models
    }

    /// A table nested so deep that its collections' paths would be longer than a path may be:
    /// its rows could never be pushed or listened to.
    private static func checkDepth(_ table: SyncTable, _ byName: [String: SyncTable]) throws {
        var chain = [table.name]
        var current = table
        while let parent = current.parentTable, let next = byName[parent] {
            chain.append(parent)
            current = next
        }
        // Each nesting adds two segments to its root's path (the parent's id, the name).
        guard case .root(let root) = current.location else { return }
        let segments = root.split(separator: "/").count + 2 * (chain.count - 1)
        guard segments > CollectionPath.maxSegments else { return }
        throw TandemError(
            .invalidArgument,
            "table \(table.name) nests too deep (\(chain.reversed().joined(separator: " → "))): its collection "
                + "paths would have \(segments) segments, and a path has at most \(CollectionPath.maxSegments)")
    }

    private static func pushOrder(_ tables: [SyncTable], _ byName: [String: SyncTable]) throws -> [SyncTable] {
        var ordered: [SyncTable] = []
        var placed: Set<String> = []
        func place(_ table: SyncTable, _ path: [String]) throws {
            if placed.contains(table.name) { return }
            if path.contains(table.name) {
                throw TandemError(
                    .invalidArgument, "tables nest in a cycle: \((path + [table.name]).joined(separator: " → "))")
            }
            if let parent = table.parentTable {
                guard let parentTable = byName[parent] else {
                    throw TandemError(
                        .invalidArgument, "table \(table.name) nests under \(parent), which is not registered")
                }
                try place(parentTable, path + [table.name])
            }
            placed.insert(table.name)
            ordered.append(table)
        }
        for table in tables { try place(table, []) }
        return ordered
    }

    private static func install(
        _ db: Database, _ table: SyncTable, _ byName: [String: SyncTable], defaultPolicy: ConflictPolicy
    ) throws -> TableModel {
        guard try db.tableExists(table.name) else {
            throw TandemError(
                .invalidArgument, "table \(table.name) does not exist; create it before starting the sync service")
        }
        var columns = try db.columns(in: table.name)
        guard let idColumn = columns.first(where: { $0.name == "id" }), idColumn.primaryKeyIndex == 1 else {
            throw TandemError(
                .invalidArgument, "table \(table.name) needs an `id INTEGER PRIMARY KEY AUTOINCREMENT` column")
        }
        let quoted = SQL.quote(table.name)
        let existing = Set(columns.map(\.name))
        for column in syncColumns where !existing.contains(column.name) {
            try db.execute(sql: "ALTER TABLE \(quoted) ADD COLUMN \(SQL.quote(column.name)) \(column.definition)")
        }
        if !existing.contains("serverVersion") {
            // A database from before the rows kept their server version: it was in the
            // bookkeeping, which has it still.
            try SyncLedger.moveServerVersions(to: table.name, db)
        }
        columns = try db.columns(in: table.name)
        try installIndexes(db, table)
        let (references, optional) = try checkReferences(of: table, columns, byName)
        let rootCollection = try checkLocation(of: table)
        _ = try table.scopeQuery(user: "")
        let excluded = syncColumnNames.union(["id"]).union(table.localColumns).union(
            table.foreignKey.map { [$0] } ?? [])
        let fieldColumns = columns.map(\.name).filter { !excluded.contains($0) }
        let model = TableModel(
            definition: table, fieldColumns: fieldColumns, references: references, optionalReferences: optional,
            rootCollection: rootCollection, policy: table.policy ?? defaultPolicy)
        try SyncLedger.installTriggers(db, model)
        return model
    }

    /// The server-id index leaves out the rows that have none yet (the app's inserts before
    /// their push): an app insert writes no entry, and an acknowledgement adds the server id's
    /// entry without first deleting the row's NULL one, about a tenth of its SQLite work
    /// (docs/BENCHMARKS.md). The lookups by server id (`serverId = ?`) use it all the same. An
    /// index made before, of every row, is made again once.
    private static func installIndexes(_ db: Database, _ table: SyncTable) throws {
        let quoted = SQL.quote(table.name)
        let serverIdIndex = "tandem_\(table.name)_serverId"
        let partial = try Bool.fetchOne(
            db, sql: "SELECT partial FROM pragma_index_list(?) WHERE name = ?", arguments: [table.name, serverIdIndex])
        if partial == false { try db.execute(sql: "DROP INDEX \(SQL.quote(serverIdIndex))") }
        try db.execute(
            sql: """
                CREATE UNIQUE INDEX IF NOT EXISTS \(SQL.quote(serverIdIndex)) ON \(quoted)(serverId)
                    WHERE serverId IS NOT NULL;
                CREATE INDEX IF NOT EXISTS \(SQL.quote("tandem_\(table.name)_dirty")) ON \(quoted)(isDirty) WHERE isDirty = 1;
                """)

    }

    /// The table's references and its foreign key name columns it has, and tables that sync.
    ///
    /// - Returns: The referenced table by column, and the columns that may be null.
    private static func checkReferences(
        of table: SyncTable, _ columns: [ColumnInfo], _ byName: [String: SyncTable]
    ) throws -> (references: [String: String], optional: Set<String>) {
        let names = Set(columns.map(\.name))
        var references: [String: String] = [:]
        var optional: Set<String> = []
        for reference in table.references {
            guard names.contains(reference.column) else {
                throw TandemError(
                    .invalidArgument,
                    "table \(table.name) has no column \(reference.column) to reference \(reference.table)")
            }
            guard byName[reference.table] != nil else {
                throw TandemError(
                    .invalidArgument,
                    "\(table.name).\(reference.column) references \(reference.table), which is not registered")
            }
            references[reference.column] = reference.table
            if !(columns.first { $0.name == reference.column }!.isNotNull) { optional.insert(reference.column) }
        }
        if let foreignKey = table.foreignKey {
            guard names.contains(foreignKey) else {
                throw TandemError(.invalidArgument, "table \(table.name) has no foreign key column \(foreignKey)")
            }
        }
        return (references, optional)
    }

    /// Where the table's documents go: a valid root collection or nested collection name, and
    /// no scope on a nested table (its rows follow their parent's).
    private static func checkLocation(of table: SyncTable) throws -> CollectionPath? {
        var rootCollection: CollectionPath?
        if case .root(let collection) = table.location {
            do { rootCollection = try CollectionPath(collection) } catch {
                throw TandemError(.invalidArgument, "table \(table.name): \(error.message)")
            }
        }
        if case .nested(_, _, let name) = table.location, (try? CollectionPath("x/y/\(name)")) == nil {
            throw TandemError(.invalidArgument, "table \(table.name): '\(name)' is not a valid collection name")
        }
        if table.parentTable != nil, !table.scope.isEmpty {
            throw TandemError(
                .invalidArgument, "table \(table.name) is nested: its rows follow their parent's, it takes no scope")
        }
        return rootCollection
    }
}
