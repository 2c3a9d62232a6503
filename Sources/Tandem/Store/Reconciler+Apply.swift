import Foundation
import GRDB
import TandemSQLite
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
    /// Applying left something to push: a conflict settled for the local side or merged, a
    /// filed delete (at a newer version). The service pushes it at once, not at the next
    /// periodic push, since no local commit announces it.
    var leftWorkToPush = false
    /// Changes that found nothing to do: echoes of this device's own writes, or older than
    /// what the device has.
    var unchanged = 0
    /// The snapshot changed nothing but its resume token: the counts of the status stand.
    var changedNothing = false
    /// The snapshot was the last page of a reset's full snapshot: the reset is over.
    var finishedReset = false
}

/// One snapshot being applied: where its documents go, and what applying them found so far.
struct SnapshotApplication {
    let collection: CollectionPath
    /// The local row the collection is nested under, if it is.
    let parentRowId: Int64?
    /// The table's scope, for a document that left it.
    let scope: Query?
    var context: ApplyContext
    var rows: SnapshotRows
    var outcome = ApplyOutcome()

    init(
        collection: CollectionPath, parentRowId: Int64?, scope: Query?, context: ApplyContext, rows: SnapshotRows
    ) {
        (self.collection, self.parentRowId, self.scope) = (collection, parentRowId, scope)
        self.context = context
        self.rows = rows
    }
}

/// A snapshot for the rows of one listener: its collection, the table (and parent row) its
/// documents go to, and the rows a reset's end keeps (see ``ResetWindow``).
struct SnapshotDelivery {
    let snapshot: ServerMessage.Snapshot
    let collection: CollectionPath
    let target: ListenerTarget
    var keeping: Set<Int64> = []
}

extension Reconciler {
    /// A change could not be applied on the first attempt, which has no savepoints: the
    /// caller rolls its transaction back and applies the snapshots again, isolating changes.
    struct ChangeFailed: Error {
        var underlying: any Error
    }

    /// Whether an error is the change's own: the app's table refused its values (a
    /// constraint, a trigger's `RAISE`, a type or size it does not take), which applying it
    /// again cannot mend, so it is left out. Any other database error (a full disk, an I/O
    /// error, a lock held too long) is the database's, and fails the whole snapshot: its token
    /// must not be stored past a change that would apply later.
    static func isChangesOwn(_ error: any Error) -> Bool {
        guard let error = error as? DatabaseError else { return true }
        return [.SQLITE_CONSTRAINT, .SQLITE_MISMATCH, .SQLITE_TOOBIG].contains(error.resultCode)
    }

    /// Applies one snapshot and stores its resume token, in the caller's transaction.
    ///
    /// Each change finds its row through the `serverId` index. A change whose version the row
    /// already has is the echo of this device's own write and changes nothing. A change for a
    /// row with unpushed local changes goes through the conflict policy.
    ///
    /// Usually every change applies, so the first attempt applies them as they come, and a
    /// change that fails throws ``ChangeFailed``. The caller then rolls back and calls again
    /// `isolatingChanges`: each change gets a savepoint of its own, so that only the one that
    /// fails is left out. (A savepoint around the whole snapshot would do the same with one
    /// attempt, but it made SQLite keep a sub-journal of every page the snapshot touched: a
    /// third of the apply's time.)
    func apply(_ delivery: SnapshotDelivery, isolatingChanges: Bool, _ db: Database) throws -> ApplyOutcome {
        let (snapshot, collection, target) = (delivery.snapshot, delivery.collection, delivery.target)
        guard let model = byName[target.table] else { return ApplyOutcome() }
        // A nested listener's snapshot that arrives after its parent row went (it left the
        // scope, or was deleted): nothing of it is kept, its token neither, or the collection
        // would resume from there when the parent comes back.
        if let parentRowId = target.parentRowId, let parent = model.parentTable.flatMap({ byName[$0] }),
            try !Bool.fetchOne(
                db, sql: "SELECT EXISTS (SELECT 1 FROM \(parent.quotedName) WHERE id = ?)", arguments: [parentRowId])!
        {
            return ApplyOutcome()
        }
        let (sending, resetting, flags) = try ledger.applyState(of: collection, db)
        var context = flags
        if sending {
            // Creates whose answer never came, still listed in batch entries: their keys go on
            // their rows, where a document of theirs is recognized.
            try ledger.keepSendingPerRow(tables, keys: nil, db)
            context.unansweredCreates = true
        }
        // Rows are looked up and new ones inserted many per statement on the first attempt;
        // each change on its own when isolating them, since a row that fails must be told from
        // the rest.
        var application = SnapshotApplication(
            collection: collection, parentRowId: target.parentRowId, scope: target.query,
            context: context,
            rows: try SnapshotRows(snapshot, of: model, enabled: !isolatingChanges && !context.waiting, db))
        for change in snapshot.changes {
            if isolatingChanges {
                do {
                    try db.inSavepoint {
                        try applyChange(change, model, &application, db)
                        return .commit
                    }
                } catch {
                    guard Self.isChangesOwn(error) else { throw error }
                    application.outcome.failures.append("\(collection)/\(change.document.id): \(error)")
                }
            } else {
                do { try applyChange(change, model, &application, db) } catch {
                    throw Self.isChangesOwn(error) ? ChangeFailed(underlying: error) : error
                }
            }
        }
        do { try application.rows.insert(db) } catch {
            throw Self.isChangesOwn(error) ? ChangeFailed(underlying: error) : error
        }
        var outcome = application.outcome
        if resetting { try ledger.noteSeenInReset(collection, snapshot.changes.lazy.map(\.document.id), db) }
        try ledger.storeResumeToken(snapshot.resumeToken, for: collection, db)
        if resetting && snapshot.initial && !snapshot.hasMore {
            for rowId in try ledger.resetLeftovers(
                model, collection, parentRowId: target.parentRowId, keeping: delivery.keeping, db)
            {
                outcome.deleted += try removeQuietly(model, rowId: rowId, db)
            }
            try ledger.endReset(collection, db)
            outcome.finishedReset = true
        }
        outcome.changedNothing = !resetting && outcome.unchanged == snapshot.changes.count
        return outcome
    }

    /// Applies one change of a snapshot: a document that left the view, a remote delete, a
    /// newer version of a row this device holds, or a document new to it.
    private func applyChange(
        _ change: Change, _ model: TableModel, _ application: inout SnapshotApplication, _ db: Database
    ) throws {
        let document = change.document
        receiveTimes(of: document)
        let local = try application.rows.lookup(document.id.rawValue, holding: document.version, ledger, db)
        if application.context.gone, try isOlderThanItsDelete(document, application.collection, db) {
            application.outcome.unchanged += 1
            return
        }
        if change.kind == .removed && !document.deleted {
            if let local { try applyRemoval(from: local, after: document, model, &application, db) }
            return
        }
        if application.context.outOfScope, let local { try ledger.backInScope(model, rowId: local.id, db) }
        if change.kind == .deleted || document.deleted {
            try applyDelete(of: document, local: local?.id, model, &application, db)
        } else if let local {
            try applyVersion(document, to: local, model, &application, db)
        } else {
            try applyNew(document, model, &application, db)
        }
    }

    /// What the device knew of a document's delete: the tombstone brings it now (the delete is
    /// forgotten), or the change is older than the delete (queued before it) and brings
    /// nothing (true).
    private func isOlderThanItsDelete(_ document: Document, _ collection: CollectionPath, _ db: Database) throws
        -> Bool
    {
        guard let goneAt = try ledger.goneVersion(collection, document.id.rawValue, db) else { return false }
        if document.version <= goneAt && !document.deleted { return true }
        try ledger.clearGone(collection, document.id.rawValue, db)
        return false
    }

    /// The document left the view (a scope's query, or the user's read rules): the row goes,
    /// unless this device wrote it back in meanwhile.
    private func applyRemoval(
        from local: (id: Int64, isDirty: Bool, holdsVersion: Bool), after document: Document, _ model: TableModel,
        _ application: inout SnapshotApplication, _ db: Database
    ) throws {
        if !local.isDirty,
            try putBackInScope(local.id, after: document, model, &application, db)
        {
            application.outcome.unchanged += 1
        } else {
            try leaveScope(local.id, after: document, model, &application, db)
        }
    }

    /// A remote delete removes the local row, unpushed edits included; so it does this device's
    /// own create, applied by the server but never answered, deleted since.
    private func applyDelete(
        of document: Document, local: Int64?, _ model: TableModel, _ application: inout SnapshotApplication,
        _ db: Database
    ) throws {
        if let local {
            try ledger.removeRow(model, id: local, db)
            application.outcome.deleted += 1
        } else if application.context.unansweredCreates, let create = try unansweredCreate(of: document, model, db) {
            if try ledger.revision(model, rowId: create.rowId, db) != nil {
                try ledger.removeRow(model, id: create.rowId, db)
                application.outcome.deleted += 1
            } else {
                try ledger.forget(model.name, create.rowId, db)
            }
        } else {
            try ledger.forgetDocument(model, application.collection, serverId: document.id.rawValue, db)
        }
    }

    /// A version of a row this device holds: an echo of its own write, or older, changes
    /// nothing; over unpushed local changes the table's policy decides; otherwise it is taken.
    private func applyVersion(
        _ document: Document, to local: (id: Int64, isDirty: Bool, holdsVersion: Bool), _ model: TableModel,
        _ application: inout SnapshotApplication, _ db: Database
    ) throws {
        let collection = application.collection
        guard !local.holdsVersion else {
            // Nothing to do, but to bring the row back into scope (done before this).
            if !application.context.outOfScope { application.outcome.unchanged += 1 }
            return
        }
        if try local.isDirty || ledger.isInConflict(model, rowId: local.id, db) {
            let settlement = try settle(model, rowId: local.id, remote: document, collection: collection, db)
            if settlement != .recorded { application.outcome.conflicts += 1 }
            if settlement == .keptLocal || settlement == .merged { application.outcome.leftWorkToPush = true }
        } else {
            try overwrite(model, rowId: local.id, with: document, collection: collection, db)
        }
        application.outcome.updated += 1
    }

    /// A document the device has no row for: this device's own unanswered create, a document it
    /// deleted and has not pushed yet (the delete wins, at this version), or a new row.
    private func applyNew(
        _ document: Document, _ model: TableModel, _ application: inout SnapshotApplication, _ db: Database
    ) throws {
        if application.context.unansweredCreates,
            try adoptOwnCreate(document, model, &application, db)
        {
            return
        }
        if application.context.filedDeletes,
            try ledger.raiseFiledDelete(model, serverId: document.id.rawValue, to: document.version, db)
        {
            application.outcome.leftWorkToPush = true
            return
        }
        if try insert(document, model, &application, db) {
            application.outcome.inserted += 1
        }
    }

    /// Whether the change that took a clean row's document out of the scope is older than the
    /// row, which matches the scope again at its newer version: this device wrote it back in,
    /// and the acknowledgement came first (the change waited behind the push). The server's
    /// word on the newer version is the echo that follows (a query's listener gets its own
    /// writes); removing the row would bring it back under a new local id. The fields matched
    /// are the server's, where the row keeps them (merged tables), else the row's own, which
    /// its acknowledged push sent. A row in a conflict is left to `leaveScope`, and so is a
    /// document withheld from the user (its change comes at version 0).
    private func putBackInScope(
        _ rowId: Int64, after document: Document, _ model: TableModel, _ application: inout SnapshotApplication,
        _ db: Database
    ) throws -> Bool {
        guard let scope = application.scope, document.version > 0,
            try application.rows.lookup(document.id.rawValue, holding: document.version + 1, ledger, db)?.holdsVersion
                == true,
            try !ledger.isInConflict(model, rowId: rowId, db),
            let fields = try ledger.knownServerFields(model, rowId: rowId, db)
                ?? rowState(model, rowId: rowId, db)?.fields
        else { return false }
        return scope.matches(fields)
    }

    /// The document of a row left a scoped table's query (it no longer matches, or its user
    /// may no longer read it; it is not deleted on the server): the row goes, with the rows
    /// under it. When it or one under it has unpushed changes (or the row is in a conflict
    /// already), nothing goes: the row is marked out of scope, and a `left-scope` conflict asks
    /// the app whether to drop the changes or push them first (see ``ConflictReason/leftScope``).
    private func leaveScope(
        _ rowId: Int64, after document: Document, _ model: TableModel, _ application: inout SnapshotApplication,
        _ db: Database
    ) throws {
        let collection = application.collection
        if try !ledger.isInConflict(model, rowId: rowId, db) {
            let removed = try removeQuietly(model, rowId: rowId, db)
            application.outcome.deleted += removed
            if removed > 0 { return }
        }
        try ledger.markOutOfScope(model, rowId: rowId, db)
        try ledger.recordConflict(
            .init(
                rowId: rowId, server: document, collection: collection,
                local: try rowState(model, rowId: rowId, db)?.fields ?? [:],
                base: try ledger.knownServerFields(model, rowId: rowId, db), fields: [],
                detectedAt: HybridLogicalClock.milliseconds(clock.now()), reason: .leftScope),
            of: model, db)
        application.context.outOfScope = true
    }

    /// Rows out of scope whose conflict the app resolved go once nothing under them waits to be
    /// pushed: after each acknowledgement, conflict answer and resolution.
    ///
    /// - Returns: How many rows were removed.
    @discardableResult
    func removeRowsOutOfScope(_ db: Database) throws -> Int {
        guard try ledger.anyOutOfScope(db) else { return 0 }
        var removed = 0
        for (table, rowId) in try ledger.outOfScopeRows(db) {
            guard let model = byName[table] else { continue }
            removed += try removeQuietly(model, rowId: rowId, db)
        }
        return removed
    }

    /// Removes a row the device stops holding while its document stays on the server (it left
    /// its table's scope, or a reset's full snapshot did not bring it), and the rows nested
    /// under it (the entries of an account the user no longer shares), children first, without
    /// filing deletes. When the row or one under it has unpushed changes, nothing is removed
    /// (unless `discardingChanges`: the app chose to drop them).
    ///
    /// Other rows that reference a removed row keep the reference: the column goes null by
    /// Tandem's own write (not a change to push) and waits for the row's server id, as a
    /// reference to a row not arrived yet does. The removed rows' nested listeners forget their
    /// tokens, so that holding the row again brings all of its collection.
    ///
    /// - Returns: How many rows were removed.
    @discardableResult
    func removeQuietly(_ model: TableModel, rowId: Int64, discardingChanges: Bool = false, _ db: Database) throws
        -> Int
    {
        var subtree: [(TableModel, Int64)] = []
        func collect(_ model: TableModel, _ rowId: Int64, isDirty: Bool) throws -> Bool {
            if isDirty && !discardingChanges { return false }
            for child in tables where child.parentTable == model.name {
                guard let foreignKey = child.foreignKey else { continue }
                let rows = try Row.fetchAll(
                    db, sql: "SELECT id, isDirty FROM \(child.quotedName) WHERE \(SQL.quote(foreignKey)) = ?",
                    arguments: [rowId])
                for row in rows where try !collect(child, row[0], isDirty: row[1]) { return false }
            }
            subtree.append((model, rowId))
            return true
        }
        let isDirty = try Bool.fetchOne(
            db, sql: "SELECT isDirty FROM \(model.quotedName) WHERE id = ?", arguments: [rowId])
        guard try collect(model, rowId, isDirty: isDirty ?? false) else { return 0 }
        // What names the rows, while their server ids are still here.
        var memo: [String: CollectionPath?] = [:]
        var collections: [CollectionPath] = []
        for (model, rowId) in subtree {
            for child in tables where child.parentTable == model.name {
                if let path = try collection(of: child, parentRowId: rowId, db, memo: &memo) {
                    collections.append(path)
                }
            }
            if let serverId = try serverId(model.name, localId: rowId, db) {
                try keepReferences(to: model, rowId: rowId, serverId: serverId, db)
            }
        }
        for (model, rowId) in subtree { try ledger.removeRow(model, id: rowId, db) }
        for collection in collections { try ledger.forgetListener(collection, db) }
        return subtree.count
    }

    /// Rows that reference a row about to go keep the reference as one waiting for its server
    /// id (the column null, by Tandem's own write: nothing to push).
    private func keepReferences(to target: TableModel, rowId: Int64, serverId: String, _ db: Database) throws {
        for model in tables {
            for (column, table) in model.references where table == target.name {
                let referencing = try Int64.fetchAll(
                    db, sql: "SELECT id FROM \(model.quotedName) WHERE \(SQL.quote(column)) = ?", arguments: [rowId])
                for id in referencing {
                    try db.execute(
                        sql: """
                            UPDATE \(model.quotedName) SET \(SQL.quote(column)) = NULL, localRevision = localRevision + 1
                            WHERE id = ?
                            """, arguments: [id])
                    try ledger.recordWaitingReference(
                        model, rowId: id, MissingReference(column: column, table: target.name, serverId: serverId), db)
                }
            }
        }
    }

    /// Recognizes the document of one of this device's own creates whose acknowledgement never
    /// arrived (the connection dropped after the server applied it): the document carries the
    /// create's idempotency key, which is still recorded on the row. The row takes the server
    /// id instead of the document being inserted a second time.
    ///
    /// - Returns: true when the document was this device's own.
    private func adoptOwnCreate(
        _ document: Document, _ model: TableModel, _ application: inout SnapshotApplication, _ db: Database
    )
        throws -> Bool
    {
        let collection = application.collection
        guard let create = try unansweredCreate(of: document, model, db) else { return false }
        let rowId = create.rowId
        let serverId = document.id.rawValue
        let applied = AppliedCreate(rowId: rowId, serverId: serverId, collection: collection)
        guard let revision = try ledger.revision(model, rowId: rowId, db) else {
            // Deleted here meanwhile: the document must go.
            try ledger.fileDeleteOfOwnCreate(model, applied, version: document.version, db)
            application.context.filedDeletes = true
            application.outcome.leftWorkToPush = true
            return true
        }
        // Changed since the create went out: both sides changed, with no base known to both.
        let keepsLocal = revision != create.pushedRevision
        try ledger.adoptOwnCreate(model, applied, keepsLocal: keepsLocal, db)
        if keepsLocal {
            let settlement = try settle(model, rowId: rowId, remote: document, collection: collection, db)
            if settlement == .keptLocal || settlement == .merged { application.outcome.leftWorkToPush = true }
        } else {
            // Unchanged since the create went out: the server's document is the truth.
            try overwrite(model, rowId: rowId, with: document, collection: collection, db)
        }
        if application.context.waiting { try resolveWaiting(model, serverId: serverId, localId: rowId, db) }
        application.outcome.updated += 1
        return true
    }

    /// The local row whose create, sent but never answered, made this document: the document's
    /// `createKey` is the key still recorded for that create.
    private func unansweredCreate(of document: Document, _ model: TableModel, _ db: Database) throws
        -> (rowId: Int64, pushedRevision: Int64?)?
    {
        guard recognizesOwnCreates, let key = document.createKey else { return nil }
        return try ledger.unansweredCreate(model, key: key, db)
    }

    /// Replaces a row's synced columns with the server's document and marks it clean.
    func overwrite(
        _ model: TableModel, rowId: Int64, with document: Document, collection: CollectionPath, _ db: Database
    )
        throws
    {
        let incoming = try incomingValues(model, document, db)
        var assignments = incoming.columns.map { "\(SQL.quote($0)) = ?" }
        assignments += ["updatedAt = ?", "serverVersion = ?", "isDirty = 0", "localRevision = localRevision + 1"]
        try db.cachedStatement(
            sql: "UPDATE \(model.quotedName) SET \(assignments.joined(separator: ", ")) WHERE id = ?"
        ).execute { values in
            for value in incoming.values { values.bind(value) }
            values.bind(Self.updatedAt(of: document))
            values.bind(document.version)
            values.bind(rowId)
        }
        try ledger.recordSynced(model, rowId: rowId, document, collection, db)
        if model.mergesFields { try ledger.storeFieldTimes(model, rowId: rowId, Self.fieldTimes(of: document), db) }
        // The document says what each reference is now: forget what the row waited for.
        for column in model.references.keys where document.fields[column] != nil {
            try ledger.clearWaitingReference(model, rowId: rowId, column: column, db)
        }
        try recordMissingReferences(model, rowId: rowId, incoming.missing, db)
    }

    /// Inserts a row for a document. A document whose required reference has not arrived yet
    /// is kept aside and inserted when the referenced row arrives.
    ///
    /// - Returns: false when the document was deferred.
    private func insert(
        _ document: Document, _ model: TableModel, _ application: inout SnapshotApplication, _ db: Database
    ) throws
        -> Bool
    {
        let (collection, parentRowId) = (application.collection, application.parentRowId)
        let incoming = try incomingValues(model, document, db)
        if application.rows.insertsLater && incoming.columns.count == model.fieldColumns.count {
            try application.rows.add(incoming.values, of: document, db)
            return true
        }
        try application.rows.insert(db)
        if let waiting = incoming.missing.first(where: { !model.optionalReferences.contains($0.column) }) {
            let deferred = SyncLedger.DeferredDocument(
                table: model.name, collection: collection, parentRowId: parentRowId, document: document)
            try ledger.deferDocument(deferred, waitingFor: waiting, db)
            application.context.waiting = true
            return false
        }
        let sql =
            incoming.columns.count == model.fieldColumns.count
            ? model.insertEveryFieldSQL
            : TableModel.insertSQL(model.quotedName, columns: incoming.columns + (model.foreignKey.map { [$0] } ?? []))
        // serverId, isDirty, updatedAt, isShared, localRevision, serverVersion: see `insertSQL`.
        try db.cachedStatement(sql: sql).execute { values in
            for value in incoming.values { values.bind(value) }
            if model.foreignKey != nil { values.bind(parentRowId) }
            values.bind(document.id.rawValue)
            values.bind(false)
            values.bind(Self.updatedAt(of: document))
            values.bind(true)
            values.bind(1 as Int64)
            values.bind(document.version)
        }
        let rowId = db.lastInsertedRowID
        if model.recordsSyncedRows { try ledger.recordSynced(model, rowId: rowId, document, collection, db) }
        if model.mergesFields { try ledger.storeFieldTimes(model, rowId: rowId, Self.fieldTimes(of: document), db) }
        try recordMissingReferences(model, rowId: rowId, incoming.missing, db)
        if !incoming.missing.isEmpty { application.context.waiting = true }
        if application.context.waiting { try resolveWaiting(model, serverId: document.id.rawValue, localId: rowId, db) }
        return true
    }

    /// The document's fields as column values, references translated to local ids.
    func incomingValues(_ model: TableModel, _ document: Document, _ db: Database) throws
        -> (columns: [String], values: [DatabaseValue], missing: [MissingReference])
    {
        var columns: [String] = []
        var values: [DatabaseValue] = []
        // At their final size: grown from empty, each was allocated three times a document.
        columns.reserveCapacity(model.fieldColumns.count)
        values.reserveCapacity(model.fieldColumns.count)
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

    func recordMissingReferences(
        _ model: TableModel, rowId: Int64, _ missing: [MissingReference], _ db: Database
    )
        throws
    {
        for reference in missing where model.optionalReferences.contains(reference.column) {
            try ledger.recordWaitingReference(model, rowId: rowId, reference, db)
        }
    }

    /// A row of `model` now has `serverId` here: fills in the references that waited for it
    /// and inserts the documents that were deferred until it arrived.
    func resolveWaiting(_ model: TableModel, serverId: String, localId: Int64, _ db: Database) throws {
        let waiting = try ledger.takeWaiting(model, serverId: serverId, db)
        for reference in waiting.references {
            guard let referencing = byName[reference.table] else { continue }
            try db.execute(
                sql: """
                    UPDATE \(referencing.quotedName) SET \(SQL.quote(reference.column)) = ?,
                        localRevision = localRevision + 1
                    WHERE id = ?
                    """, arguments: [localId, reference.rowId])
        }
        for deferred in waiting.documents {
            guard let child = byName[deferred.table] else { continue }
            try apply(deferred.document, of: child, in: deferred.collection, under: deferred.parentRowId, db)
        }
    }

    /// Applies a document that was kept aside, as a change of its own, looking for everything.
    private func apply(
        _ document: Document, of model: TableModel, in collection: CollectionPath, under parentRowId: Int64?,
        _ db: Database
    ) throws {
        var application = SnapshotApplication(
            collection: collection, parentRowId: parentRowId, scope: nil, context: .everything,
            rows: try SnapshotRows(nil, of: model, enabled: false, db))
        try applyChange(Change(.added, document), model, &application, db)
    }

    static func updatedAt(of document: Document) -> Int64 {
        document.fields["updatedAt"]?.intValue ?? document.updateTime
    }
}

/// The rows of a snapshot's documents, read and written many per statement.
///
/// **Lookups.** Each change looks its row up by server id. When the snapshot's documents are
/// distinct (as the server sends them), their rows are read before the changes apply, 64 server
/// ids per `SELECT … WHERE serverId IN (…)`, instead of one statement a change. In a table
/// that qualifies for the inserts below, applying a change writes the server id, version or
/// dirty flag of its own row only (and rows of other tables), so what was read stays true for
/// the changes after it.
///
/// **Inserts.** SQLite keeps a statement journal for each insert into a synced table: Tandem's
/// triggers are on it (which makes any insert a write of possibly many rows) and call a SQL
/// function (which SQLite takes as able to fail), so each statement first copies every page it
/// will change, to undo itself alone. One statement of 64 rows copies each page once (the
/// table's last page, an index page, `sqlite_sequence` for an `AUTOINCREMENT` table) where 64
/// statements copied them 64 times. Counted by callgrind in a C program with the schema of the
/// benchmarks' device table (the app's table, Tandem's columns, indexes and triggers): 36,500
/// instructions a row one per statement, 23,300 in statements of 16, 19,400 of 64.
///
/// Only rows that need nothing after their insert are kept for later: documents that carry
/// every field, of a root table that does not merge and has no references (no bookkeeping row,
/// field times or waiting references to record), while nothing waits for a row to arrive. The
/// rows go in when 64 are kept, before a change of a document kept here is looked up, before
/// any other insert, and at the end of the snapshot; a failure makes the caller apply the
/// snapshot again, each change on its own (``Reconciler/ChangeFailed``).
struct SnapshotRows {
    private let model: TableModel
    /// Whether new rows are kept to be inserted many per statement.
    let insertsLater: Bool
    private var rows: [(values: [DatabaseValue], serverId: String, updatedAt: Int64, version: Int64)] = []
    private var serverIds: Set<String> = []
    /// The rows of the snapshot's documents, read before its changes apply, by server id (nil:
    /// not read; each change looks its row up).
    private var found: [String: (id: Int64, isDirty: Bool, version: Int64)]?

    static let maxPerStatement = 64

    init(_ snapshot: ServerMessage.Snapshot?, of model: TableModel, enabled: Bool, _ db: Database) throws {
        self.model = model
        // A statement of 64 rows binds every field and the six sync columns of each: within
        // what this SQLite takes (32,766 values by default, 999 before 3.32).
        insertsLater =
            enabled && !model.recordsSyncedRows && !model.mergesFields && model.references.isEmpty
            && model.foreignKey == nil
            && (model.fieldColumns.count + 6) * Self.maxPerStatement <= db.maximumStatementArgumentCount
        // Under the same conditions: with references, a change can insert rows of other
        // documents (those that waited for its row), which a read before would not know.
        guard insertsLater, let changes = snapshot?.changes, changes.count > 1 else { return }
        let ids = changes.map(\.document.id.rawValue)
        guard Set(ids).count == ids.count else { return }
        var found: [String: (id: Int64, isDirty: Bool, version: Int64)] = [:]
        found.reserveCapacity(ids.count)
        for group in StatementRows.groups(of: ids.indices) {
            let statement = try db.cachedStatement(sql: model.lookupRowsSQL[group.count]!)
            try statement.bindForGRDB { values in for index in group { values.bind(ids[index]) } }
            let cursor = try Row.fetchCursor(statement)
            while let row = try cursor.next() { found[row[0]] = (row[1], row[2], row[3]) }
        }
        self.found = found
    }

    /// The row holding the document `serverId`, as ``SyncLedger/lookup(_:serverId:holding:_:)``
    /// finds it.
    mutating func lookup(_ serverId: String, holding version: Int64, _ ledger: SyncLedger, _ db: Database) throws
        -> (id: Int64, isDirty: Bool, holdsVersion: Bool)?
    {
        if let found {
            return found[serverId].map { ($0.id, $0.isDirty, $0.version >= version) }
        }
        // A second change of a document whose row waits to be inserted finds that row.
        if !rows.isEmpty && serverIds.contains(serverId) { try insert(db) }
        return try ledger.lookup(model, serverId: serverId, holding: version, db)
    }

    mutating func add(_ values: [DatabaseValue], of document: Document, _ db: Database) throws {
        rows.append((values, document.id.rawValue, Reconciler.updatedAt(of: document), document.version))
        // Only looked for when the rows were not read first (then documents may repeat).
        if found == nil { serverIds.insert(document.id.rawValue) }
        if rows.count == Self.maxPerStatement { try insert(db) }
    }

    /// Inserts the rows kept, in groups of 64, 16, 4 or 1 (four statements to compile at most).
    mutating func insert(_ db: Database) throws {
        guard !rows.isEmpty else { return }
        for group in StatementRows.groups(of: rows.indices) {
            // serverId, isDirty, updatedAt, isShared, localRevision, serverVersion: see `insertSQL`.
            try db.cachedStatement(sql: model.insertRowsSQL[group.count]!).execute { values in
                for index in group {
                    for value in rows[index].values { values.bind(value) }
                    values.bind(rows[index].serverId)
                    values.bind(false)
                    values.bind(rows[index].updatedAt)
                    values.bind(true)
                    values.bind(1 as Int64)
                    values.bind(rows[index].version)
                }
            }
        }
        rows.removeAll(keepingCapacity: true)
        serverIds.removeAll(keepingCapacity: true)
    }
}
