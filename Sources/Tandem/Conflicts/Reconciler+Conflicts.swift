import Foundation
import GRDB
import TandemSQLite
import TandemWire

/// A row in conflict with a server version: what a resolution is carried out on.
struct ConflictingRow {
    let model: TableModel
    let rowId: Int64
    /// The row's synced fields as they are here.
    let local: JSONObject
    let remote: Document
    let collection: CollectionPath
}

/// How a conflict ended.
enum Settlement: Equatable {
    /// The local row stays and will be pushed over the server's version.
    case keptLocal
    /// The server's version replaced the local changes.
    case tookServer
    /// The row became a merge of both and will be pushed.
    case merged
    /// Recorded for the app to resolve (manual policy); the row waits.
    case recorded
}

extension Reconciler {
    /// Settles a conflict between a row with unpushed changes and a newer server version, with
    /// the table's policy. Both the listener and a push answered with `conflict` come here.
    func settle(
        _ model: TableModel, rowId: Int64, remote: Document, collection: CollectionPath, _ db: Database
    ) throws -> Settlement {
        guard let local = try rowState(model, rowId: rowId, db) else { return .tookServer }
        let row = ConflictingRow(
            model: model, rowId: rowId, local: local.fields, remote: remote, collection: collection)
        let base = try ledger.knownServerFields(model, rowId: rowId, db)
        let merge = ThreeWayMerge.merge(
            base: base, local: (local.fields, local.times), remote: (remote.fields, Self.fieldTimes(of: remote)))
        let resolution: ConflictResolution
        switch model.policy {
        case .lastWriteWins:
            resolution = local.updatedAt > Self.updatedAt(of: remote) ? .keepLocal : .useServer
        case .fieldLevel:
            return try apply(merge, to: row, db)
        case .manual:
            guard merge.inConflict.isEmpty else {
                try ledger.recordConflict(
                    .init(
                        rowId: rowId, server: remote, collection: collection, local: local.fields, base: base,
                        fields: merge.inConflict, detectedAt: HybridLogicalClock.milliseconds(clock.now())),
                    of: model, db)
                return .recorded
            }
            // Changes to different fields are merged without asking.
            return try apply(merge, to: row, db)
        case .custom(let resolve):
            resolution = resolve(
                ConflictContext(
                    table: model.name, rowId: rowId, local: local.fields, remote: remote, base: base,
                    changedLocally: merge.changedLocally, changedRemotely: merge.changedRemotely,
                    inConflict: merge.inConflict, localUpdatedAt: local.updatedAt,
                    remoteUpdatedAt: Self.updatedAt(of: remote)))
        }
        return try apply(resolution, to: row, db)
    }

    /// Carries out a resolution decided by a policy, a resolver or the app.
    func apply(_ resolution: ConflictResolution, to row: ConflictingRow, _ db: Database) throws -> Settlement {
        let (model, rowId, remote, collection) = (row.model, row.rowId, row.remote, row.collection)
        switch resolution {
        case .keepLocal:
            try ledger.rebase(model, rowId, on: remote, db)
            try ledger.markDirty(model, rowId: rowId, db)
            return .keptLocal
        case .useServer:
            try overwrite(model, rowId: rowId, with: remote, collection: collection, db)
            return .tookServer
        case .merge(let fields):
            var merged = row.local
            for (name, value) in fields { merged[name] = value }
            try writeMerged(merged, times: nil, over: row, db)
            return .merged
        }
    }

    private func apply(_ merge: ThreeWayMerge, to row: ConflictingRow, _ db: Database) throws -> Settlement {
        let (model, rowId, local, remote) = (row.model, row.rowId, row.local, row.remote)
        let merged = merge.fields.filter { $0.key != "updatedAt" }
        if merged == remote.fields.filter({ $0.key != "updatedAt" }) {
            try overwrite(model, rowId: rowId, with: remote, collection: row.collection, db)
            return .tookServer
        }
        if merged == local.filter({ $0.key != "updatedAt" }) {
            try ledger.rebase(model, rowId, on: remote, db)
            try ledger.storeFieldTimes(model, rowId: rowId, merge.times, db)
            return .keptLocal
        }
        try writeMerged(merge.fields, times: merge.times, over: row, db)
        return .merged
    }

    /// Makes the row `fields` (a new local write: dirty, stamped now), with the server's
    /// version as the base of its next push.
    func writeMerged(
        _ fields: JSONObject, times: [String: Int64]?, over row: ConflictingRow, rebase: Bool = true, _ db: Database
    ) throws {
        let (model, rowId, remote) = (row.model, row.rowId, row.remote)
        let probe = Document(id: remote.id, version: remote.version, fields: fields, createTime: 0, updateTime: 0)
        let incoming = try incomingValues(model, probe, db)
        var assignments = incoming.columns.map { "\(SQL.quote($0)) = ?" }
        assignments += ["updatedAt = ?", "isDirty = 1", "localRevision = localRevision + 1"]
        try db.cachedStatement(
            sql: "UPDATE \(model.quotedName) SET \(assignments.joined(separator: ", ")) WHERE id = ?"
        ).execute { values in
            for value in incoming.values { values.bind(value) }
            values.bind(clock.now())
            values.bind(rowId)
        }
        try recordMissingReferences(model, rowId: rowId, incoming.missing, db)
        if let times { try ledger.storeFieldTimes(model, rowId: rowId, times, db) }
        if rebase { try ledger.rebase(model, rowId, on: remote, db) }
    }

    // MARK: - Manual conflicts

    /// Resolves an open conflict as the app decided; the row syncs again.
    func resolve(_ record: ConflictRecord, with resolution: ConflictResolution, _ db: Database) throws {
        guard let model = byName[record.table],
            let (server, collection, reason) = try ledger.takeConflict(record.table, rowId: record.rowId, db)
        else {
            throw TandemError(.invalidArgument, "there is no open conflict for \(record.table) row \(record.rowId)")
        }
        let local = try rowState(model, rowId: record.rowId, db)?.fields ?? record.local
        let row = ConflictingRow(
            model: model, rowId: record.rowId, local: local, remote: server, collection: collection)
        guard reason == .leftScope else {
            _ = try apply(resolution, to: row, db)
            // A row out of scope whose conflict over its fields this settles may go now.
            try removeRowsOutOfScope(db)
            return
        }
        // Out of scope: the server's side is not a version to write on (it may be withheld).
        switch resolution {
        case .useServer:
            try removeQuietly(model, rowId: record.rowId, discardingChanges: true, db)
        case .keepLocal:
            break  // pushed as it is
        case .merge(let fields):
            var merged = local
            for (name, value) in fields { merged[name] = value }
            try writeMerged(merged, times: nil, over: row, rebase: false, db)
        }
        try removeRowsOutOfScope(db)
    }

    // MARK: - Row state

    /// The row as a document would carry it, when it was last written, and when each field was.
    func rowState(_ model: TableModel, rowId: Int64, _ db: Database) throws
        -> (fields: JSONObject, times: [String: Int64], updatedAt: Int64)?
    {
        let columns = (["updatedAt"] + model.fieldColumns.map(SQL.quote)).joined(separator: ", ")
        guard
            let row = try Row.fetchOne(
                db.cachedStatement(sql: "SELECT \(columns) FROM \(model.quotedName) WHERE id = ?"), arguments: [rowId])
        else { return nil }
        let updatedAt: Int64 = row[0]
        var fields: JSONObject = ["updatedAt": .int(updatedAt)]
        try addOutgoingFields(model, of: RowFields(row, from: 1, rowId: rowId), to: &fields, db)
        return (fields, try ledger.localFieldTimes(model, rowId: rowId, updatedAt: updatedAt, db), updatedAt)
    }

    /// The time of each field of a server document: its field times, else its `updatedAt`.
    static func fieldTimes(of document: Document) -> [String: Int64] {
        let updatedAt = updatedAt(of: document)
        var times = Dictionary(uniqueKeysWithValues: document.fields.keys.map { ($0, updatedAt) })
        for (field, time) in document.fieldTimes ?? [:] { times[field] = time }
        times["updatedAt"] = updatedAt
        return times
    }
}
