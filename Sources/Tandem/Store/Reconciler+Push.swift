import Foundation
import GRDB
import TandemWire

/// One op of a push, with what its write-back needs.
struct PreparedPush: Sendable {
    var table: String
    var rowId: Int64
    var op: WriteOp
    /// The row's `localRevision` when the op's idempotency key was first sent: if it differs
    /// at write-back, the row changed since and stays dirty.
    var revision: Int64
    /// A reference went out as null because its target has no server id yet: push again.
    var incomplete: Bool
    /// The batch entry (`tandem_sending`) a create was recorded in, for a row without a
    /// `tandem_row` entry; nil when the op's key is recorded on its row.
    var sendingEntry: ClientName? = nil
}

/// How far one push has come: each batch starts after the rows the batches before it took,
/// so that a batch can be prepared while the one before it is still on its way.
struct PushCursor {
    /// The last filed delete taken, by table and row.
    var lastDelete: (table: String, rowId: Int64) = ("", .min)
    /// The last row taken of each table.
    var lastRow: [String: Int64] = [:]
    /// A row was passed over and is still to push: its parent or a required reference target
    /// had no server id yet, or it went out with a reference still missing.
    var passedOver = false
    /// The last batch read every filed delete and dirty row there was: no batch after it
    /// would find any.
    var reachedEnd = false
    /// The batch entries left by pushes before this one were turned into row entries.
    var recovered = false
}

/// A batch being prepared: its ops so far, against its bounds.
struct PushBatch {
    let maxOps: Int
    let maxBytes: Int
    var prepared: [PreparedPush] = []
    var bytes = 0
    /// Every filed delete and dirty row there was has been read.
    var readEverything = true
    /// Each row's collection by its parent's row, found once per batch.
    var collections: [String: CollectionPath?] = [:]

    var isFull: Bool { prepared.count >= maxOps || bytes >= maxBytes }
}

/// A dirty row's columns, as ``SyncLedger/dirtyRows(_:syncs:after:limit:_:)`` reads them
/// before its fields, named.
private struct DirtyRow {
    var rowId: Int64
    var revision: Int64
    var updatedAt: Int64
    var serverId: String?
    var parentRowId: Int64?
    var serverVersion: Int64?
    var recordedKey: String?
    var pushedRevision: Int64?
    var hasEntry: Bool
    /// The row's field columns, read after the bookkeeping ones.
    let fields: RowFields

    /// The collection the row synced in: read only when asked, for a row that has synced.
    var syncedCollection: String? { fields.row[7] }

    init(_ row: Row) {
        rowId = row[0]
        revision = row[1]
        updatedAt = row[2]
        serverId = row[3]
        parentRowId = row[4]
        serverVersion = row[5]
        recordedKey = row[6]
        pushedRevision = row[8]
        hasEntry = (row[9] as String?) != nil
        fields = RowFields(row, from: SyncLedger.dirtyRowColumns, rowId: rowId)
    }

    /// A key stays bound to the revision it was first sent with. If an op went out, was
    /// applied, and its answer was lost, the resend under the same key gets that first answer
    /// back: the row must then stay dirty when it changed since, or its newer content would be
    /// taken for pushed.
    var keyRevision: Int64 { recordedKey != nil ? (pushedRevision ?? revision) : revision }
}

/// The creates of one table's rows with no bookkeeping yet, recorded together under one batch
/// entry, and the keys of the table's other ops, recorded on their rows.
private struct TableSendings {
    var perRow: [SyncLedger.Sending] = []
    /// A row was passed over: its parent or a required reference target had no server id.
    var passedOver = false
    var entry: ClientName?
    var entryCreates: [(rowId: Int64, revision: Int64)] = []
}

extension Reconciler {
    /// Builds the next batch of ops, after the cursor, and records, before anything is sent,
    /// the idempotency key of each: a resend after a lost answer must carry the same key,
    /// even after a crash. The creates of rows with no bookkeeping yet are recorded together,
    /// in one batch entry per table (``SyncLedger/recordSending(_:under:_:_:)``); the other
    /// ops on their rows (``SyncLedger/recordSending(_:_:_:)``).
    ///
    /// Filed deletes come first, then dirty rows table by table, parents before children (a
    /// child's collection needs its parent's server id, so it waits for the parent's create).
    func preparePush(maxOps: Int, maxBytes: Int, after cursor: inout PushCursor, _ db: Database) throws
        -> [PreparedPush]
    {
        if !cursor.recovered {
            // Its creates go out again under the same keys, recorded on their rows.
            cursor.recovered = true
            try keepUnansweredSendingPerRow(db)
        }
        var batch = PushBatch(maxOps: maxOps, maxBytes: maxBytes)
        try prepareDeletes(into: &batch, after: &cursor, db)
        for model in tables {
            guard !batch.isFull else {
                batch.readEverything = false
                break
            }
            try prepareRows(of: model, into: &batch, after: &cursor, db)
        }
        cursor.reachedEnd = batch.readEverything
        return batch.prepared
    }

    /// The filed deletes after the cursor, as many as the batch takes.
    private func prepareDeletes(into batch: inout PushBatch, after cursor: inout PushCursor, _ db: Database) throws {
        let deletes = try ledger.filedDeletes(after: cursor.lastDelete, limit: batch.maxOps, db)
        // A query that returned as many rows as its limit may have left some.
        if deletes.count >= batch.maxOps { batch.readEverything = false }
        for row in deletes {
            let table: String = row[0], rowId: Int64 = row[1]
            cursor.lastDelete = (table, rowId)
            guard let serverId = try? DocumentID(row[2] as String? ?? ""),
                let collection = try? CollectionPath(row[3] as String? ?? "")
            else {
                try ledger.forget(table, rowId, db)
                continue
            }
            let key = try key(row[5], table, rowId, db)
            let version: Int64 = row[4]
            batch.prepared.append(
                PreparedPush(
                    table: table, rowId: rowId,
                    op: .delete(
                        in: collection, id: serverId, baseVersion: version > 0 ? version : nil, idempotencyKey: key),
                    revision: 0, incomplete: false))
        }
    }

    /// One table's dirty rows after the cursor, as many as the batch takes, with their keys
    /// recorded.
    private func prepareRows(
        of model: TableModel, into batch: inout PushBatch, after cursor: inout PushCursor, _ db: Database
    ) throws {
        let limit = batch.maxOps - batch.prepared.count
        let rows = try ledger.dirtyRows(
            model, syncs: syncsCondition(model, alias: "t"), after: cursor.lastRow[model.name] ?? .min,
            limit: limit, db)
        var read = 0
        // The keys are recorded once the rows are read, before the batch is sent.
        var sendings = TableSendings()
        while let row = try rows.next() {
            read += 1
            if read == limit { batch.readEverything = false }
            let dirty = DirtyRow(row)
            cursor.lastRow[model.name] = dirty.rowId
            guard let push = try preparePush(of: dirty, model, into: &batch, &sendings, db) else {
                continue
            }
            if push.incomplete { cursor.passedOver = true }
            batch.prepared.append(push)
            batch.bytes += 64
            if batch.bytes >= batch.maxBytes {
                batch.readEverything = false
                break
            }
        }
        // A row passed over without an op waits for its parent's or target's server id.
        if sendings.passedOver { cursor.passedOver = true }
        try ledger.recordSending(model, sendings.perRow, db)
        if let entry = sendings.entry { try ledger.recordSending(model, under: entry, sendings.entryCreates, db) }
    }

    /// The op of one dirty row, its key noted in `sendings`; nil for a row that cannot go yet
    /// (no parent server id, a required reference target without one) or never (it moved to
    /// another parent: failed).
    private func preparePush(
        of dirty: DirtyRow, _ model: TableModel, into batch: inout PushBatch, _ sendings: inout TableSendings,
        _ db: Database
    ) throws -> PreparedPush? {
        guard let collection = try collection(of: model, parentRowId: dirty.parentRowId, db, memo: &batch.collections)
        else {
            sendings.passedOver = true
            return nil
        }
        let (fields, incomplete, waitsForTarget) = try outgoingFields(of: dirty, model, db)
        batch.bytes += fields.count
        if waitsForTarget {
            sendings.passedOver = true
            return nil
        }
        // The collection the row synced in (read only for a row that has synced).
        if dirty.serverId != nil, let known = dirty.syncedCollection, known != collection.rawValue {
            try ledger.fail(
                model.name, dirty.rowId,
                TandemError(
                    .invalidArgument,
                    "the row moved to another parent (\(known) → \(collection)); Tandem cannot move documents: "
                        + "delete the row and insert a new one"), db)
            return nil
        }
        var (op, sendingEntry) = try makeOp(dirty, collection, fields, &sendings)
        if model.mergesFields {
            // Field-level tables merge on the server, field by field, with no precondition.
            op.baseVersion = nil
            op.fieldTimes = try ledger.localFieldTimes(model, rowId: dirty.rowId, updatedAt: dirty.updatedAt, db)
                .filter { time in model.pushedKeys.contains { $0.key == time.key } }
        }
        if sendingEntry == nil {
            sendings.perRow.append(
                SyncLedger.Sending(
                    rowId: dirty.rowId, serverId: dirty.serverId, collection: collection, kind: op.kind,
                    key: op.idempotencyKey, revision: dirty.keyRevision))
        }
        return PreparedPush(
            table: model.name, rowId: dirty.rowId, op: op, revision: dirty.keyRevision, incomplete: incomplete,
            sendingEntry: sendingEntry)
    }

    /// A row's fields as they go out, and what its references say: `incomplete` when an
    /// optional reference went out as null for a target without a server id yet (it goes again
    /// once it has one), `waitsForTarget` when a required one has none (the row waits).
    private func outgoingFields(of dirty: DirtyRow, _ model: TableModel, _ db: Database) throws
        -> (fields: [UInt8], incomplete: Bool, waitsForTarget: Bool)
    {
        // What the closure below reads, taken out of the model: capturing the model copied it
        // for each row.
        let (references, optionalReferences) = (model.references, model.optionalReferences)
        var incomplete = false
        var waitsForTarget = false
        let fields = try outgoingFieldsJSON(
            model, of: dirty.fields, updatedAt: dirty.updatedAt, db
        ) { column, targetId in
            let pending = try targetWillSync(references[column]!, targetId, db)
            if pending && !optionalReferences.contains(column) { waitsForTarget = true }
            incomplete = incomplete || pending
        }
        return (fields, incomplete, waitsForTarget)
    }

    /// The update or create a dirty row sends, under the key recorded for it or a new one; a
    /// new row with no bookkeeping gets its key from the table's batch entry (returned, with
    /// its create noted in `sendings`).
    private func makeOp(
        _ dirty: DirtyRow, _ collection: CollectionPath, _ fields: [UInt8], _ sendings: inout TableSendings
    ) throws -> (WriteOp, sendingEntry: ClientName?) {
        let recorded = dirty.recordedKey.flatMap { try? ClientName($0) }
        if let serverId = dirty.serverId, let id = try? DocumentID(serverId) {
            let op = WriteOp(
                kind: .update, collection: collection, id: id, canonicalFields: fields,
                baseVersion: dirty.serverVersion, idempotencyKey: recorded ?? newKey())
            return (op, nil)
        }
        let key: ClientName
        var sendingEntry: ClientName?
        if let recorded {
            key = recorded
        } else if dirty.serverId == nil, !dirty.hasEntry {
            // A new row with no bookkeeping: its create goes in the table's batch entry.
            let batchKey = sendings.entry ?? newKey()
            sendings.entry = batchKey
            sendingEntry = batchKey
            sendings.entryCreates.append((dirty.rowId, dirty.keyRevision))
            key = try SyncLedger.sendingKey(batchKey, rowId: dirty.rowId)
        } else {
            key = newKey()
        }
        let op = WriteOp(
            kind: .create, collection: collection, id: nil, canonicalFields: fields, baseVersion: nil,
            idempotencyKey: key)
        return (op, sendingEntry)
    }

    /// Whether a referenced row without a server id is about to get one (it syncs and its push
    /// has not failed): then the referencing row is pushed again with the real id. A target
    /// that will not get one (not shared, or failed) leaves the reference null, so that the
    /// row does not go out again and again.
    private func targetWillSync(_ table: String, _ localId: Int64, _ db: Database) throws -> Bool {
        guard let model = byName[table] else { return false }
        let syncs =
            try Bool.fetchOne(
                db,
                sql: """
                    SELECT EXISTS (SELECT 1 FROM \(model.quotedName) AS r
                    WHERE r.id = ? AND \(syncsCondition(model, alias: "r", waitingForParents: true)))
                    """,
                arguments: [localId]) ?? false
        return try syncs && !ledger.isFailed(model, rowId: localId, db)
    }

    /// A new idempotency key, ordered by the device's clock.
    private func newKey() -> ClientName {
        ClientName.key(milliseconds: HybridLogicalClock.milliseconds(clock.latest))
    }

    /// The key already recorded for a row's pending op, or a new one, recorded.
    private func key(_ recorded: String?, _ table: String, _ rowId: Int64, _ db: Database) throws -> ClientName {
        if let recorded, let key = try? ClientName(recorded) { return key }
        let key = newKey()
        try ledger.recordDeleteKey(key, table, rowId, db)
        return key
    }

    // MARK: - Answers

    /// Writes an `ack` back: server ids and versions, and `isDirty = 0` only for rows that did
    /// not change while their push was in flight.
    ///
    /// A row of a scoped table that is clean after its acknowledgement, and whose document the
    /// scope does not select (or its user may not read: the answer withheld), goes, with the
    /// rows under it (once they are pushed, when they wait): this device wrote it outside the
    /// scope (a create, or an update that put back a document whose leaving the listener had
    /// told), and the listener's view says nothing of a document that was never in it.
    ///
    /// - Parameter scopes: The scope of each scoped table, as its listener asks for it.
    /// - Returns: A description of each duplicate found: a create whose server id another
    ///   local row already holds. That can only happen when a listener applied the server's
    ///   echo of the create before this write-back, the race the sync queue's barrier exists
    ///   to prevent. And how many rows went as outside their scope (their nested listeners
    ///   close at the next refresh).
    func recordAcknowledgement(
        _ pushes: [PreparedPush], _ results: [WriteResult], scopes: [String: Query] = [:], _ db: Database
    ) throws -> (duplicates: [String], conflicts: Int, leftScope: Int) {
        var pushes = pushes
        // An answer short of results leaves ops unanswered: their creates keep their keys on
        // their rows, and the acknowledgement settles those rows as it does any row with an
        // entry. So does the batch entry a listener without the barrier turned into row
        // entries meanwhile.
        if results.count < pushes.count { try answeredOtherwise(pushes, db) }
        let recorded = try ledger.sendingAnswered(Set(pushes.compactMap(\.sendingEntry)), db)
        for index in pushes.indices {
            if let entry = pushes[index].sendingEntry, !recorded.contains(entry) { pushes[index].sendingEntry = nil }
        }
        var answer = Acknowledgement(pushes, results, waiting: try ledger.anythingWaits(db))
        defer { clock.receive(HybridLogicalClock.timestamp(milliseconds: answer.latest)) }
        // Read in place, by index: a push copied is its op's strings and fields retained.
        let answeredCount = min(pushes.count, results.count)
        var start = 0
        while start < answeredCount {
            guard let model = byName[pushes[start].table] else {
                start += 1
                continue
            }
            if pushes[start].op.kind == .delete {
                let result = results[start]
                answer.received(result)
                if let stored = result.document { receiveTimes(of: stored) }
                try ledger.forget(pushes[start].table, pushes[start].rowId, db)
                try ledger.rememberGone(pushes[start].op.collection, result.id, version: result.version, db)
                start += 1
                continue
            }
            // The creates and updates of one table that follow each other are acknowledged
            // together.
            var end = start + 1
            while end < answeredCount, pushes[end].table == pushes[start].table, pushes[end].op.kind != .delete {
                end += 1
            }
            let run = start..<end
            start = end
            let outcomes = try ledger.acknowledge(model, pushes[run], results[run], db)
            answer.scope = scopes.isEmpty ? nil : scopes[model.name]
            for (index, outcome) in zip(run, outcomes) {
                try settleAcknowledged(index, outcome, model, &answer, db)
            }
        }
        var leftScope = 0
        for (model, rowId) in answer.outsideScope {
            let removed = try removeQuietly(model, rowId: rowId, db)
            leftScope += removed
            // Rows under it wait to be pushed (they could not go before it had its server id):
            // it goes once they have gone out, as a row that left the scope does.
            if removed == 0 { try ledger.markOutOfScope(model, rowId: rowId, db) }
        }
        leftScope += try removeRowsOutOfScope(db)
        return (answer.duplicates, answer.conflicts, leftScope)
    }

    /// One create or update the server acknowledged, after the ledger wrote its server id and
    /// version back: a duplicate is failed, rows waiting for it are resolved, a merge's newer
    /// fields are taken, and a row its scope does not select is noted to go.
    ///
    /// By index into `answer`'s pushes and results, each read in place: a push copied is its
    /// op's strings and fields retained and released.
    private func settleAcknowledged(
        _ index: Int, _ outcome: SyncLedger.Acknowledged, _ model: TableModel, _ answer: inout Acknowledgement,
        _ db: Database
    ) throws {
        let (pushes, results) = (answer.pushes, answer.results)
        answer.latest = max(answer.latest, results[index].updateTime)
        if let stored = results[index].document { receiveTimes(of: stored) }
        let clean: Bool
        switch outcome {
        case .row(let isClean):
            clean = isClean
        case .deletedMeanwhile:
            // Deleted while its push was in flight: the document exists now, so it is deleted next.
            return
        case .duplicate(let other):
            let message =
                "duplicate: the server's document \(results[index].id) was already inserted as row "
                + "\(other.map(String.init) ?? "?") by the listener before this push's write-back"
            try ledger.fail(model.name, pushes[index].rowId, TandemError(.database, message), db)
            answer.duplicates.append("\(model.name) row \(pushes[index].rowId): \(message)")
            return
        }
        if pushes[index].op.kind == .create, answer.waiting {
            try resolveWaiting(model, serverId: results[index].id.rawValue, localId: pushes[index].rowId, db)
        }
        // A merge's answer to a user who may not read the result carries nothing of it.
        let withheld = results[index].document?.isWithheld == true
        // A field-level merge kept fields of other writers that were newer than ours.
        if let stored = results[index].document, !withheld, stored.fields != pushes[index].op.fields {
            if clean {
                try overwrite(
                    model, rowId: pushes[index].rowId, with: stored, collection: pushes[index].op.collection, db)
            } else if try settle(
                model, rowId: pushes[index].rowId, remote: stored, collection: pushes[index].op.collection, db)
                != .recorded
            {
                answer.conflicts += 1
            }
        }
        // Matched against what the server stored, as its view did: the merged document, or the
        // fields sent (the row's values read back from SQLite may differ in type).
        if clean, let scope = answer.scope,
            withheld || !scope.matches(results[index].document?.fields ?? pushes[index].op.fields ?? [:])
        {
            answer.outsideScope.append((model, pushes[index].rowId))
        }
    }

    /// Batch entries left when no batch is on its way (at the start of a push; the listener's
    /// apply does the same after reading ``SyncLedger/applyState(of:_:)``, the barrier keeping it
    /// apart from pushes) are those whose answer never came (a dropped connection, a crash):
    /// they become row entries.
    func keepUnansweredSendingPerRow(_ db: Database) throws {
        if try ledger.anySending(db) { try ledger.keepSendingPerRow(tables, keys: nil, db) }
    }

    /// A batch was answered with something other than an acknowledgement, or not at all: its
    /// creates recorded in batch entries get entries of their own, which the conflict, refusal
    /// and failure paths work with (and a resend keeps their keys).
    func answeredOtherwise(_ batch: [PreparedPush], _ db: Database) throws {
        let entries = Array(Set(batch.compactMap(\.sendingEntry)))
        guard !entries.isEmpty else { return }
        try ledger.keepSendingPerRow(tables, keys: entries, db)
    }

    /// Settles a `conflict` answer for one op with the conflict policy. The other ops of the
    /// batch were not applied; they go out again, with the same keys, in the next batch.
    ///
    /// - Returns: Whether a policy settled a conflict (false when it was recorded for the app,
    ///   or when the answer only completed a delete).
    @discardableResult
    func resolvePushConflict(_ push: PreparedPush, server: Document, _ db: Database) throws -> Bool {
        let settled = try settlePushConflict(push, server: server, db)
        // A row out of scope that took the server's side has nothing left to push.
        try removeRowsOutOfScope(db)
        return settled
    }

    private func settlePushConflict(_ push: PreparedPush, server: Document, _ db: Database) throws -> Bool {
        receiveTimes(of: server)
        guard let model = byName[push.table] else { return false }
        let collection = push.op.collection
        let exists =
            try Bool.fetchOne(
                db.cachedStatement(sql: "SELECT EXISTS (SELECT 1 FROM \(model.quotedName) WHERE id = ?)"),
                arguments: [push.rowId]) ?? false
        if server.deleted {
            // A remote delete wins over local edits (and completes a local delete).
            if exists {
                try ledger.removeRow(model, id: push.rowId, db)
            } else {
                try ledger.forget(model.name, push.rowId, db)
            }
            try ledger.rememberGone(collection, server.id, version: server.version, db)
            return false
        }
        switch push.op.kind {
        case .delete:
            // A local delete wins over a remote edit: delete again, at the server's version.
            try ledger.rebase(model, push.rowId, on: server, db)
            return false
        case .create:
            let message = "the server refused the create: a document \(server.id) exists"
            try ledger.fail(
                model.name, push.rowId,
                TandemError(.server, message, serverError: WireError(.conflict, message)), db)
            return false
        case .update:
            guard exists else {
                try ledger.rebase(model, push.rowId, on: server, db)
                return false
            }
            return try settle(model, rowId: push.rowId, remote: server, collection: collection, db) != .recorded
        }
    }

    /// `not-found` for an op: the document is gone from the server. For an update that is a
    /// remote delete; for a delete, the work is done.
    func recordNotFound(_ push: PreparedPush, _ db: Database) throws {
        guard let model = byName[push.table] else { return }
        if push.op.kind == .update,
            try Bool.fetchOne(
                db, sql: "SELECT EXISTS (SELECT 1 FROM \(model.quotedName) WHERE id = ?)", arguments: [push.rowId])
                ?? false
        {
            try ledger.removeRow(model, id: push.rowId, db)
        } else {
            try ledger.forget(model.name, push.rowId, db)
        }
    }
}

extension Document {
    /// A document withheld from a user the read rules keep from it: its id, version and
    /// whether it is deleted, no fields, times 0 (no stored document was created at time 0).
    var isWithheld: Bool { createTime == 0 && updateTime == 0 }
}

/// What writing one acknowledgement back found, row by row.
private struct Acknowledgement {
    /// The batch's ops, and the server's results in their order (fewer when the answer fell short).
    let pushes: [PreparedPush]
    let results: [WriteResult]
    /// Rows wait for a server id (``SyncLedger/anythingWaits(_:)``).
    let waiting: Bool
    /// The scope of the table whose rows are being settled, if it has one.
    var scope: Query?
    var duplicates: [String] = []
    var conflicts = 0
    var outsideScope: [(TableModel, Int64)] = []
    /// The latest update time the answer carries, for the device's clock.
    var latest: Int64 = 0

    init(_ pushes: [PreparedPush], _ results: [WriteResult], waiting: Bool) {
        self.pushes = pushes
        self.results = results
        self.waiting = waiting
    }

    mutating func received(_ result: WriteResult) { latest = max(latest, result.updateTime) }
}
