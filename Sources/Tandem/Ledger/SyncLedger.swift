import GRDB
import TandemSQLite
import TandemWire

/// Tandem's bookkeeping: the one place that reads and writes the sync state of the app's rows.
///
/// It owns Tandem's tables (`tandem_*`, created and changed only by its versioned migrations,
/// see `SyncLedger+Schema.swift`), the triggers that record the app's own writes, and the
/// sync columns of the app's tables (`serverId`, `isDirty`, `localRevision`, `isDeleted`)
/// where they change without the row's content. The push, the listener and the conflict code
/// (`Reconciler`) decide what happens; every change of sync state they make is one of the
/// transitions below, made here. Content writes (a server document into a row, a merge) set
/// `isDirty` and `localRevision` with the content, and then record here what they made.
///
/// ## The states of a synced row
///
/// | state | app row | `tandem_row` |
/// |---|---|---|
/// | local-only | not shared (or its parent does not sync) | none |
/// | dirty | `isDirty = 1` | none, or kept from before with `pendingOp` NULL |
/// | sent | `isDirty = 1` | `pendingOp` create/update, `idempotencyKey`, `pushedRevision`; for the create of a row that had no entry: none, and the row is listed in its batch's `tandem_sending` entry (key `batchKey-rowId`, the revision) |
/// | synced | `isDirty = 0`, `serverId`, `serverVersion` | none; for a table that merges or is nested (``TableModel/recordsSyncedRows``): `state = 'synced'`, `collection`, `serverFields` for merging tables |
/// | failed | as it was | `state = 'failed'`, `errorCode`, `lastError`, `attempts` |
/// | deleted, not pushed | gone | `pendingOp = 'delete'`, `serverId`, `collection`, `serverVersion` (its key once sent) |
/// | in conflict (manual tables; or out of scope, any table) | as it was | as it was, and a `tandem_conflict` row |
/// | out of scope | as it was | `outOfScope = 1` (and, until the app resolves it, a `left-scope` conflict) |
///
/// The row's `serverVersion` is the version of the document it holds (the base of its next
/// push, and what tells an echo of its own write). `tandem_row.serverVersion` is read only for
/// a filed delete, whose row is gone: the delete trigger copies it from the row. A row without
/// an entry that fails, or leaves its scope, gets one (``fail(_:_:_:_:)``,
/// ``markOutOfScope(_:rowId:_:)``), which stays until the row is synced and in scope.
///
/// ## Transitions, and what makes each
///
/// - **app insert / update** (trigger): local-only or synced → dirty, `updatedAt` stamped,
///   `localRevision` + 1; failed → dirty again on any edit of a tracked column.
/// - **app delete** (trigger): a row the server knows → deleted, not pushed; its field times
///   and conflict go.
/// - ``recordSending(_:_:_:)`` (push): dirty → sent, with the key recorded before anything
///   goes out, so that a resend after a crash carries it; ``recordSending(_:under:_:_:)`` for
///   the creates of rows without an entry, one batch entry for them all. A batch entry goes at
///   the acknowledgement (``sendingAnswered(_:_:)``); any other answer, or none (found at the
///   next push, or by the listener before it applies anything), turns it into the entries of
///   sent rows (``keepSendingPerRow(_:keys:_:)``), and an app delete of a listed row gives that
///   row its entry (the delete trigger).
/// - ``acknowledge(_:_:_:)`` (`ack`): sent → synced, or back to dirty when the row changed
///   after it was sent (`localRevision` moved past `pushedRevision`); a row deleted meanwhile →
///   deleted, not pushed. ``forget(_:_:_:)`` ends a deleted row's bookkeeping once its delete is
///   acknowledged, and ``rememberGone(_:_:version:_:)`` keeps its version until its tombstone
///   arrives.
/// - ``rebase(_:_:on:_:)`` (`conflict` answer, conflict settled for the local side): sent →
///   dirty, at the server's version, under a new key.
/// - ``fail(_:_:_:_:)`` (a refusal resending cannot fix) and ``countFailedAttempt(_:_:maxAttempts:_:)``
///   (a failure that may pass: failed after `maxAttempts`) → failed; ``retryFailed(_:)`` → dirty.
/// - ``recordSynced(_:rowId:_:_:)`` (a listener's document written into the row, or the
///   server's side taken in a conflict) → synced. ``adoptOwnCreate(_:rowId:serverId:collection:keepsLocal:_:)``
///   (a document carrying the key of one of this device's unanswered creates) → synced, or
///   dirty when the row changed since; ``fileDeleteOfOwnCreate(_:rowId:serverId:collection:version:_:)``
///   when that row was deleted here meanwhile.
/// - ``removeRow(_:id:_:)`` (a remote delete, a reset): any state → gone, bookkeeping and all.
///   A row of a scoped table that its acknowledgement left synced, with its document outside
///   the scope or withheld from its user (this device wrote it there), goes quietly, as a row
///   that leaves the scope clean does, or, while rows under it wait to be pushed, → out of
///   scope without a conflict (`Reconciler.recordAcknowledgement`).
/// - ``recordConflict(_:of:_:)`` (manual
///   tables): → in conflict; ``takeConflict(_:rowId:_:)`` when the app resolves it.
/// - ``markOutOfScope(_:rowId:_:)`` (a scoped table's document left the scope while the row, or
///   one under it, had unpushed changes): → out of scope, with a `left-scope` conflict; without
///   one for a row written outside the scope whose nested rows wait (above).
///   ``backInScope(_:rowId:_:)`` when the document comes back; the row goes (quietly, like a row
///   that leaves the scope clean) once nothing under it waits to be pushed and the conflict is
///   resolved (``outOfScopeRows(_:)``).
///
/// Beside the row states it keeps: field times (`tandem_field`, field-level tables), references
/// and documents waiting for a row that has not arrived (`tandem_reference`, `tandem_deferred`),
/// resume tokens and resets (`tandem_listener`, `tandem_reset_seen`), documents known deleted
/// whose tombstones are on their way (`tandem_gone`), and the clock (`tandem_meta`).
struct SyncLedger: Sendable {
    // MARK: - Counts

    /// The status's counts: rows waiting to be pushed (failed ones and ones in conflict
    /// excluded), failed rows, and open conflicts. `syncs` is the SQL condition (on alias `t`)
    /// of each table's rows that sync or will.
    ///
    /// One statement: the status is read after every push and every snapshot that changed
    /// something, and on a `DatabaseQueue`, which reads without a transaction, a statement per
    /// count took a read lock of its own per count (two `fcntl` calls on the WAL's index).
    ///
    /// The dirty rows are counted through their index, less the few failed or in conflict,
    /// looked up by id, rather than probing both tables for every dirty row (at 100,000 dirty
    /// rows, 17 instead of 120 ms).
    func counts(_ tables: [(model: TableModel, syncs: String)], _ db: Database) throws
        -> (pending: Int, failed: Int, conflicts: Int)
    {
        let statement = try db.cachedStatement(sql: Self.countsSQL(tables))
        let row = try Row.fetchOne(statement, arguments: StatementArguments(tables.map(\.model.name)))
        return (row?[0] ?? 0, row?[1] ?? 0, row?[2] ?? 0)
    }

    /// The statement of ``counts(_:_:)``: table `i`'s name is parameter `i + 1`.
    static func countsSQL(_ tables: [(model: TableModel, syncs: String)]) -> String {
        let dirty = tables.enumerated().map { index, table in
            let quoted = table.model.quotedName
            return """
                (SELECT COUNT(*) FROM \(quoted) AS t WHERE t.isDirty = 1 AND \(table.syncs))
                    - (SELECT COUNT(*) FROM \(quoted) AS t WHERE t.isDirty = 1 AND \(table.syncs) AND t.id IN (
                        SELECT rowId FROM tandem_row WHERE state = 'failed' AND tableName = ?\(index + 1)
                        UNION SELECT rowId FROM tandem_conflict WHERE tableName = ?\(index + 1)))
                """
        }
        let deletes = "(SELECT COUNT(*) FROM tandem_row WHERE pendingOp = 'delete' AND state != 'failed')"
        return """
            SELECT \((dirty + [deletes]).joined(separator: "\n    + ")),
                (SELECT COUNT(*) FROM tandem_row WHERE state = 'failed'),
                (SELECT COUNT(*) FROM tandem_conflict)
            """
    }

    // MARK: - Clock

    /// The latest time this database has seen: the stored clock, and every stamped time.
    func latestTime(_ tables: [TableModel], _ db: Database) throws -> Int64 {
        var latest = try Int64.fetchOne(db, sql: "SELECT value FROM tandem_meta WHERE key = 'hlc'") ?? 0
        for model in tables {
            latest = max(latest, try Int64.fetchOne(db, sql: "SELECT MAX(updatedAt) FROM \(model.quotedName)") ?? 0)
        }
        return max(latest, try Int64.fetchOne(db, sql: "SELECT MAX(time) FROM tandem_field") ?? 0)
    }

    /// Stores the clock, so that it never goes back after a restart.
    func storeClock(_ latest: Int64, _ db: Database) throws {
        try db.cachedStatement(
            sql: """
                INSERT INTO tandem_meta (key, value) VALUES ('hlc', ?)
                ON CONFLICT (key) DO UPDATE SET value = MAX(value, excluded.value)
                """
        ).execute(arguments: [latest])
    }

    // MARK: - Listeners

    func resumeToken(for collection: CollectionPath, _ db: Database) throws -> String? {
        try String.fetchOne(
            db.cachedStatement(sql: "SELECT resumeToken FROM tandem_listener WHERE collection = ?"),
            arguments: [collection.rawValue])
    }

    func storeResumeToken(_ token: String, for collection: CollectionPath, _ db: Database) throws {
        try db.cachedStatement(
            sql: """
                INSERT INTO tandem_listener (collection, resumeToken) VALUES (?, ?)
                ON CONFLICT (collection) DO UPDATE SET resumeToken = excluded.resumeToken
                """
        ).execute(arguments: [collection.rawValue, token])
    }

    /// The device no longer holds anything of this collection (the row it is under left a
    /// scoped table): its listener's token and reset state go, so that holding it again
    /// starts from the whole collection, not from where the device left it.
    func forgetListener(_ collection: CollectionPath, _ db: Database) throws {
        for table in ["tandem_listener", "tandem_reset_seen", "tandem_gone"] {
            try db.execute(sql: "DELETE FROM \(table) WHERE collection = ?", arguments: [collection.rawValue])
        }
    }

    /// The server could not resume this listener: its token goes, and the documents the full
    /// snapshot brings are noted until it ends (``noteSeenInReset(_:_:_:)``).
    func beginReset(_ collection: CollectionPath, _ db: Database) throws {
        try db.execute(
            sql: """
                INSERT INTO tandem_listener (collection, resumeToken, resetting) VALUES (?, NULL, 1)
                ON CONFLICT (collection) DO UPDATE SET resumeToken = NULL, resetting = 1
                """, arguments: [collection.rawValue])
        try db.execute(sql: "DELETE FROM tandem_reset_seen WHERE collection = ?", arguments: [collection.rawValue])
    }

    func isResetting(_ collection: CollectionPath, _ db: Database) throws -> Bool {
        try Bool.fetchOne(
            db.cachedStatement(sql: "SELECT resetting FROM tandem_listener WHERE collection = ?"),
            arguments: [collection.rawValue]) ?? false
    }

    func noteSeenInReset(_ collection: CollectionPath, _ ids: some Sequence<DocumentID>, _ db: Database) throws {
        let statement = try db.cachedStatement(
            sql: "INSERT OR IGNORE INTO tandem_reset_seen (collection, serverId) VALUES (?, ?)")
        for id in ids { try statement.execute(arguments: [collection.rawValue, id.rawValue]) }
    }

    /// The full snapshot of a reset has arrived: the clean rows of `model` in the collection
    /// (under `parentRowId` for a nested table) that it did not bring, which the caller
    /// removes (with the rows under them, filing no deletes) before ``endReset(_:_:)``. Rows in
    /// `keeping` stay: a push wrote them after the server read the snapshot (a collection's
    /// last page, a query's view before its first frame; see `ResetWindow`).
    func resetLeftovers(
        _ model: TableModel, _ collection: CollectionPath, parentRowId: Int64?, keeping: Set<Int64>, _ db: Database
    ) throws -> [Int64] {
        var condition = "serverId IS NOT NULL AND isDirty = 0"
        var arguments: StatementArguments = []
        if let foreignKey = model.foreignKey {
            condition += " AND \(SQL.quote(foreignKey)) = ?"
            arguments += [parentRowId]
        }
        arguments += [collection.rawValue]
        return try Int64.fetchAll(
            db,
            sql: """
                SELECT id FROM \(model.quotedName) WHERE \(condition)
                AND serverId NOT IN (SELECT serverId FROM tandem_reset_seen WHERE collection = ?)
                """, arguments: arguments
        ).filter { !keeping.contains($0) }
    }

    /// The reset of the collection is over, its leftovers removed: the listener resumes as usual.
    func endReset(_ collection: CollectionPath, _ db: Database) throws {
        try db.execute(sql: "DELETE FROM tandem_reset_seen WHERE collection = ?", arguments: [collection.rawValue])
        // The full snapshot was the whole truth: nothing older can still be on its way.
        try db.execute(sql: "DELETE FROM tandem_gone WHERE collection = ?", arguments: [collection.rawValue])
        try db.execute(
            sql: "UPDATE tandem_listener SET resetting = 0 WHERE collection = ?", arguments: [collection.rawValue])
    }

    // MARK: - Finding rows

    /// The row of `model` with this server id: its local id, and whether it has unpushed changes.
    func lookup(_ model: TableModel, serverId: String, _ db: Database) throws -> (id: Int64, isDirty: Bool)? {
        // One integer, `id << 1 | (isDirty != 0)`, read straight from SQLite: on this
        // once-per-document path GRDB's fetch cost more than the index search itself.
        try db.cachedStatement(sql: model.lookupSQL).fetchInt64 { $0.bind(serverId) }
            .map { packed in (id: packed >> 1, isDirty: packed & 1 == 1) }
    }

    /// The row of `model` with this server id, as ``lookup(_:serverId:_:)`` finds it, and
    /// whether it holds `version` of its document or a newer one (then a change at `version`
    /// is the echo of this device's own write, or older, and brings nothing).
    func lookup(_ model: TableModel, serverId: String, holding version: Int64, _ db: Database) throws
        -> (id: Int64, isDirty: Bool, holdsVersion: Bool)?
    {
        let statement = try db.cachedStatement(sql: model.lookupHoldingSQL)
        return try statement.fetchInt64 { values in
            values.bind(serverId)
            values.bind(version)
        }.map { packed in
            (id: packed >> 2, isDirty: packed & 2 != 0, holdsVersion: packed & 1 != 0)
        }
    }

    /// A database from before the rows kept their server version (the column was just added to
    /// `table`): each row takes the version its bookkeeping row has.
    static func moveServerVersions(to table: String, _ db: Database) throws {
        try db.execute(
            sql: """
                UPDATE \(SQL.quote(table)) AS t SET serverVersion = m.serverVersion
                FROM tandem_row AS m WHERE m.tableName = ? AND m.rowId = t.id
                """, arguments: [table])
    }

    /// The last server fields this device saw of the row (kept for tables that merge).
    func knownServerFields(_ model: TableModel, rowId: Int64, _ db: Database) throws -> JSONObject? {
        guard
            let text = try String.fetchOne(
                db.cachedStatement(sql: "SELECT serverFields FROM tandem_row WHERE tableName = ? AND rowId = ?"),
                arguments: [model.name, rowId])
        else { return nil }
        return try Wire.decodeFields(Array(text.utf8))
    }

    /// What applying a snapshot of `collection` starts from, read in one statement: whether
    /// batch entries are recorded (creates sent and not answered, to be turned into row
    /// entries first), whether the collection is being reset, and what its changes need not
    /// look for. (Seven statements, one per question, were a fifth of the statements of a
    /// one-document apply.)
    ///
    /// The flags of the ``ApplyContext`` are read before any batch entry is turned into row
    /// entries: a caller that turns them sets ``ApplyContext/unansweredCreates``.
    func applyState(of collection: CollectionPath, _ db: Database) throws
        -> (sending: Bool, resetting: Bool, context: ApplyContext)
    {
        // Of any table: the conditions on `pendingOp` read the partial indexes on it, which hold
        // only rows with a pending create or delete (a condition on the table name would make
        // SQLite walk the primary key through every row of the table instead).
        let row = try Row.fetchOne(
            db.cachedStatement(
                sql: """
                    SELECT \(Self.anySendingSQL),
                        coalesce((SELECT resetting FROM tandem_listener WHERE collection = ?), 0),
                        EXISTS (SELECT 1 FROM tandem_row WHERE pendingOp = 'create'),
                        EXISTS (SELECT 1 FROM tandem_row WHERE pendingOp = 'delete'),
                        \(Self.anythingWaitsSQL),
                        EXISTS (SELECT 1 FROM tandem_gone),
                        \(Self.anyOutOfScopeSQL)
                    """), arguments: [collection.rawValue])!
        let context = ApplyContext(
            unansweredCreates: row[2], filedDeletes: row[3], waiting: row[4], gone: row[5], outOfScope: row[6])
        return (row[0], row[1], context)
    }

    // MARK: - Pushing

    /// Filed deletes after `cursor`, in order: table, row, server id, collection, server
    /// version, recorded key.
    func filedDeletes(after cursor: (table: String, rowId: Int64), limit: Int, _ db: Database) throws -> [Row] {
        try Row.fetchAll(
            db.cachedStatement(
                sql: """
                    SELECT tableName, rowId, serverId, collection, serverVersion, idempotencyKey FROM tandem_row
                    WHERE pendingOp = 'delete' AND state != 'failed' AND (tableName, rowId) > (?, ?)
                    ORDER BY tableName, rowId LIMIT ?
                    """), arguments: [cursor.table, cursor.rowId, limit])
    }

    /// The columns ``dirtyRows(_:syncs:after:limit:_:)`` reads before the row's field columns.
    static let dirtyRowColumns = 10

    /// Dirty rows of `model` after `rowId` that sync (`syncs`, on alias `t`), are not failed
    /// and not in conflict, with their bookkeeping: id, localRevision, updatedAt, serverId,
    /// parent foreign key, serverVersion, recorded key, recorded collection, pushedRevision,
    /// the entry's state (NULL when the row has no `tandem_row` entry), then the field columns.
    func dirtyRows(_ model: TableModel, syncs: String, after rowId: Int64, limit: Int, _ db: Database) throws
        -> RowCursor
    {
        let foreignKey = model.foreignKey.map { "t.\(SQL.quote($0))" } ?? "NULL"
        let columns =
            ([
                "t.id", "t.localRevision", "t.updatedAt", "t.serverId", foreignKey, "t.serverVersion",
                "m.idempotencyKey", "m.collection", "m.pushedRevision", "m.state",
            ] + model.fieldColumns.map { "t.\(SQL.quote($0))" }).joined(separator: ", ")
        return try Row.fetchCursor(
            db.cachedStatement(
                sql: """
                    SELECT \(columns) FROM \(model.quotedName) AS t
                    LEFT JOIN tandem_row AS m ON m.tableName = ?1 AND m.rowId = t.id
                    WHERE t.isDirty = 1 AND t.id > ?3 AND \(syncs)
                    AND m.state IS NOT 'failed'
                    AND NOT EXISTS (SELECT 1 FROM tandem_conflict c WHERE c.tableName = ?1 AND c.rowId = t.id)
                    ORDER BY t.id LIMIT ?2
                    """), arguments: [model.name, limit, rowId])
    }

    /// Whether the row of `model` is failed.
    func isFailed(_ model: TableModel, rowId: Int64, _ db: Database) throws -> Bool {
        try Bool.fetchOne(
            db.cachedStatement(
                sql: "SELECT EXISTS (SELECT 1 FROM tandem_row WHERE tableName = ? AND rowId = ? AND state = 'failed')"),
            arguments: [model.name, rowId]) ?? false
    }

    /// An op about to go out, as ``recordSending(_:_:_:)`` records it for its row.
    struct Sending {
        var rowId: Int64
        var serverId: String?
        var collection: CollectionPath
        var kind: WriteOp.Kind
        var key: ClientName
        /// The row's revision the op carries (see ``PreparedPush/revision``).
        var revision: Int64
    }

    /// dirty → sent, for the rows of one table that a batch takes: each op's key and the
    /// revision it carries, recorded before it goes out, in statements of up to 64 rows (see
    /// `StatementRows.groups(of:)`).
    func recordSending(_ model: TableModel, _ sendings: [Sending], _ db: Database) throws {
        for group in StatementRows.groups(of: sendings.indices) {
            try db.cachedStatement(
                sql: """
                    INSERT INTO tandem_row (tableName, rowId, serverId, collection, pendingOp, idempotencyKey, pushedRevision)
                    VALUES \(StatementRows.placeholders(rows: group.count, columns: 7))
                    ON CONFLICT (tableName, rowId) DO UPDATE SET collection = excluded.collection,
                        pendingOp = excluded.pendingOp, idempotencyKey = excluded.idempotencyKey,
                        pushedRevision = excluded.pushedRevision
                    """
            ).execute { values in
                for sending in sendings[group] {
                    values.bind(model.name)
                    values.bind(sending.rowId)
                    values.bind(sending.serverId)
                    values.bind(sending.collection.rawValue)
                    values.bind(sending.kind.rawValue)
                    values.bind(sending.key.rawValue)
                    values.bind(sending.revision)
                }
            }
        }
    }

    /// dirty → sent, for the creates of one table that a batch takes, of rows without a
    /// `tandem_row` entry: one `tandem_sending` entry for them all, recorded before they go
    /// out. Each create's key is `key-rowId` (``sendingKey(_:rowId:)``).
    ///
    /// This is the common case of a push (rows inserted offline, or since the last push), and
    /// the one entry stands for a `tandem_row` entry per row, written here and deleted at the
    /// acknowledgement: an insert and a delete per row in the table, its primary key's index
    /// and the index of pending creates. An answer other than an acknowledgement turns the
    /// entry into the per-row entries (``keepSendingPerRow(_:keys:_:)``), which the other paths
    /// know.
    func recordSending(
        _ model: TableModel, under key: ClientName, _ creates: [(rowId: Int64, revision: Int64)], _ db: Database
    ) throws {
        guard let first = creates.first else { return }
        // {"rowId":revision,…}: an object, so that the delete trigger finds one row's revision
        // with a member lookup instead of walking every pair (an app deleting 10,000 rows while
        // four batches of 500 were on their way took 11 s with an array, 12 ms with this).
        var rows = "{"
        rows.reserveCapacity(creates.count * 16)
        var lowest = first.rowId
        var highest = first.rowId
        for (index, create) in creates.enumerated() {
            if index > 0 { rows += "," }
            rows += "\"\(create.rowId)\":\(create.revision)"
            lowest = min(lowest, create.rowId)
            highest = max(highest, create.rowId)
        }
        rows += "}"
        try db.cachedStatement(
            sql: "INSERT INTO tandem_sending (key, tableName, firstRowId, lastRowId, rows) VALUES (?, ?, ?, ?, ?)"
        ).execute { values in
            values.bind(key.rawValue)
            values.bind(model.name)
            values.bind(lowest)
            values.bind(highest)
            values.bind(rows)
        }
    }

    /// The idempotency key of row `rowId`'s create in the batch entry `key`.
    static func sendingKey(_ key: ClientName, rowId: Int64) throws -> ClientName {
        try key.suffixed(rowId)
    }

    /// Whether any batch entry is recorded.
    func anySending(_ db: Database) throws -> Bool {
        try Bool.fetchOne(db.cachedStatement(sql: "SELECT \(Self.anySendingSQL)")) ?? true
    }

    static let anySendingSQL = "EXISTS (SELECT 1 FROM tandem_sending)"

    /// The batch entries were acknowledged: they go.
    ///
    /// - Returns: The keys of those that were still recorded (an entry is gone when a listener
    ///   running without the barrier turned it into row entries meanwhile).
    func sendingAnswered(_ keys: some Sequence<ClientName>, _ db: Database) throws -> Set<ClientName> {
        let statement = try db.cachedStatement(sql: "DELETE FROM tandem_sending WHERE key = ?")
        var recorded: Set<ClientName> = []
        for key in keys {
            try statement.execute { $0.bind(key.rawValue) }
            if db.changesCount > 0 { recorded.insert(key) }
        }
        return recorded
    }

    /// Batch entries (`keys`, or all of them) become a `tandem_row` entry per create, as
    /// ``recordSending(_:_:_:)`` records one: for an answer other than an acknowledgement
    /// (the same keys go out again, attempts are counted per row); and, for the entries of
    /// batches whose answer never came (a dropped connection, a crash), at the start of the next
    /// push and before the listener applies anything, so that the listener's paths (a document
    /// adopted by its row, a row removed with its bookkeeping) find the keys where they look.
    ///
    /// Only rows still waiting for their server id; a row the app deleted got its entry from
    /// the delete trigger. An entry a row has by now is kept.
    func keepSendingPerRow(_ models: [TableModel], keys: [ClientName]?, _ db: Database) throws {
        // All entries, or those of `keys`.
        let list = keys.map { StatementRows.placeholders(rows: 1, columns: $0.count) }
        let keyArguments = (keys ?? []).map(\.rawValue)
        for model in models {
            try db.execute(
                sql: """
                    INSERT INTO tandem_row (tableName, rowId, pendingOp, idempotencyKey, pushedRevision)
                    SELECT s.tableName, t.id, 'create', s.key || '-' || t.id, sent.value
                    FROM tandem_sending AS s, json_each(s.rows) AS sent
                    JOIN \(model.quotedName) AS t ON t.id = CAST(sent.key AS INTEGER)
                    WHERE s.tableName = ? \(list.map { "AND s.key IN \($0)" } ?? "") AND t.serverId IS NULL
                    ON CONFLICT (tableName, rowId) DO NOTHING
                    """, arguments: StatementArguments([model.name] + keyArguments))
        }
        try db.execute(
            sql: "DELETE FROM tandem_sending \(list.map { "WHERE key IN \($0)" } ?? "")",
            arguments: StatementArguments(keyArguments))
    }

    /// Records the key of a filed delete's first sending.
    func recordDeleteKey(_ key: ClientName, _ table: String, _ rowId: Int64, _ db: Database) throws {
        try db.cachedStatement(sql: "UPDATE tandem_row SET idempotencyKey = ? WHERE tableName = ? AND rowId = ?")
            .execute(arguments: [key.rawValue, table, rowId])
    }

    /// What an `ack` did to a row.
    enum Acknowledged {
        /// Synced; `clean` is false when the row changed after it was sent (dirty again).
        case row(clean: Bool)
        /// The row was deleted while its op was on its way: now a filed delete of the document.
        case deletedMeanwhile
        /// Another row already holds the server id: the listener inserted the server's echo of
        /// this create before its write-back (the race the sync queue's barrier prevents).
        /// Nothing was changed; the caller fails the row.
        case duplicate(otherRowId: Int64?)
    }

    /// sent → synced (or dirty, or a filed delete): the server's id, version and fields.
    func acknowledge(_ model: TableModel, _ push: PreparedPush, _ result: WriteResult, _ db: Database) throws
        -> Acknowledged
    {
        // The op's fields as the canonical text it carried, which is what encoding them would give.
        let fieldsText =
            model.keepsServerFields
            ? push.op.canonicalFieldsJSON.map { String(decoding: $0, as: UTF8.self) } ?? "{}" : nil
        // One step on the app's row: the server id, clean unless the row changed since its op
        // was sent.
        let clean: Bool?
        do {
            let statement = try db.cachedStatement(
                sql: """
                    UPDATE \(model.quotedName) SET serverId = ?, serverVersion = ?,
                        isDirty = (localRevision != ? OR ?), localRevision = localRevision + 1
                    WHERE id = ? RETURNING isDirty = 0
                    """)
            try statement.bindForGRDB { values in
                values.bind(result.id.rawValue)
                values.bind(result.version)
                values.bind(push.revision)
                values.bind(push.incomplete)
                values.bind(push.rowId)
            }
            clean = try Bool.fetchOne(statement)
        } catch let error as DatabaseError
            where error.extendedResultCode == .SQLITE_CONSTRAINT_UNIQUE && push.op.kind == .create
        {
            return .duplicate(otherRowId: try lookup(model, serverId: result.id.rawValue, db)?.id)
        }
        guard let clean else {
            try fileDelete(model, push, answer: result, fields: fieldsText, db)
            return .deletedMeanwhile
        }
        guard model.recordsSyncedRows else {
            // Synced, or dirty with nothing sent: either way nothing the row does not hold,
            // unless it is out of scope. A create sent in a batch entry has no row entry.
            if push.sendingEntry == nil { try forgetSynced(model, CollectionOfOne(push.rowId), db) }
            return .row(clean: clean)
        }
        // A create sent in a batch entry has no row entry yet; this one stays.
        try db.cachedStatement(
            sql: """
                INSERT INTO tandem_row (tableName, rowId, serverId, collection, serverFields, state)
                VALUES (?4, ?5, ?1, ?6, ?2, ?3)
                ON CONFLICT (tableName, rowId) DO UPDATE SET serverId = ?1, serverFields = ?2, pendingOp = NULL,
                    idempotencyKey = NULL, pushedRevision = NULL, attempts = 0, state = ?3, errorCode = NULL,
                    serverErrorCode = NULL, lastError = NULL
                """
        ).execute(arguments: [
            result.id.rawValue, fieldsText, clean ? "synced" : "pending", model.name, push.rowId,
            push.op.collection.rawValue,
        ])
        return .row(clean: clean)
    }

    /// What ``acknowledge(_:_:_:_:)`` does, for the answered ops of one table, in order: in
    /// statements of up to 64 rows each (the rows' update, then their entries), instead of two
    /// per row.
    ///
    /// A table that keeps bookkeeping for its synced rows, and a lone op, go row by row. So does
    /// a group that meets another row holding the same server id: the group's statement then
    /// changed nothing (SQLite undoes a failed statement), and the row-by-row pass names the
    /// duplicate.
    func acknowledge(
        _ model: TableModel, _ pushes: ArraySlice<PreparedPush>, _ results: ArraySlice<WriteResult>, _ db: Database
    ) throws -> [Acknowledged] {
        precondition(pushes.indices == results.indices, "one result for each push")
        guard !model.recordsSyncedRows, pushes.count > 1 else {
            return try pushes.indices.map { try acknowledge(model, pushes[$0], results[$0], db) }
        }
        var outcomes: [Acknowledged] = []
        outcomes.reserveCapacity(pushes.count)
        for group in StatementRows.groups(of: pushes.indices) {
            outcomes += try acknowledgeGroup(model, pushes[group], results[group], db)
        }
        return outcomes
    }

    /// The slices share the batch's storage, and their elements are read in place: a push
    /// copied is its op's strings and fields retained and released (such copies cost 2.8 % of
    /// bench throughput's samples).
    private func acknowledgeGroup(
        _ model: TableModel, _ pushes: ArraySlice<PreparedPush>, _ results: ArraySlice<WriteResult>, _ db: Database
    ) throws -> [Acknowledged] {
        // As in the row-by-row step: the server id, clean unless the row changed since its op
        // was sent. A row deleted meanwhile returns nothing.
        let statement = try db.cachedStatement(
            sql: """
                UPDATE \(model.quotedName) SET serverId = answer.column2, serverVersion = answer.column3,
                    isDirty = (localRevision != answer.column4 OR answer.column5), localRevision = localRevision + 1
                FROM (VALUES \(StatementRows.placeholders(rows: pushes.count, columns: 5))) AS answer
                WHERE \(model.quotedName).id = answer.column1
                RETURNING id, isDirty = 0
                """)
        try statement.bindForGRDB { values in
            for index in pushes.indices {
                values.bind(pushes[index].rowId)
                values.bind(results[index].id.rawValue)
                values.bind(results[index].version)
                values.bind(pushes[index].revision)
                values.bind(pushes[index].incomplete)
            }
        }
        var clean: [Int64: Bool] = [:]
        clean.reserveCapacity(pushes.count)
        do {
            let rows = try Row.fetchCursor(statement)
            while let row = try rows.next() { clean[row[0]] = row[1] }
        } catch let error as DatabaseError where error.extendedResultCode == .SQLITE_CONSTRAINT_UNIQUE {
            return try pushes.indices.map { try acknowledge(model, pushes[$0], results[$0], db) }
        }
        // Rows whose create went out in a batch entry have no row entry to forget.
        var synced: [Int64] = []
        synced.reserveCapacity(clean.count)
        var outcomes: [Acknowledged] = []
        outcomes.reserveCapacity(pushes.count)
        for index in pushes.indices {
            if let isClean = clean[pushes[index].rowId] {
                if pushes[index].sendingEntry == nil { synced.append(pushes[index].rowId) }
                outcomes.append(.row(clean: isClean))
            } else {
                try fileDelete(model, pushes[index], answer: results[index], fields: nil, db)
                outcomes.append(.deletedMeanwhile)
            }
        }
        for group in StatementRows.groups(of: synced.indices) { try forgetSynced(model, synced[group], db) }
        return outcomes
    }

    /// A row the app deleted while its op was on its way: the document exists now, so its
    /// delete is filed at the answer's version. The row has an entry (a create listed in a
    /// batch entry got one from the delete trigger, without a collection, which the op gives).
    /// A row Tandem removed itself meanwhile (a conflict resolved for the server, which keeps
    /// the document) has none, and nothing is filed.
    private func fileDelete(
        _ model: TableModel, _ push: PreparedPush, answer result: WriteResult, fields: String?, _ db: Database
    ) throws {
        try db.cachedStatement(
            sql: """
                UPDATE tandem_row SET serverId = ?, serverVersion = ?, serverFields = ?,
                    collection = COALESCE(collection, ?), pendingOp = 'delete',
                    idempotencyKey = CASE WHEN pendingOp = 'delete' THEN idempotencyKey ELSE NULL END,
                    pushedRevision = NULL, attempts = 0, state = 'pending'
                WHERE tableName = ? AND rowId = ?
                """
        ).execute(arguments: [
            result.id.rawValue, result.version, fields, push.op.collection.rawValue, model.name, push.rowId,
        ])
    }

    /// The server's document becomes the base of the row's next push, which stays pending
    /// under a new key (a filed delete stays a delete, now at the server's version).
    func rebase(_ model: TableModel, _ rowId: Int64, on server: Document, _ db: Database) throws {
        try db.cachedStatement(
            sql: "UPDATE \(model.quotedName) SET serverVersion = ?, localRevision = localRevision + 1 WHERE id = ?"
        ).execute(arguments: [server.version, rowId])
        try db.cachedStatement(
            sql: """
                UPDATE tandem_row SET serverVersion = ?, serverFields = ?, idempotencyKey = NULL, pushedRevision = NULL,
                    pendingOp = CASE WHEN pendingOp = 'delete' THEN 'delete' ELSE NULL END
                WHERE tableName = ? AND rowId = ?
                """
        ).execute(arguments: [server.version, Self.fieldsText(server.fields), model.name, rowId])
    }

    /// → failed: a refusal that resending cannot fix.
    func fail(_ table: String, _ rowId: Int64, _ error: TandemError, _ db: Database) throws {
        try db.cachedStatement(
            sql: """
                INSERT INTO tandem_row (tableName, rowId, state, errorCode, serverErrorCode, lastError)
                VALUES (?, ?, 'failed', ?, ?, ?)
                ON CONFLICT (tableName, rowId) DO UPDATE SET state = 'failed', errorCode = excluded.errorCode,
                    serverErrorCode = excluded.serverErrorCode, lastError = excluded.lastError, idempotencyKey = NULL
                """
        ).execute(arguments: [table, rowId, error.code.rawValue, error.serverError?.code.rawValue, error.message])
    }

    /// A failure that may pass (the connection dropped, the server had an internal error): one
    /// more attempt counted, failed once `maxAttempts` are used up. Keys are kept, since the
    /// server may have applied the ops.
    func countFailedAttempt(_ pushes: [PreparedPush], _ error: TandemError, maxAttempts: Int, _ db: Database) throws {
        for push in pushes {
            try db.cachedStatement(
                sql: """
                    UPDATE tandem_row SET attempts = attempts + 1, errorCode = ?, serverErrorCode = ?, lastError = ?,
                        state = CASE WHEN attempts + 1 >= ? THEN 'failed' ELSE state END
                    WHERE tableName = ? AND rowId = ?
                    """
            ).execute(arguments: [
                error.code.rawValue, error.serverError?.code.rawValue, error.message, maxAttempts, push.table,
                push.rowId,
            ])
        }
    }

    /// failed → dirty, for every failed row.
    func retryFailed(_ db: Database) throws {
        try db.execute(
            sql: """
                UPDATE tandem_row SET state = 'pending', attempts = 0, errorCode = NULL, serverErrorCode = NULL,
                    lastError = NULL
                WHERE state = 'failed'
                """)
    }

    func failedRecords(_ db: Database) throws -> [FailedRecord] {
        try Row.fetchAll(
            db,
            sql: """
                SELECT tableName, rowId, serverId, attempts, errorCode, serverErrorCode, lastError FROM tandem_row
                WHERE state = 'failed' ORDER BY tableName, rowId
                """
        ).map { row in
            let code = TandemError.Code(rawValue: row[4] ?? TandemError.Code.database.rawValue)
            let message: String = row[6] ?? ""
            let serverError = (row[5] as String?).map { WireError(ErrorCode(rawValue: $0), message) }
            return FailedRecord(
                table: row[0], rowId: row[1], serverId: row[2], attempts: row[3],
                error: TandemError(code, message, serverError: serverError))
        }
    }

    /// Rows of a table that keeps no bookkeeping for synced rows are synced (or dirty with
    /// nothing sent): their entries go, unless a row is out of scope, which only its entry says;
    /// then the entry stays, with nothing sent. One row, or a group (see `StatementRows.groups(of:)`).
    private func forgetSynced(_ model: TableModel, _ rowIds: some Collection<Int64>, _ db: Database) throws {
        let list = StatementRows.placeholders(rows: 1, columns: rowIds.count)
        try db.cachedStatement(
            sql: "DELETE FROM tandem_row WHERE tableName = ? AND outOfScope = 0 AND rowId IN \(list)"
        )
        .execute { values in
            values.bind(model.name)
            for rowId in rowIds { values.bind(rowId) }
        }
        guard db.changesCount < rowIds.count else { return }
        try db.cachedStatement(
            sql: """
                UPDATE tandem_row SET pendingOp = NULL, idempotencyKey = NULL, pushedRevision = NULL, attempts = 0,
                    state = 'synced', errorCode = NULL, serverErrorCode = NULL, lastError = NULL
                WHERE tableName = ? AND rowId IN \(list)
                """
        ).execute { values in
            values.bind(model.name)
            for rowId in rowIds { values.bind(rowId) }
        }
    }

    /// Ends a row's bookkeeping (its delete was acknowledged, or it will never push).
    func forget(_ table: String, _ rowId: Int64, _ db: Database) throws {
        try db.cachedStatement(sql: "DELETE FROM tandem_row WHERE tableName = ? AND rowId = ?").execute { values in
            values.bind(table)
            values.bind(rowId)
        }
    }

    /// A document this device knows is deleted at `version`, until its tombstone arrives
    /// through the listener: a snapshot already queued behind the push (an older version of the
    /// document) is then not taken for a document to insert.
    func rememberGone(_ collection: CollectionPath, _ id: DocumentID, version: Int64, _ db: Database) throws {
        try db.cachedStatement(
            sql: """
                INSERT INTO tandem_gone (collection, serverId, version) VALUES (?, ?, ?)
                ON CONFLICT (collection, serverId) DO UPDATE SET version = MAX(version, excluded.version)
                """
        ).execute(arguments: [collection.rawValue, id.rawValue, version])
    }

    /// The version at which this device knows the document deleted, if it does; a change that
    /// brings the tombstone (or something newer) ends it.
    func goneVersion(_ collection: CollectionPath, _ id: String, _ db: Database) throws -> Int64? {
        try Int64.fetchOne(
            db.cachedStatement(sql: "SELECT version FROM tandem_gone WHERE collection = ? AND serverId = ?"),
            arguments: [collection.rawValue, id])
    }

    func clearGone(_ collection: CollectionPath, _ id: String, _ db: Database) throws {
        try db.cachedStatement(sql: "DELETE FROM tandem_gone WHERE collection = ? AND serverId = ?")
            .execute(arguments: [collection.rawValue, id])
    }

    // MARK: - Listener changes

    /// → synced: the row holds the server's document at its version (written into the row,
    /// with `serverVersion`, by the caller). A table that keeps no bookkeeping of synced rows
    /// (``TableModel/recordsSyncedRows``) forgets the row's; a row the caller has just
    /// inserted has none, and is not brought here then.
    func recordSynced(
        _ model: TableModel, rowId: Int64, _ document: Document, _ collection: CollectionPath, _ db: Database
    ) throws {
        guard model.recordsSyncedRows else {
            try forgetSynced(model, CollectionOfOne(rowId), db)
            return
        }
        try db.cachedStatement(
            sql: """
                INSERT INTO tandem_row (tableName, rowId, serverId, collection, serverFields, state)
                VALUES (?, ?, ?, ?, ?, 'synced')
                ON CONFLICT (tableName, rowId) DO UPDATE SET serverId = excluded.serverId,
                    collection = excluded.collection, serverFields = excluded.serverFields, pendingOp = NULL,
                    idempotencyKey = NULL, pushedRevision = NULL, attempts = 0, state = 'synced', errorCode = NULL,
                    serverErrorCode = NULL, lastError = NULL
                """
        ).execute(arguments: [
            model.name, rowId, document.id.rawValue, collection.rawValue,
            model.keepsServerFields ? Self.fieldsText(document.fields) : nil,
        ])
    }

    /// A remote delete of a document that has no row here: what was kept of it goes.
    func forgetDocument(_ model: TableModel, _ collection: CollectionPath, serverId: String, _ db: Database) throws {
        try db.cachedStatement(sql: "DELETE FROM tandem_row WHERE tableName = ? AND serverId = ?")
            .execute(arguments: [model.name, serverId])
        try db.cachedStatement(sql: "DELETE FROM tandem_deferred WHERE collection = ? AND serverId = ?")
            .execute(arguments: [collection.rawValue, serverId])
    }

    /// Whether the document is deleted here and the delete not pushed yet; if so, the delete
    /// goes out at `version` when that is newer than the one it knew (under a new key then).
    func raiseFiledDelete(_ model: TableModel, serverId: String, to version: Int64, _ db: Database) throws -> Bool {
        guard
            try Bool.fetchOne(
                db.cachedStatement(
                    sql:
                        "SELECT EXISTS (SELECT 1 FROM tandem_row WHERE tableName = ? AND serverId = ? AND pendingOp = 'delete')"
                ),
                arguments: [model.name, serverId]) ?? false
        else { return false }
        // Never back to an older version: a snapshot can bring one this device has already
        // written past (it was queued behind the push that wrote the newer one).
        try db.cachedStatement(
            sql: """
                UPDATE tandem_row SET serverVersion = MAX(serverVersion, ?1),
                    idempotencyKey = CASE WHEN ?1 > serverVersion THEN NULL ELSE idempotencyKey END
                WHERE tableName = ?2 AND serverId = ?3 AND pendingOp = 'delete'
                """
        ).execute(arguments: [version, model.name, serverId])
        return true
    }

    /// The local row whose create, sent but never answered, made a document with this
    /// `createKey`, and the revision the create carried. (A create listed in a batch entry is
    /// looked up here too: the listener turns the entries into row entries before it applies
    /// anything.)
    func unansweredCreate(_ model: TableModel, key: String, _ db: Database) throws
        -> (rowId: Int64, pushedRevision: Int64?)?
    {
        try Row.fetchOne(
            db.cachedStatement(
                sql: """
                    SELECT rowId, pushedRevision FROM tandem_row
                    WHERE pendingOp = 'create' AND idempotencyKey = ? AND tableName = ?
                    """),
            arguments: [key, model.name]
        ).map { row in (row[0], row[1]) }
    }

    /// One of this device's unanswered creates was applied by the server, and its row was
    /// deleted here meanwhile: sent → deleted, not pushed, a delete of the document at `version`.
    func fileDeleteOfOwnCreate(_ model: TableModel, _ create: AppliedCreate, version: Int64, _ db: Database) throws {
        let (rowId, serverId, collection) = (create.rowId, create.serverId, create.collection)
        try db.cachedStatement(
            sql: """
                UPDATE tandem_row SET serverId = ?, collection = ?, serverVersion = ?, pendingOp = 'delete',
                    idempotencyKey = NULL, pushedRevision = NULL, state = 'pending'
                WHERE tableName = ? AND rowId = ?
                """
        ).execute(arguments: [serverId, collection.rawValue, version, model.name, rowId])
    }

    /// One of this device's unanswered creates was applied by the server: the row takes the
    /// document's server id. Then the caller writes the document into the row (→ synced), or,
    /// with `keepsLocal` (the row changed since the create went out), the row is dirty with no
    /// base known to both sides, and the conflict policy settles it.
    func adoptOwnCreate(_ model: TableModel, _ create: AppliedCreate, keepsLocal: Bool, _ db: Database) throws {
        let (rowId, serverId, collection) = (create.rowId, create.serverId, create.collection)
        try db.cachedStatement(
            sql: "UPDATE \(model.quotedName) SET serverId = ?, localRevision = localRevision + 1 WHERE id = ?"
        ).execute(arguments: [serverId, rowId])
        if keepsLocal {
            try db.cachedStatement(
                sql: """
                    UPDATE tandem_row SET serverId = ?, collection = ?, serverFields = NULL,
                        pendingOp = NULL, idempotencyKey = NULL, pushedRevision = NULL, attempts = 0,
                        state = 'pending', errorCode = NULL, serverErrorCode = NULL, lastError = NULL
                    WHERE tableName = ? AND rowId = ?
                    """
            ).execute(arguments: [serverId, collection.rawValue, model.name, rowId])
        }
    }

    /// The row's `localRevision`; nil when the row is gone.
    func revision(_ model: TableModel, rowId: Int64, _ db: Database) throws -> Int64? {
        try Int64.fetchOne(
            db.cachedStatement(sql: "SELECT localRevision FROM \(model.quotedName) WHERE id = ?"), arguments: [rowId])
    }

    /// → dirty: the row will be pushed (a conflict settled for the local side).
    func markDirty(_ model: TableModel, rowId: Int64, _ db: Database) throws {
        try db.cachedStatement(
            sql:
                "UPDATE \(model.quotedName) SET isDirty = 1, localRevision = localRevision + 1 WHERE id = ? AND isDirty = 0"
        ).execute(arguments: [rowId])
    }

    /// Any state → gone: the row is deleted as Tandem deletes (`isDeleted` first, so that the
    /// delete trigger does not file it for pushing), and its bookkeeping with it.
    func removeRow(_ model: TableModel, id: Int64, _ db: Database) throws {
        try db.cachedStatement(
            sql: "UPDATE \(model.quotedName) SET isDeleted = 1, localRevision = localRevision + 1 WHERE id = ?"
        ).execute(arguments: [id])
        try db.cachedStatement(sql: "DELETE FROM \(model.quotedName) WHERE id = ?").execute(arguments: [id])
        for table in ["tandem_row", "tandem_reference", "tandem_field", "tandem_conflict"] {
            try db.cachedStatement(sql: "DELETE FROM \(table) WHERE tableName = ? AND rowId = ?")
                .execute(arguments: [model.name, id])
        }
    }

    // MARK: - Waiting for rows that have not arrived

    /// The server id a null reference column waits for.
    func waitingReference(_ model: TableModel, rowId: Int64, column: String, _ db: Database) throws -> String? {
        try String.fetchOne(
            db.cachedStatement(
                sql: "SELECT targetServerId FROM tandem_reference WHERE tableName = ? AND rowId = ? AND columnName = ?"),
            arguments: [model.name, rowId, column])
    }

    func recordWaitingReference(_ model: TableModel, rowId: Int64, _ reference: MissingReference, _ db: Database)
        throws
    {
        try db.cachedStatement(
            sql: """
                INSERT OR REPLACE INTO tandem_reference (tableName, rowId, columnName, targetTable, targetServerId)
                VALUES (?, ?, ?, ?, ?)
                """
        ).execute(arguments: [model.name, rowId, reference.column, reference.table, reference.serverId])
    }

    /// The document says what the reference is now: what the column waited for no longer matters.
    func clearWaitingReference(_ model: TableModel, rowId: Int64, column: String, _ db: Database) throws {
        try db.cachedStatement(sql: "DELETE FROM tandem_reference WHERE tableName = ? AND rowId = ? AND columnName = ?")
            .execute(arguments: [model.name, rowId, column])
    }

    /// Keeps a document aside until the row its required reference names arrives.
    func deferDocument(_ deferred: DeferredDocument, waitingFor reference: MissingReference, _ db: Database) throws {
        try db.cachedStatement(
            sql: """
                INSERT OR REPLACE INTO tandem_deferred
                    (collection, serverId, tableName, parentRowId, document, waitingTable, waitingServerId)
                VALUES (?, ?, ?, ?, ?, ?, ?)
                """
        ).execute(arguments: [
            deferred.collection.rawValue, deferred.document.id.rawValue, deferred.table, deferred.parentRowId,
            String(decoding: Wire.encode(deferred.document), as: UTF8.self), reference.table, reference.serverId,
        ])
    }

    /// Whether any reference or document waits for a row to arrive (usually not: then a row
    /// that gets its server id need not look for what waited for it).
    func anythingWaits(_ db: Database) throws -> Bool {
        try Bool.fetchOne(db.cachedStatement(sql: "SELECT \(Self.anythingWaitsSQL)")) ?? true
    }

    static let anythingWaitsSQL =
        "EXISTS (SELECT 1 FROM tandem_reference) OR EXISTS (SELECT 1 FROM tandem_deferred)"

    /// What waited for the row of `model` with `serverId`, taken out of the ledger: the
    /// reference columns to fill in, and the deferred documents to apply now.
    func takeWaiting(_ model: TableModel, serverId: String, _ db: Database) throws
        -> (references: [(table: String, rowId: Int64, column: String)], documents: [DeferredDocument])
    {
        let references = try Row.fetchAll(
            db.cachedStatement(
                sql:
                    "SELECT tableName, rowId, columnName FROM tandem_reference WHERE targetTable = ? AND targetServerId = ?"
            ),
            arguments: [model.name, serverId]
        ).map { row in (table: row[0] as String, rowId: row[1] as Int64, column: row[2] as String) }
        try db.cachedStatement(sql: "DELETE FROM tandem_reference WHERE targetTable = ? AND targetServerId = ?")
            .execute(arguments: [model.name, serverId])

        var documents: [DeferredDocument] = []
        let rows = try Row.fetchAll(
            db.cachedStatement(
                sql: """
                    SELECT collection, serverId, tableName, parentRowId, document FROM tandem_deferred
                    WHERE waitingTable = ? AND waitingServerId = ?
                    """),
            arguments: [model.name, serverId])
        for row in rows {
            try db.cachedStatement(sql: "DELETE FROM tandem_deferred WHERE collection = ? AND serverId = ?")
                .execute(arguments: [row[0] as String, row[1] as String])
            guard let collection = try? CollectionPath(row[0] as String),
                let document = try? Wire.decode(Document.self, from: Array((row[4] as String).utf8))
            else { continue }
            documents.append(
                DeferredDocument(table: row[2], collection: collection, parentRowId: row[3], document: document))
        }
        return (references, documents)
    }

    /// A document kept aside until a row it requires arrives, and where it goes then.
    struct DeferredDocument {
        var table: String
        var collection: CollectionPath
        var parentRowId: Int64?
        var document: Document
    }

    // MARK: - Field times

    /// When each field of the row was last written here (the row's time for tables that do
    /// not keep field times).
    func localFieldTimes(_ model: TableModel, rowId: Int64, updatedAt: Int64, _ db: Database) throws -> [String: Int64]
    {
        var times = Dictionary(uniqueKeysWithValues: model.fieldColumns.map { ($0, updatedAt) })
        times["updatedAt"] = updatedAt
        guard model.mergesFields else { return times }
        let rows = try Row.fetchAll(
            db.cachedStatement(sql: "SELECT field, time FROM tandem_field WHERE tableName = ? AND rowId = ?"),
            arguments: [model.name, rowId])
        for row in rows { times[row[0]] = row[1] }
        return times
    }

    func storeFieldTimes(_ model: TableModel, rowId: Int64, _ times: [String: Int64], _ db: Database) throws {
        guard model.mergesFields else { return }
        for (field, time) in times where field != "updatedAt" {
            try db.cachedStatement(
                sql: "INSERT OR REPLACE INTO tandem_field (tableName, rowId, field, time) VALUES (?, ?, ?, ?)"
            ).execute(arguments: [model.name, rowId, field, time])
        }
    }

    // MARK: - Conflicts kept for the app

    func isInConflict(_ model: TableModel, rowId: Int64, _ db: Database) throws -> Bool {
        try Bool.fetchOne(
            db.cachedStatement(sql: "SELECT EXISTS (SELECT 1 FROM tandem_conflict WHERE tableName = ? AND rowId = ?)"),
            arguments: [model.name, rowId]) ?? false
    }

    /// A conflict found, as the ledger keeps it for the app.
    struct DetectedConflict {
        var rowId: Int64
        /// The document, and its side of the conflict (the newest the server has).
        var server: Document
        var collection: CollectionPath
        /// The row's side: its synced fields as they are here.
        var local: JSONObject
        /// The server's fields as the row last had them, when known.
        var base: JSONObject?
        /// The fields both sides changed (none for a row that left its scope).
        var fields: Set<String>
        var detectedAt: Int64
        var reason: ConflictReason = .changed
    }

    /// → in conflict, or a newer server side for a conflict already open.
    func recordConflict(_ conflict: DetectedConflict, of model: TableModel, _ db: Database) throws {
        try db.cachedStatement(
            sql: """
                INSERT INTO tandem_conflict (tableName, rowId, serverId, collection, local, server, base, fields, detectedAt,
                    reason)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (tableName, rowId) DO UPDATE SET server = excluded.server, fields = excluded.fields,
                    local = excluded.local, reason = excluded.reason
                """
        ).execute(arguments: [
            model.name, conflict.rowId, conflict.server.id.rawValue, conflict.collection.rawValue,
            Self.fieldsText(conflict.local), String(decoding: Wire.encode(conflict.server), as: UTF8.self),
            conflict.base.map(Self.fieldsText), String(decoding: Wire.encode(conflict.fields.sorted()), as: UTF8.self),
            conflict.detectedAt, conflict.reason.rawValue,
        ])
    }

    // MARK: - Rows out of their table's scope

    /// → out of scope: the row's document left its table's scope while the row (or one under
    /// it) had unpushed changes.
    func markOutOfScope(_ model: TableModel, rowId: Int64, _ db: Database) throws {
        // A synced or dirty row of a root table that does not merge has no entry yet.
        try db.cachedStatement(
            sql: """
                INSERT INTO tandem_row (tableName, rowId, serverId, collection, outOfScope)
                SELECT ?, id, serverId, ?, 1 FROM \(model.quotedName) WHERE id = ?
                ON CONFLICT (tableName, rowId) DO UPDATE SET outOfScope = 1
                """
        ).execute(arguments: [model.name, model.rootCollection?.rawValue, rowId])
    }

    /// out of scope → as it was: the document came back into the scope; its `left-scope`
    /// conflict, if the app has not resolved it, is moot.
    func backInScope(_ model: TableModel, rowId: Int64, _ db: Database) throws {
        try db.cachedStatement(
            sql: "UPDATE tandem_row SET outOfScope = 0 WHERE tableName = ? AND rowId = ? AND outOfScope = 1"
        ).execute(arguments: [model.name, rowId])
        try db.cachedStatement(
            sql: "DELETE FROM tandem_conflict WHERE tableName = ? AND rowId = ? AND reason = 'left-scope'"
        ).execute(arguments: [model.name, rowId])
    }

    /// Whether any row is out of scope (most databases: none, and nothing to look for).
    func anyOutOfScope(_ db: Database) throws -> Bool {
        try Bool.fetchOne(db.cachedStatement(sql: "SELECT \(Self.anyOutOfScopeSQL)")) ?? true
    }

    static let anyOutOfScopeSQL = "EXISTS (SELECT 1 FROM tandem_row WHERE outOfScope = 1)"

    /// The rows out of scope whose conflict the app has resolved: they go once nothing under
    /// them waits to be pushed.
    func outOfScopeRows(_ db: Database) throws -> [(table: String, rowId: Int64)] {
        try Row.fetchAll(
            db.cachedStatement(
                sql: """
                    SELECT tableName, rowId FROM tandem_row m WHERE outOfScope = 1 AND pendingOp IS NOT 'delete'
                    AND NOT EXISTS (SELECT 1 FROM tandem_conflict c WHERE c.tableName = m.tableName AND c.rowId = m.rowId)
                    """)
        ).map { ($0[0], $0[1]) }
    }

    func conflicts(_ db: Database) throws -> [ConflictRecord] {
        try Row.fetchAll(
            db,
            sql: """
                SELECT tableName, rowId, serverId, local, server, base, fields, detectedAt, reason FROM tandem_conflict
                ORDER BY detectedAt, tableName, rowId
                """
        ).map { row in
            ConflictRecord(
                table: row[0], rowId: row[1], serverId: row[2],
                local: try Wire.decodeFields(Array((row[3] as String).utf8)),
                server: try Wire.decode(Document.self, from: Array((row[4] as String).utf8)),
                base: try (row[5] as String?).map { try Wire.decodeFields(Array($0.utf8)) },
                fields: try Wire.decodeStrings(Array((row[6] as String).utf8)), detectedAt: row[7],
                reason: ConflictReason(rawValue: row[8]) ?? .changed)
        }
    }

    /// in conflict → as it was: the open conflict of the row is taken out, with the server's
    /// latest document (which may be newer than the one the app looked at) and its collection.
    func takeConflict(_ table: String, rowId: Int64, _ db: Database) throws
        -> (server: Document, collection: CollectionPath, reason: ConflictReason)?
    {
        guard
            let row = try Row.fetchOne(
                db, sql: "SELECT server, collection, reason FROM tandem_conflict WHERE tableName = ? AND rowId = ?",
                arguments: [table, rowId])
        else { return nil }
        let server = try Wire.decode(Document.self, from: Array((row[0] as String).utf8))
        let collection = try CollectionPath(row[1] as String)
        try db.execute(sql: "DELETE FROM tandem_conflict WHERE tableName = ? AND rowId = ?", arguments: [table, rowId])
        return (server, collection, ConflictReason(rawValue: row[2]) ?? .changed)
    }

    static func fieldsText(_ fields: JSONObject) -> String {
        String(decoding: Wire.encodeCanonical(fields), as: UTF8.self)
    }
}

/// What a snapshot's changes need not look for: most snapshots meet no unanswered creates, no
/// filed deletes and nothing waiting.
struct ApplyContext {
    /// Some row's create was sent and not answered (its document may be in the snapshot).
    var unansweredCreates: Bool
    /// Some local delete is filed and not pushed yet.
    var filedDeletes: Bool
    /// Some reference or document waits for a row to arrive. Set once a change adds one.
    var waiting: Bool
    /// Some document is known to be deleted and its tombstone has not arrived yet.
    var gone: Bool
    /// Some row is out of its table's scope (its document may come back). Set once a change
    /// puts one there.
    var outOfScope: Bool

    /// For changes applied outside a snapshot (a deferred document): look for everything.
    static let everything = ApplyContext(
        unansweredCreates: true, filedDeletes: true, waiting: true, gone: true, outOfScope: true)
}

/// A reference column whose target row has not arrived here: the column, the table it
/// references and the server id it waits for.
struct MissingReference {
    var column: String
    var table: String
    var serverId: String
}

/// One of this device's creates, sent and never answered, that the server applied: the row it
/// was made from, and the document it made.
struct AppliedCreate {
    let rowId: Int64
    let serverId: String
    let collection: CollectionPath
}
