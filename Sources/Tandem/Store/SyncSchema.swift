import GRDB
import TandemWire

/// Installs what Tandem needs in the app's database: its sync columns on each synced table,
/// the triggers that notice local writes, and its own metadata tables.
///
/// Why triggers: they run inside the app's own transaction, whatever API wrote the row
/// (records, raw SQL, another library), so a local change can never commit without being
/// marked for sync, and nothing has to be remembered by the app.
///
/// - An insert by the app (no `serverId` yet) marks the row dirty and stamps `updatedAt`.
/// - An update by the app of a synced column marks the row dirty, stamps `updatedAt` and
///   bumps `localRevision`. Tandem's own updates bump `localRevision` themselves, which is how
///   the trigger tells them apart: an update that leaves `localRevision` alone is the app's.
/// - A delete by the app of a row known to the server files the delete in `tandem_row`,
///   so that it is pushed; the row itself is gone at once, as the app expects. Tandem's own
///   deletes set `isDeleted` first and are not filed.
/// - An update that would put back a stale `localRevision` or `serverId` (a record type that
///   encodes Tandem's columns and saved an old copy) is refused with an explanation.
///
/// `updatedAt` comes from `tandem_now()`, a SQL function that reads the sync service's clock.
enum SyncSchema {
    static let syncColumns: [(name: String, definition: String)] = [
        ("serverId", "TEXT"),
        ("isDirty", "INTEGER NOT NULL DEFAULT 1"),
        ("updatedAt", "INTEGER NOT NULL DEFAULT 0"),
        ("isDeleted", "INTEGER NOT NULL DEFAULT 0"),
        ("isShared", "INTEGER NOT NULL DEFAULT 0"),
        ("localRevision", "INTEGER NOT NULL DEFAULT 0"),
    ]

    static var syncColumnNames: Set<String> { Set(syncColumns.map(\.name)) }

    static func installMetadata(_ db: Database) throws {
        try db.execute(
            sql: """
                CREATE TABLE IF NOT EXISTS tandem_row (
                    tableName TEXT NOT NULL,
                    rowId INTEGER NOT NULL,
                    serverId TEXT,
                    collection TEXT,
                    serverVersion INTEGER NOT NULL DEFAULT 0,
                    serverFields TEXT,
                    pendingOp TEXT,
                    idempotencyKey TEXT,
                    pushedRevision INTEGER,
                    attempts INTEGER NOT NULL DEFAULT 0,
                    state TEXT NOT NULL DEFAULT 'pending',
                    lastError TEXT,
                    PRIMARY KEY (tableName, rowId)
                );
                CREATE INDEX IF NOT EXISTS tandem_row_deletes ON tandem_row(pendingOp) WHERE pendingOp = 'delete';
                CREATE INDEX IF NOT EXISTS tandem_row_failed ON tandem_row(state) WHERE state = 'failed';
                CREATE INDEX IF NOT EXISTS tandem_row_server ON tandem_row(tableName, serverId);
                CREATE INDEX IF NOT EXISTS tandem_row_creates ON tandem_row(idempotencyKey) WHERE pendingOp = 'create';
                CREATE TABLE IF NOT EXISTS tandem_listener (
                    collection TEXT PRIMARY KEY NOT NULL,
                    resumeToken TEXT,
                    resetting INTEGER NOT NULL DEFAULT 0
                );
                CREATE TABLE IF NOT EXISTS tandem_reset_seen (
                    collection TEXT NOT NULL,
                    serverId TEXT NOT NULL,
                    PRIMARY KEY (collection, serverId)
                ) WITHOUT ROWID;
                CREATE TABLE IF NOT EXISTS tandem_deferred (
                    collection TEXT NOT NULL,
                    serverId TEXT NOT NULL,
                    tableName TEXT NOT NULL,
                    parentRowId INTEGER,
                    document TEXT NOT NULL,
                    waitingTable TEXT NOT NULL,
                    waitingServerId TEXT NOT NULL,
                    PRIMARY KEY (collection, serverId)
                );
                CREATE INDEX IF NOT EXISTS tandem_deferred_waiting ON tandem_deferred(waitingTable, waitingServerId);
                CREATE TABLE IF NOT EXISTS tandem_reference (
                    tableName TEXT NOT NULL,
                    rowId INTEGER NOT NULL,
                    columnName TEXT NOT NULL,
                    targetTable TEXT NOT NULL,
                    targetServerId TEXT NOT NULL,
                    PRIMARY KEY (tableName, rowId, columnName)
                );
                CREATE INDEX IF NOT EXISTS tandem_reference_target ON tandem_reference(targetTable, targetServerId);
                CREATE TABLE IF NOT EXISTS tandem_field (
                    tableName TEXT NOT NULL,
                    rowId INTEGER NOT NULL,
                    field TEXT NOT NULL,
                    time INTEGER NOT NULL,
                    PRIMARY KEY (tableName, rowId, field)
                ) WITHOUT ROWID;
                CREATE TABLE IF NOT EXISTS tandem_conflict (
                    tableName TEXT NOT NULL,
                    rowId INTEGER NOT NULL,
                    serverId TEXT NOT NULL,
                    collection TEXT NOT NULL,
                    local TEXT NOT NULL,
                    server TEXT NOT NULL,
                    base TEXT,
                    fields TEXT NOT NULL,
                    detectedAt INTEGER NOT NULL,
                    PRIMARY KEY (tableName, rowId)
                );
                CREATE TABLE IF NOT EXISTS tandem_meta (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL);
                -- Documents this device knows are deleted at a version (its own acknowledged
                -- deletes, deletes a conflict answer reported) whose tombstone its listener has
                -- not brought yet: a snapshot queued before the delete must not bring them back.
                CREATE TABLE IF NOT EXISTS tandem_gone (
                    collection TEXT NOT NULL,
                    serverId TEXT NOT NULL,
                    version INTEGER NOT NULL,
                    PRIMARY KEY (collection, serverId)
                ) WITHOUT ROWID;
                """)
    }

    /// Checks the registered tables against the schema, adds sync columns, indexes and
    /// triggers, and returns the tables in push order (parents first).
    static func install(_ db: Database, tables: [SyncTable], defaultPolicy: ConflictPolicy) throws -> [TableModel] {
        try installMetadata(db)
        let byName = Dictionary(tables.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        guard byName.count == tables.count else {
            throw TandemError(.invalidArgument, "a table is registered twice")
        }
        var models: [TableModel] = []
        for table in try pushOrder(tables, byName) {
            models.append(try install(db, table, byName, defaultPolicy: defaultPolicy))
        }
        return models
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
        columns = try db.columns(in: table.name)
        try db.execute(
            sql: """
                CREATE UNIQUE INDEX IF NOT EXISTS \(SQL.quote("tandem_\(table.name)_serverId")) ON \(quoted)(serverId);
                CREATE INDEX IF NOT EXISTS \(SQL.quote("tandem_\(table.name)_dirty")) ON \(quoted)(isDirty) WHERE isDirty = 1;
                """)

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
        var rootCollection: CollectionPath?
        if case .root(let collection) = table.location {
            do { rootCollection = try CollectionPath(collection) } catch {
                throw TandemError(.invalidArgument, "table \(table.name): \(error.message)")
            }
        }
        if case .nested(_, _, let name) = table.location, (try? CollectionPath("x/y/\(name)")) == nil {
            throw TandemError(.invalidArgument, "table \(table.name): '\(name)' is not a valid collection name")
        }
        let excluded = syncColumnNames.union(["id"]).union(table.localColumns).union(
            table.foreignKey.map { [$0] } ?? [])
        let fieldColumns = columns.map(\.name).filter { !excluded.contains($0) }
        let model = TableModel(
            definition: table, fieldColumns: fieldColumns, references: references, optionalReferences: optional,
            rootCollection: rootCollection, policy: table.policy ?? defaultPolicy)
        try installTriggers(db, model)
        return model
    }

    private static func installTriggers(_ db: Database, _ model: TableModel) throws {
        let table = model.quotedName
        let name = model.name
        let literal = SQL.literal(name)
        let trigger = { (suffix: String) in SQL.quote("tandem_\(name)_\(suffix)") }
        let tracked = model.trackedColumns.map(SQL.quote).joined(separator: ", ")
        let explanation = SQL.literal(
            "Tandem: the sync columns of \(name) (serverId, localRevision) are maintained by Tandem; "
                + "leave them out of the columns your record encodes")
        for suffix in ["insert", "update", "guard", "delete", "references"] {
            try db.execute(sql: "DROP TRIGGER IF EXISTS \(trigger(suffix))")
        }

        // Field-level tables keep when each field was last written here. These statements run
        // after the row's `updatedAt` was stamped, and read it. (An upsert, not INSERT OR
        // REPLACE: inside a trigger, SQLite lets the outer statement's conflict handling
        // override an OR clause, and a foreign key action turns REPLACE into ABORT.)
        var insertTimes = ""
        var updateTimes = ""
        if model.mergesFields {
            insertTimes = model.fieldColumns.map { column in
                """
                INSERT INTO tandem_field (tableName, rowId, field, time)
                SELECT \(literal), NEW.id, \(SQL.literal(column)), updatedAt FROM \(table) WHERE id = NEW.id
                ON CONFLICT (tableName, rowId, field) DO UPDATE SET time = excluded.time;
                """
            }.joined(separator: "\n")
            updateTimes = model.fieldColumns.map { column in
                """
                INSERT INTO tandem_field (tableName, rowId, field, time)
                SELECT \(literal), NEW.id, \(SQL.literal(column)), updatedAt FROM \(table)
                WHERE id = NEW.id AND NEW.\(SQL.quote(column)) IS NOT OLD.\(SQL.quote(column))
                ON CONFLICT (tableName, rowId, field) DO UPDATE SET time = excluded.time;
                """
            }.joined(separator: "\n")
        }

        try db.execute(
            sql: """
                CREATE TRIGGER \(trigger("insert")) AFTER INSERT ON \(table)
                WHEN NEW.serverId IS NULL
                BEGIN
                    UPDATE \(table) SET isDirty = 1, updatedAt = tandem_now(), localRevision = NEW.localRevision + 1
                    WHERE id = NEW.id;
                    \(insertTimes)
                END;
                CREATE TRIGGER \(trigger("guard")) BEFORE UPDATE ON \(table)
                WHEN NEW.localRevision NOT IN (OLD.localRevision, OLD.localRevision + 1)
                    OR (OLD.serverId IS NOT NULL AND NEW.serverId IS NOT OLD.serverId
                        AND NEW.localRevision = OLD.localRevision)
                BEGIN
                    SELECT RAISE(ABORT, \(explanation));
                END;
                CREATE TRIGGER \(trigger("delete")) AFTER DELETE ON \(table)
                WHEN OLD.isDeleted = 0
                BEGIN
                    UPDATE tandem_row SET pendingOp = 'delete', idempotencyKey = NULL, attempts = 0,
                        state = 'pending', lastError = NULL
                    WHERE tableName = \(literal) AND rowId = OLD.id AND OLD.serverId IS NOT NULL;
                    DELETE FROM tandem_field WHERE tableName = \(literal) AND rowId = OLD.id;
                    DELETE FROM tandem_conflict WHERE tableName = \(literal) AND rowId = OLD.id;
                END;
                """)
        if !model.references.isEmpty {
            // The app set a reference itself: what the row waited for no longer matters.
            let columns = model.references.keys.sorted().map(SQL.quote).joined(separator: ", ")
            try db.execute(
                sql: """
                    CREATE TRIGGER \(trigger("references")) AFTER UPDATE OF \(columns) ON \(table)
                    WHEN NEW.localRevision = OLD.localRevision
                    BEGIN
                        DELETE FROM tandem_reference WHERE tableName = \(literal) AND rowId = NEW.id;
                    END;
                    """)
        }
        if !tracked.isEmpty {
            try db.execute(
                sql: """
                    CREATE TRIGGER \(trigger("update")) AFTER UPDATE OF \(tracked) ON \(table)
                    WHEN NEW.localRevision = OLD.localRevision
                    BEGIN
                        UPDATE \(table) SET isDirty = 1, updatedAt = tandem_now(), localRevision = OLD.localRevision + 1
                        WHERE id = NEW.id;
                        UPDATE tandem_row SET state = 'pending', attempts = 0, lastError = NULL
                        WHERE tableName = \(literal) AND rowId = NEW.id AND state = 'failed';
                        \(updateTimes)
                    END;
                    """)
        }
    }
}
