import GRDB
import TandemWire

extension SyncLedger {
    /// Tandem's own tables, by version. Each migration is registered once and never changed;
    /// a change of the tables is a new migration. They run under Tandem's own identifiers
    /// (`tandem-1`, `tandem-2`, …) in GRDB's `grdb_migrations`, beside the app's, which they do
    /// not touch.
    ///
    /// - `tandem-1`: the tables as Tandem made them before versioned migrations (with `IF NOT
    ///   EXISTS`: a database from then already has them, and takes this one as done).
    /// - `tandem-2`: failed rows say why with a code (`errorCode`, a ``TandemError/Code``, and
    ///   `serverErrorCode` when the server refused); failures recorded before get the code their
    ///   message shows.
    /// - `tandem-3`: scoped tables. A conflict says why it is open (`reason`: `changed`, or
    ///   `left-scope` for a row whose document left its table's scope while it had unpushed
    ///   changes), and `tandem_row.outOfScope` marks such a row until it can go.
    /// - `tandem-4`: `tandem_row`'s index by server id leaves out the entries without one,
    ///   which are those of rows whose create is on its way: recording a create's key and
    ///   forgetting it at the acknowledgement each write one index fewer (about 6 % of `bench
    ///   throughput`). The lookups by server id (`serverId = ?`) still use it. (Most creates
    ///   on their way have no `tandem_row` entry at all: see `tandem-5`.)
    /// - `tandem-5`: `tandem_sending`, the creates of a batch on their way, recorded as one
    ///   entry per table and batch instead of a `tandem_row` entry per row (see
    ///   ``SyncLedger/recordSending(_:under:_:_:)``).
    ///
    /// The triggers are not versioned: they follow the app's tables and are made again each
    /// time the service starts (``installTriggers(_:_:)``).
    static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("tandem-1", foreignKeyChecks: .immediate) { db in
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
        migrator.registerMigration("tandem-2", foreignKeyChecks: .immediate) { db in
            try db.execute(
                sql: """
                    ALTER TABLE tandem_row ADD COLUMN errorCode TEXT;
                    ALTER TABLE tandem_row ADD COLUMN serverErrorCode TEXT;
                    UPDATE tandem_row SET errorCode = CASE
                        WHEN lastError LIKE 'the row moved to another parent%' THEN 'invalid-argument'
                        WHEN lastError LIKE 'duplicate:%' THEN 'database'
                        WHEN attempts > 0 THEN 'disconnected'
                        ELSE 'server' END
                    WHERE state = 'failed' OR lastError IS NOT NULL;
                    UPDATE tandem_row SET serverErrorCode = 'conflict'
                    WHERE state = 'failed' AND lastError LIKE 'the server refused the create%';
                    """)
        }
        migrator.registerMigration("tandem-3", foreignKeyChecks: .immediate) { db in
            try db.execute(
                sql: """
                    ALTER TABLE tandem_conflict ADD COLUMN reason TEXT NOT NULL DEFAULT 'changed';
                    ALTER TABLE tandem_row ADD COLUMN outOfScope INTEGER NOT NULL DEFAULT 0;
                    CREATE INDEX tandem_row_out_of_scope ON tandem_row(outOfScope) WHERE outOfScope = 1;
                    """)
        }
        migrator.registerMigration("tandem-4", foreignKeyChecks: .immediate) { db in
            try db.execute(
                sql: """
                    DROP INDEX tandem_row_server;
                    CREATE INDEX tandem_row_server ON tandem_row(tableName, serverId) WHERE serverId IS NOT NULL;
                    """)
        }
        migrator.registerMigration("tandem-5", foreignKeyChecks: .immediate) { db in
            try db.execute(
                sql: """
                    -- The creates of one batch, of one table, sent and not answered yet: each
                    -- went out under the key `key-rowId`. `rows` is a JSON object from each
                    -- row id to the localRevision its create carried; firstRowId and lastRowId
                    -- bound them, so that the delete trigger reads the object only for a row
                    -- that may be in it.
                    CREATE TABLE tandem_sending (
                        key TEXT PRIMARY KEY NOT NULL,
                        tableName TEXT NOT NULL,
                        firstRowId INTEGER NOT NULL,
                        lastRowId INTEGER NOT NULL,
                        rows TEXT NOT NULL
                    ) WITHOUT ROWID;
                    """)
        }
        return migrator
    }

    /// Makes the triggers that record the app's own writes of `model`'s table.
    ///
    /// Why triggers: they run inside the app's own transaction, whatever API wrote the row
    /// (records, raw SQL, another library), so a local change can never commit without being
    /// marked for sync, and nothing has to be remembered by the app.
    ///
    /// - An insert by the app (no `serverId` yet) marks the row dirty and stamps `updatedAt`.
    /// - An update by the app of a synced column marks the row dirty, stamps `updatedAt` and
    ///   bumps `localRevision`; a failed row becomes pending again. Tandem's own updates bump
    ///   `localRevision` themselves, which is how the trigger tells them apart: an update that
    ///   leaves `localRevision` alone is the app's.
    /// - A delete by the app of a row known to the server files the delete in `tandem_row`, with
    ///   the document's id, collection and version, so that it is pushed; the row itself is gone
    ///   at once, as the app expects. Tandem's own deletes set `isDeleted` first and are not
    ///   filed. A row whose create is on its way in a batch (`tandem_sending`) gets the entry of
    ///   a sent create instead, which its answer, or its document, turns into a filed delete.
    /// - An update that would put back a stale `localRevision`, `serverId` or `serverVersion` (a
    ///   record type that encodes Tandem's columns and saved an old copy) is refused with an
    ///   explanation.
    ///
    /// `updatedAt` comes from `tandem_now()`, a SQL function that reads the sync service's clock.
    static func installTriggers(_ db: Database, _ model: TableModel) throws {
        let table = model.quotedName
        let name = model.name
        let literal = SQL.literal(name)
        let trigger = { (suffix: String) in SQL.quote("tandem_\(name)_\(suffix)") }
        let tracked = model.trackedColumns.map(SQL.quote).joined(separator: ", ")
        let explanation = SQL.literal(
            "Tandem: the sync columns of \(name) (serverId, serverVersion, localRevision) are maintained by Tandem; "
                + "leave them out of the columns your record encodes")
        for suffix in ["insert", "update", "guard", "delete", "references"] {
            try db.execute(sql: "DROP TRIGGER IF EXISTS \(trigger(suffix))")
        }

        let (insertTimes, updateTimes) = fieldTimeStatements(model)
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
                    OR (NEW.localRevision = OLD.localRevision
                        AND ((OLD.serverId IS NOT NULL AND NEW.serverId IS NOT OLD.serverId)
                            OR NEW.serverVersion IS NOT OLD.serverVersion))
                BEGIN
                    SELECT RAISE(ABORT, \(explanation));
                END;
                \(deleteTrigger(model, named: trigger("delete")))
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
                        UPDATE tandem_row SET state = 'pending', attempts = 0, errorCode = NULL, serverErrorCode = NULL,
                            lastError = NULL
                        WHERE tableName = \(literal) AND rowId = NEW.id AND state = 'failed';
                        \(updateTimes)
                    END;
                    """)
        }
    }

    /// Field-level tables keep when each field was last written here. These statements run
    /// after the row's `updatedAt` was stamped, and read it. (An upsert, not INSERT OR REPLACE:
    /// inside a trigger, SQLite lets the outer statement's conflict handling override an OR
    /// clause, and a foreign key action turns REPLACE into ABORT.)
    private static func fieldTimeStatements(_ model: TableModel) -> (insert: String, update: String) {
        guard model.mergesFields else { return ("", "") }
        let (table, literal) = (model.quotedName, SQL.literal(model.name))
        let insert = model.fieldColumns.map { column in
            """
            INSERT INTO tandem_field (tableName, rowId, field, time)
            SELECT \(literal), NEW.id, \(SQL.literal(column)), updatedAt FROM \(table) WHERE id = NEW.id
            ON CONFLICT (tableName, rowId, field) DO UPDATE SET time = excluded.time;
            """
        }.joined(separator: "\n")
        let update = model.fieldColumns.map { column in
            """
            INSERT INTO tandem_field (tableName, rowId, field, time)
            SELECT \(literal), NEW.id, \(SQL.literal(column)), updatedAt FROM \(table)
            WHERE id = NEW.id AND NEW.\(SQL.quote(column)) IS NOT OLD.\(SQL.quote(column))
            ON CONFLICT (tableName, rowId, field) DO UPDATE SET time = excluded.time;
            """
        }.joined(separator: "\n")
        return (insert, update)
    }

    /// The trigger that files the app's delete of a synced row (see ``installTriggers(_:_:)``).
    private static func deleteTrigger(_ model: TableModel, named trigger: String) -> String {
        let (table, literal) = (model.quotedName, SQL.literal(model.name))
        // A filed delete needs the document's collection: a root table's is known; a nested
        // table's was recorded when the row synced (see ``TableModel/recordsSyncedRows``).
        let collection = model.rootCollection.map { SQL.literal($0.rawValue) } ?? "NULL"
        return """
            CREATE TRIGGER \(trigger) AFTER DELETE ON \(table)
            WHEN OLD.isDeleted = 0
            BEGIN
                INSERT INTO tandem_row (tableName, rowId, serverId, collection, serverVersion, pendingOp, state)
                SELECT \(literal), OLD.id, OLD.serverId, \(collection), OLD.serverVersion, 'delete', 'pending'
                WHERE OLD.serverId IS NOT NULL
                ON CONFLICT (tableName, rowId) DO UPDATE SET serverId = excluded.serverId,
                    collection = COALESCE(excluded.collection, collection), serverVersion = excluded.serverVersion,
                    pendingOp = 'delete', idempotencyKey = NULL, attempts = 0, state = 'pending', errorCode = NULL,
                    serverErrorCode = NULL, lastError = NULL, outOfScope = 0;
                INSERT INTO tandem_row (tableName, rowId, pendingOp, idempotencyKey, pushedRevision)
                SELECT \(literal), OLD.id, 'create', listed.key || '-' || OLD.id, listed.revision
                FROM (
                    SELECT s.key, json_extract(s.rows, '$."' || OLD.id || '"') AS revision FROM tandem_sending AS s
                    WHERE OLD.serverId IS NULL AND s.tableName = \(literal)
                        AND OLD.id BETWEEN s.firstRowId AND s.lastRowId
                ) AS listed
                WHERE listed.revision IS NOT NULL
                ON CONFLICT (tableName, rowId) DO NOTHING;
                DELETE FROM tandem_field WHERE tableName = \(literal) AND rowId = OLD.id;
                DELETE FROM tandem_conflict WHERE tableName = \(literal) AND rowId = OLD.id;
            END;
            """
    }
}
