import Foundation
import GRDB
import TandemWire

/// What applying a snapshot did.
struct ApplyOutcome: Sendable {
    var inserted = 0
    var updated = 0
    var deleted = 0
    /// Conflicts settled by a policy.
    var conflicts = 0
    /// Changes that could not be applied (a value the table refuses), with the reason. The
    /// rest of the snapshot is applied and its token stored.
    var failures: [String] = []
}

extension LocalStore {
    /// Applies one snapshot and stores its resume token, in the caller's transaction.
    ///
    /// Each change finds its row through the `serverId` index. A change whose version the row
    /// already has is the echo of this device's own write and changes nothing. A change for a
    /// row with unpushed local changes goes through the conflict policy.
    func apply(
        _ snapshot: ServerMessage.Snapshot, collection: CollectionPath, target: ListenerTarget, _ db: Database
    ) throws -> ApplyOutcome {
        guard let model = byName[target.table] else { return ApplyOutcome() }
        let resetting =
            try Bool.fetchOne(
                db.cachedStatement(sql: "SELECT resetting FROM tandem_listener WHERE collection = ?"),
                arguments: [collection.rawValue]) ?? false
        var outcome = ApplyOutcome()
        // Usually every change applies: then all of them go in one savepoint. When one fails,
        // that savepoint is rolled back and each change gets its own, so that only the change
        // that failed is left out.
        do {
            try db.inSavepoint {
                var context = try ApplyContext(db)
                for change in snapshot.changes {
                    try applyChange(change, model, collection, target.parentRowId, &context, &outcome, db)
                }
                return .commit
            }
        } catch {
            outcome = ApplyOutcome()
            var context = try ApplyContext(db)
            for change in snapshot.changes {
                do {
                    try db.inSavepoint {
                        try applyChange(change, model, collection, target.parentRowId, &context, &outcome, db)
                        return .commit
                    }
                } catch {
                    outcome.failures.append("\(collection)/\(change.document.id): \(error)")
                }
            }
        }
        if resetting {
            let statement = try db.cachedStatement(
                sql: "INSERT OR IGNORE INTO tandem_reset_seen (collection, serverId) VALUES (?, ?)")
            for change in snapshot.changes {
                try statement.execute(arguments: [collection.rawValue, change.document.id.rawValue])
            }
        }
        try storeResumeToken(snapshot.resumeToken, for: collection, db)
        if resetting && snapshot.initial && !snapshot.hasMore {
            outcome.deleted += try finishReset(model, collection, target.parentRowId, db)
        }
        return outcome
    }

    /// What a snapshot's changes need not look for, found out once per snapshot: most
    /// snapshots meet no unanswered creates, no filed deletes and nothing waiting.
    struct ApplyContext {
        /// Some row's create was sent and not answered (its document may be in the snapshot).
        var unansweredCreates: Bool
        /// Some local delete is filed and not pushed yet.
        var filedDeletes: Bool
        /// Some reference or document waits for a row to arrive. Set once a change adds one.
        var waiting: Bool
        /// Some document is known to be deleted and its tombstone has not arrived yet.
        var gone: Bool

        init(_ db: Database) throws {
            // Of any table: these read the partial indexes on `pendingOp`, which hold only
            // rows with a pending create or delete (a condition on the table name would make
            // SQLite walk the primary key through every row of the table instead).
            unansweredCreates =
                try Bool.fetchOne(
                    db.cachedStatement(sql: "SELECT EXISTS (SELECT 1 FROM tandem_row WHERE pendingOp = 'create')"))
                ?? true
            filedDeletes =
                try Bool.fetchOne(
                    db.cachedStatement(sql: "SELECT EXISTS (SELECT 1 FROM tandem_row WHERE pendingOp = 'delete')"))
                ?? true
            waiting = try LocalStore.anythingWaits(db)
            gone = try Bool.fetchOne(db.cachedStatement(sql: "SELECT EXISTS (SELECT 1 FROM tandem_gone)")) ?? true
        }

        /// For changes applied outside a snapshot (a deferred document): look for everything.
        static let everything = ApplyContext(unansweredCreates: true, filedDeletes: true, waiting: true, gone: true)

        private init(unansweredCreates: Bool, filedDeletes: Bool, waiting: Bool, gone: Bool) {
            self.unansweredCreates = unansweredCreates
            self.filedDeletes = filedDeletes
            self.waiting = waiting
            self.gone = gone
        }
    }

    private func applyChange(
        _ change: Change, _ model: TableModel, _ collection: CollectionPath, _ parentRowId: Int64?,
        _ context: inout ApplyContext, _ outcome: inout ApplyOutcome, _ db: Database
    ) throws {
        let document = change.document
        let serverId = document.id.rawValue
        receiveTimes(of: document)
        // Read straight from the statement's cursor: `Row.fetchOne` copies every value and
        // column name first, which cost more than the lookup on this once-per-document path.
        let local = try Row.fetchCursor(db.cachedStatement(sql: model.lookupSQL), arguments: [serverId]).next().map {
            row in (id: row[0] as Int64, isDirty: row[1] as Bool)
        }

        if context.gone {
            // What the device knew of this document's delete: the tombstone brings it now, or
            // the change is older than the delete (queued before it) and brings nothing.
            let goneAt = try Int64.fetchOne(
                db.cachedStatement(sql: "SELECT version FROM tandem_gone WHERE collection = ? AND serverId = ?"),
                arguments: [collection.rawValue, serverId])
            if let goneAt {
                if document.version <= goneAt && !document.deleted { return }
                try db.cachedStatement(sql: "DELETE FROM tandem_gone WHERE collection = ? AND serverId = ?")
                    .execute(arguments: [collection.rawValue, serverId])
            }
        }

        if change.kind == .deleted || document.deleted {
            // A remote delete removes the local row, unpushed edits included.
            if let local {
                try removeRow(model, id: local.id, db)
                outcome.deleted += 1
            } else if context.unansweredCreates, let rowId = try unansweredCreate(of: document, model, db) {
                // This device's own create, applied by the server but never answered, was
                // deleted since: the delete wins here too.
                if try Bool.fetchOne(
                    db.cachedStatement(sql: "SELECT EXISTS (SELECT 1 FROM \(model.quotedName) WHERE id = ?)"),
                    arguments: [rowId]) ?? false
                {
                    try removeRow(model, id: rowId, db)
                    outcome.deleted += 1
                } else {
                    try forget(model.name, rowId, db)
                }
            } else {
                try db.cachedStatement(sql: "DELETE FROM tandem_row WHERE tableName = ? AND serverId = ?")
                    .execute(arguments: [model.name, serverId])
                try db.cachedStatement(sql: "DELETE FROM tandem_deferred WHERE collection = ? AND serverId = ?")
                    .execute(arguments: [collection.rawValue, serverId])
            }
            return
        }

        if let local {
            let rowId = local.id
            let knownVersion =
                try Int64.fetchOne(
                    db.cachedStatement(sql: "SELECT serverVersion FROM tandem_row WHERE tableName = ? AND rowId = ?"),
                    arguments: [model.name, rowId]) ?? 0
            guard document.version > knownVersion else { return }  // an echo of our own write, or older
            let isDirty = local.isDirty
            let inConflict =
                try Bool.fetchOne(
                    db.cachedStatement(
                        sql: "SELECT EXISTS (SELECT 1 FROM tandem_conflict WHERE tableName = ? AND rowId = ?)"),
                    arguments: [model.name, rowId]) ?? false
            if isDirty || inConflict {
                // Unpushed local changes: the table's policy decides.
                if try settle(model, rowId: rowId, remote: document, collection: collection, db) != .recorded {
                    outcome.conflicts += 1
                }
            } else {
                try overwrite(model, rowId: rowId, with: document, collection: collection, db)
            }
            outcome.updated += 1
            return
        }

        if context.unansweredCreates, try adoptOwnCreate(document, model, collection, &context, &outcome, db) {
            return
        }

        // Deleted here and not pushed yet: the delete wins; it goes out at this version.
        if context.filedDeletes,
            try Bool.fetchOne(
                db.cachedStatement(
                    sql:
                        "SELECT EXISTS (SELECT 1 FROM tandem_row WHERE tableName = ? AND serverId = ? AND pendingOp = 'delete')"
                ),
                arguments: [model.name, serverId]) ?? false
        {
            // Never back to an older version: a snapshot can bring one this device has
            // already written past (it was queued behind the push that wrote the newer one).
            try db.cachedStatement(
                sql: """
                    UPDATE tandem_row SET serverVersion = MAX(serverVersion, ?1),
                        idempotencyKey = CASE WHEN ?1 > serverVersion THEN NULL ELSE idempotencyKey END
                    WHERE tableName = ?2 AND serverId = ?3 AND pendingOp = 'delete'
                    """
            ).execute(arguments: [document.version, model.name, serverId])
            return
        }
        if try insert(document, into: model, parentRowId: parentRowId, collection: collection, &context, db) {
            outcome.inserted += 1
        }
    }

    /// Recognizes the document of one of this device's own creates whose acknowledgement never
    /// arrived (the connection dropped after the server applied it): the document carries the
    /// create's idempotency key, which is still recorded on the row. The row takes the server
    /// id instead of the document being inserted a second time.
    ///
    /// - Returns: true when the document was this device's own.
    private func adoptOwnCreate(
        _ document: Document, _ model: TableModel, _ collection: CollectionPath, _ context: inout ApplyContext,
        _ outcome: inout ApplyOutcome, _ db: Database
    ) throws -> Bool {
        guard let rowId = try unansweredCreate(of: document, model, db) else { return false }
        let pushedRevision = try Int64.fetchOne(
            db.cachedStatement(sql: "SELECT pushedRevision FROM tandem_row WHERE tableName = ? AND rowId = ?"),
            arguments: [model.name, rowId])
        let serverId = document.id.rawValue
        guard
            let row = try Row.fetchOne(
                db.cachedStatement(sql: "SELECT localRevision, updatedAt FROM \(model.quotedName) WHERE id = ?"),
                arguments: [rowId])
        else {
            // Deleted here meanwhile: the document must go.
            try db.cachedStatement(
                sql: """
                    UPDATE tandem_row SET serverId = ?, collection = ?, serverVersion = ?, pendingOp = 'delete',
                        idempotencyKey = NULL, pushedRevision = NULL, state = 'pending'
                    WHERE tableName = ? AND rowId = ?
                    """
            ).execute(arguments: [serverId, collection.rawValue, document.version, model.name, rowId])
            context.filedDeletes = true
            return true
        }
        try db.cachedStatement(
            sql: "UPDATE \(model.quotedName) SET serverId = ?, localRevision = localRevision + 1 WHERE id = ?"
        ).execute(arguments: [serverId, rowId])
        let localRevision: Int64 = row[0]
        if localRevision == pushedRevision {
            // Unchanged since the create went out: the server's document is the truth.
            try overwrite(model, rowId: rowId, with: document, collection: collection, db)
        } else {
            // Changed since: both sides changed, with no base known to both.
            try db.cachedStatement(
                sql: """
                    UPDATE tandem_row SET serverId = ?, collection = ?, serverVersion = 0, serverFields = NULL,
                        pendingOp = NULL, idempotencyKey = NULL, pushedRevision = NULL, attempts = 0,
                        state = 'pending', lastError = NULL
                    WHERE tableName = ? AND rowId = ?
                    """
            ).execute(arguments: [serverId, collection.rawValue, model.name, rowId])
            _ = try settle(model, rowId: rowId, remote: document, collection: collection, db)
        }
        if context.waiting { try resolveWaiting(model, serverId: serverId, localId: rowId, db) }
        outcome.updated += 1
        return true
    }

    /// The local row whose create, sent but never answered, made this document: the document's
    /// `createKey` is the key still recorded for that create.
    private func unansweredCreate(of document: Document, _ model: TableModel, _ db: Database) throws -> Int64? {
        guard recognizesOwnCreates, let key = document.createKey else { return nil }
        return try Int64.fetchOne(
            db.cachedStatement(
                sql: "SELECT rowId FROM tandem_row WHERE pendingOp = 'create' AND idempotencyKey = ? AND tableName = ?"),
            arguments: [key, model.name])
    }

    /// Replaces a row's synced columns with the server's document and marks it clean.
    func overwrite(
        _ model: TableModel, rowId: Int64, with document: Document, collection: CollectionPath, _ db: Database
    )
        throws
    {
        let incoming = try incomingValues(model, document, db)
        var assignments = incoming.columns.map { "\(SQL.quote($0)) = ?" }
        assignments += ["updatedAt = ?", "isDirty = 0", "localRevision = localRevision + 1"]
        var arguments = StatementArguments(incoming.values)
        arguments += [Self.updatedAt(of: document), rowId]
        try db.cachedStatement(
            sql: "UPDATE \(model.quotedName) SET \(assignments.joined(separator: ", ")) WHERE id = ?"
        )
        .execute(arguments: arguments)
        try recordSynced(model, rowId: rowId, document, collection, db)
        if model.mergesFields { try storeFieldTimes(model, rowId: rowId, Self.fieldTimes(of: document), db) }
        // The document says what each reference is now: forget what the row waited for.
        for column in model.references.keys where document.fields[column] != nil {
            try db.cachedStatement(
                sql: "DELETE FROM tandem_reference WHERE tableName = ? AND rowId = ? AND columnName = ?"
            )
            .execute(arguments: [model.name, rowId, column])
        }
        try recordMissingReferences(model, rowId: rowId, incoming.missing, db)
    }

    /// Inserts a row for a document. A document whose required reference has not arrived yet
    /// is kept aside and inserted when the referenced row arrives.
    ///
    /// - Returns: false when the document was deferred.
    private func insert(
        _ document: Document, into model: TableModel, parentRowId: Int64?, collection: CollectionPath,
        _ context: inout ApplyContext, _ db: Database
    ) throws -> Bool {
        let incoming = try incomingValues(model, document, db)
        if let waiting = incoming.missing.first(where: { !model.optionalReferences.contains($0.column) }) {
            try db.cachedStatement(
                sql: """
                    INSERT OR REPLACE INTO tandem_deferred
                        (collection, serverId, tableName, parentRowId, document, waitingTable, waitingServerId)
                    VALUES (?, ?, ?, ?, ?, ?, ?)
                    """
            ).execute(arguments: [
                collection.rawValue, document.id.rawValue, model.name, parentRowId,
                String(decoding: Wire.encode(document), as: UTF8.self), waiting.table, waiting.serverId,
            ])
            context.waiting = true
            return false
        }
        var columns = incoming.columns
        var values = incoming.values
        if let foreignKey = model.foreignKey {
            columns.append(foreignKey)
            values.append(parentRowId.databaseValue)
        }
        values += [
            document.id.rawValue.databaseValue, 0.databaseValue, Self.updatedAt(of: document).databaseValue,
            1.databaseValue, 1.databaseValue,
        ]
        let sql =
            incoming.columns.count == model.fieldColumns.count
            ? model.insertEveryFieldSQL : TableModel.insertSQL(model.quotedName, columns: columns)
        try db.cachedStatement(sql: sql).execute(arguments: StatementArguments(values))
        let rowId = db.lastInsertedRowID
        try recordSynced(model, rowId: rowId, document, collection, db)
        if model.mergesFields { try storeFieldTimes(model, rowId: rowId, Self.fieldTimes(of: document), db) }
        try recordMissingReferences(model, rowId: rowId, incoming.missing, db)
        if !incoming.missing.isEmpty { context.waiting = true }
        if context.waiting { try resolveWaiting(model, serverId: document.id.rawValue, localId: rowId, db) }
        return true
    }

    /// A reference whose target row is not here yet.
    struct MissingReference {
        var column: String
        var table: String
        var serverId: String
    }

    /// The document's fields as column values, references translated to local ids.
    func incomingValues(_ model: TableModel, _ document: Document, _ db: Database) throws
        -> (columns: [String], values: [DatabaseValue], missing: [MissingReference])
    {
        var columns: [String] = []
        var values: [DatabaseValue] = []
        var missing: [MissingReference] = []
        for column in model.fieldColumns {
            guard let value = document.fields[column] else { continue }
            if let target = model.references[column], let targetModel = byName[target], let serverId = value.stringValue
            {
                if let localId = try localId(targetModel, serverId: serverId, db) {
                    columns.append(column)
                    values.append(localId.databaseValue)
                } else {
                    missing.append(MissingReference(column: column, table: target, serverId: serverId))
                    if model.optionalReferences.contains(column) {
                        columns.append(column)
                        values.append(.null)
                    }
                }
                continue
            }
            columns.append(column)
            values.append(FieldCoding.database(value))
        }
        return (columns, values, missing)
    }

    private func recordSynced(
        _ model: TableModel, rowId: Int64, _ document: Document, _ collection: CollectionPath, _ db: Database
    ) throws {
        try db.cachedStatement(
            sql: """
                INSERT INTO tandem_row (tableName, rowId, serverId, collection, serverVersion, serverFields, state)
                VALUES (?, ?, ?, ?, ?, ?, 'synced')
                ON CONFLICT (tableName, rowId) DO UPDATE SET serverId = excluded.serverId,
                    collection = excluded.collection, serverVersion = excluded.serverVersion,
                    serverFields = excluded.serverFields, pendingOp = NULL, idempotencyKey = NULL,
                    pushedRevision = NULL, attempts = 0, state = 'synced', lastError = NULL
                """
        ).execute(arguments: [
            model.name, rowId, document.id.rawValue, collection.rawValue, document.version,
            model.keepsServerFields ? Self.fieldsText(document.fields) : nil,
        ])
    }

    func recordMissingReferences(
        _ model: TableModel, rowId: Int64, _ missing: [MissingReference], _ db: Database
    )
        throws
    {
        for reference in missing where model.optionalReferences.contains(reference.column) {
            try db.cachedStatement(
                sql: """
                    INSERT OR REPLACE INTO tandem_reference (tableName, rowId, columnName, targetTable, targetServerId)
                    VALUES (?, ?, ?, ?, ?)
                    """
            ).execute(arguments: [model.name, rowId, reference.column, reference.table, reference.serverId])
        }
    }

    /// Whether any reference or document waits for a row to arrive (usually not: then a row
    /// that gets its server id need not look for what waited for it).
    static func anythingWaits(_ db: Database) throws -> Bool {
        try Bool.fetchOne(
            db.cachedStatement(
                sql: "SELECT EXISTS (SELECT 1 FROM tandem_reference) OR EXISTS (SELECT 1 FROM tandem_deferred)"))
            ?? true
    }

    /// A row of `model` now has `serverId` here: fills in the references that waited for it
    /// and inserts the documents that were deferred until it arrived.
    func resolveWaiting(_ model: TableModel, serverId: String, localId: Int64, _ db: Database) throws {
        let waiting = try Row.fetchAll(
            db.cachedStatement(
                sql:
                    "SELECT tableName, rowId, columnName FROM tandem_reference WHERE targetTable = ? AND targetServerId = ?"
            ),
            arguments: [model.name, serverId])
        for row in waiting {
            guard let referencing = byName[row[0] as String] else { continue }
            let column: String = row[2]
            try db.execute(
                sql: """
                    UPDATE \(referencing.quotedName) SET \(SQL.quote(column)) = ?, localRevision = localRevision + 1
                    WHERE id = ?
                    """, arguments: [localId, row[1] as Int64])
        }
        try db.cachedStatement(sql: "DELETE FROM tandem_reference WHERE targetTable = ? AND targetServerId = ?")
            .execute(arguments: [model.name, serverId])

        let deferred = try Row.fetchAll(
            db.cachedStatement(
                sql: """
                    SELECT collection, serverId, tableName, parentRowId, document FROM tandem_deferred
                    WHERE waitingTable = ? AND waitingServerId = ?
                    """),
            arguments: [model.name, serverId])
        for row in deferred {
            try db.cachedStatement(sql: "DELETE FROM tandem_deferred WHERE collection = ? AND serverId = ?")
                .execute(arguments: [row[0] as String, row[1] as String])
            guard let child = byName[row[2] as String], let collection = try? CollectionPath(row[0] as String),
                let document = try? Wire.decode(Document.self, from: Array((row[4] as String).utf8))
            else { continue }
            var outcome = ApplyOutcome()
            var context = ApplyContext.everything
            try applyChange(Change(.added, document), child, collection, row[3], &context, &outcome, db)
        }
    }

    // MARK: - Reset

    /// The server could not resume this listener: remember which documents the full snapshot
    /// brings, so that rows it does not bring can be dropped when it ends.
    func beginReset(_ collection: CollectionPath, _ db: Database) throws {
        try db.execute(
            sql: """
                INSERT INTO tandem_listener (collection, resumeToken, resetting) VALUES (?, NULL, 1)
                ON CONFLICT (collection) DO UPDATE SET resumeToken = NULL, resetting = 1
                """, arguments: [collection.rawValue])
        try db.execute(sql: "DELETE FROM tandem_reset_seen WHERE collection = ?", arguments: [collection.rawValue])
    }

    /// Drops the clean rows of the collection that the full snapshot did not bring.
    private func finishReset(_ model: TableModel, _ collection: CollectionPath, _ parentRowId: Int64?, _ db: Database)
        throws
        -> Int
    {
        var condition = "serverId IS NOT NULL AND isDirty = 0"
        var arguments: StatementArguments = []
        if let foreignKey = model.foreignKey {
            condition += " AND \(SQL.quote(foreignKey)) = ?"
            arguments += [parentRowId]
        }
        arguments += [collection.rawValue]
        let gone = try Int64.fetchAll(
            db,
            sql: """
                SELECT id FROM \(model.quotedName) WHERE \(condition)
                AND serverId NOT IN (SELECT serverId FROM tandem_reset_seen WHERE collection = ?)
                """, arguments: arguments)
        for id in gone { try removeRow(model, id: id, db) }
        try db.execute(sql: "DELETE FROM tandem_reset_seen WHERE collection = ?", arguments: [collection.rawValue])
        // The full snapshot was the whole truth: nothing older can still be on its way.
        try db.execute(sql: "DELETE FROM tandem_gone WHERE collection = ?", arguments: [collection.rawValue])
        try db.execute(
            sql: "UPDATE tandem_listener SET resetting = 0 WHERE collection = ?", arguments: [collection.rawValue])
        return gone.count
    }

    static func updatedAt(of document: Document) -> Int64 {
        document.fields["updatedAt"]?.intValue ?? document.updateTime
    }
}
