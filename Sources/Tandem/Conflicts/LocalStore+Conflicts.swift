import Foundation
import GRDB
import TandemWire

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

extension LocalStore {
    /// Settles a conflict between a row with unpushed changes and a newer server version, with
    /// the table's policy. Both the listener and a push answered with `conflict` come here.
    func settle(
        _ model: TableModel, rowId: Int64, remote: Document, collection: CollectionPath, _ db: Database
    ) throws -> Settlement {
        guard let local = try rowState(model, rowId: rowId, db) else { return .tookServer }
        let base = try knownServerFields(model, rowId: rowId, db)
        let merge = ThreeWayMerge.merge(
            base: base, local: (local.fields, local.times), remote: (remote.fields, Self.fieldTimes(of: remote)))
        let resolution: ConflictResolution
        switch model.policy {
        case .lastWriteWins:
            resolution = local.updatedAt > Self.updatedAt(of: remote) ? .keepLocal : .useServer
        case .fieldLevel:
            return try apply(
                merge, model, rowId: rowId, local: local.fields, remote: remote, collection: collection, db)
        case .manual:
            guard merge.inConflict.isEmpty else {
                try recordConflict(
                    model, rowId: rowId, local: local.fields, remote: remote, base: base,
                    fields: merge.inConflict, collection: collection, db)
                return .recorded
            }
            // Changes to different fields are merged without asking.
            return try apply(
                merge, model, rowId: rowId, local: local.fields, remote: remote, collection: collection, db)
        case .custom(let resolve):
            resolution = resolve(
                ConflictContext(
                    table: model.name, rowId: rowId, local: local.fields, remote: remote, base: base,
                    changedLocally: merge.changedLocally, changedRemotely: merge.changedRemotely,
                    inConflict: merge.inConflict, localUpdatedAt: local.updatedAt,
                    remoteUpdatedAt: Self.updatedAt(of: remote)))
        }
        return try apply(
            resolution, model, rowId: rowId, local: local.fields, remote: remote, collection: collection, db)
    }

    /// Carries out a resolution decided by a policy, a resolver or the app.
    func apply(
        _ resolution: ConflictResolution, _ model: TableModel, rowId: Int64, local: JSONObject, remote: Document,
        collection: CollectionPath, _ db: Database
    ) throws -> Settlement {
        switch resolution {
        case .keepLocal:
            try rebase(model.name, rowId, on: remote, db)
            try markDirty(model, rowId: rowId, db)
            return .keptLocal
        case .useServer:
            try overwrite(model, rowId: rowId, with: remote, collection: collection, db)
            return .tookServer
        case .merge(let fields):
            var merged = local
            for (name, value) in fields { merged[name] = value }
            try writeMerged(model, rowId: rowId, fields: merged, times: nil, remote: remote, collection: collection, db)
            return .merged
        }
    }

    private func apply(
        _ merge: ThreeWayMerge, _ model: TableModel, rowId: Int64, local: JSONObject, remote: Document,
        collection: CollectionPath, _ db: Database
    ) throws -> Settlement {
        let merged = merge.fields.filter { $0.key != "updatedAt" }
        if merged == remote.fields.filter({ $0.key != "updatedAt" }) {
            try overwrite(model, rowId: rowId, with: remote, collection: collection, db)
            return .tookServer
        }
        if merged == local.filter({ $0.key != "updatedAt" }) {
            try rebase(model.name, rowId, on: remote, db)
            try storeFieldTimes(model, rowId: rowId, merge.times, db)
            return .keptLocal
        }
        try writeMerged(
            model, rowId: rowId, fields: merge.fields, times: merge.times, remote: remote, collection: collection, db)
        return .merged
    }

    /// Makes the row `fields` (a new local write: dirty, stamped now), with the server's
    /// version as the base of its next push.
    func writeMerged(
        _ model: TableModel, rowId: Int64, fields: JSONObject, times: [String: Int64]?, remote: Document,
        collection: CollectionPath, _ db: Database
    ) throws {
        let probe = Document(id: remote.id, version: remote.version, fields: fields, createTime: 0, updateTime: 0)
        let incoming = try incomingValues(model, probe, db)
        var assignments = incoming.columns.map { "\(SQL.quote($0)) = ?" }
        assignments += ["updatedAt = ?", "isDirty = 1", "localRevision = localRevision + 1"]
        var arguments = StatementArguments(incoming.values)
        arguments += [clock.now(), rowId]
        try db.cachedStatement(
            sql: "UPDATE \(model.quotedName) SET \(assignments.joined(separator: ", ")) WHERE id = ?"
        )
        .execute(arguments: arguments)
        try recordMissingReferences(model, rowId: rowId, incoming.missing, db)
        if let times { try storeFieldTimes(model, rowId: rowId, times, db) }
        try rebase(model.name, rowId, on: remote, db)
    }

    /// Makes the server's document the base of the row's next push (which stays pending).
    func rebase(_ table: String, _ rowId: Int64, on server: Document, _ db: Database) throws {
        try db.cachedStatement(
            sql: """
                UPDATE tandem_row SET serverVersion = ?, serverFields = ?, idempotencyKey = NULL, pushedRevision = NULL,
                    pendingOp = CASE WHEN pendingOp = 'delete' THEN 'delete' ELSE NULL END
                WHERE tableName = ? AND rowId = ?
                """
        ).execute(arguments: [server.version, Self.fieldsText(server.fields), table, rowId])
    }

    func markDirty(_ model: TableModel, rowId: Int64, _ db: Database) throws {
        try db.cachedStatement(
            sql:
                "UPDATE \(model.quotedName) SET isDirty = 1, localRevision = localRevision + 1 WHERE id = ? AND isDirty = 0"
        ).execute(arguments: [rowId])
    }

    // MARK: - Manual conflicts

    private func recordConflict(
        _ model: TableModel, rowId: Int64, local: JSONObject, remote: Document, base: JSONObject?, fields: Set<String>,
        collection: CollectionPath, _ db: Database
    ) throws {
        try db.cachedStatement(
            sql: """
                INSERT INTO tandem_conflict (tableName, rowId, serverId, collection, local, server, base, fields, detectedAt)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (tableName, rowId) DO UPDATE SET server = excluded.server, fields = excluded.fields,
                    local = excluded.local
                """
        ).execute(arguments: [
            model.name, rowId, remote.id.rawValue, collection.rawValue, Self.fieldsText(local),
            String(decoding: Wire.encode(remote), as: UTF8.self), base.map(Self.fieldsText),
            String(decoding: Wire.encode(fields.sorted()), as: UTF8.self),
            HybridLogicalClock.milliseconds(clock.now()),
        ])
    }

    func conflicts(_ db: Database) throws -> [ConflictRecord] {
        try Row.fetchAll(
            db,
            sql: """
                SELECT tableName, rowId, serverId, local, server, base, fields, detectedAt FROM tandem_conflict
                ORDER BY detectedAt, tableName, rowId
                """
        ).map { row in
            ConflictRecord(
                table: row[0], rowId: row[1], serverId: row[2],
                local: try Wire.decodeFields(Array((row[3] as String).utf8)),
                server: try Wire.decode(Document.self, from: Array((row[4] as String).utf8)),
                base: try (row[5] as String?).map { try Wire.decodeFields(Array($0.utf8)) },
                fields: try Wire.decodeStrings(Array((row[6] as String).utf8)), detectedAt: row[7])
        }
    }

    /// Resolves an open conflict as the app decided; the row syncs again.
    func resolve(_ record: ConflictRecord, with resolution: ConflictResolution, _ db: Database) throws {
        guard let model = byName[record.table],
            let row = try Row.fetchOne(
                db, sql: "SELECT server, collection FROM tandem_conflict WHERE tableName = ? AND rowId = ?",
                arguments: [record.table, record.rowId])
        else {
            throw TandemError(.invalidArgument, "there is no open conflict for \(record.table) row \(record.rowId)")
        }
        // The server's latest version, which may be newer than the one the app looked at.
        let server = try Wire.decode(Document.self, from: Array((row[0] as String).utf8))
        let collection = try CollectionPath(row[1] as String)
        try db.execute(
            sql: "DELETE FROM tandem_conflict WHERE tableName = ? AND rowId = ?",
            arguments: [record.table, record.rowId])
        let local = try rowState(model, rowId: record.rowId, db)?.fields ?? record.local
        _ = try apply(resolution, model, rowId: record.rowId, local: local, remote: server, collection: collection, db)
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
        try addOutgoingFields(model, of: row, from: 1, rowId: rowId, to: &fields, db)
        return (fields, try localFieldTimes(model, rowId: rowId, updatedAt: updatedAt, db), updatedAt)
    }

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

    /// The last server fields this device saw of the row.
    func knownServerFields(_ model: TableModel, rowId: Int64, _ db: Database) throws -> JSONObject? {
        guard
            let text = try String.fetchOne(
                db.cachedStatement(sql: "SELECT serverFields FROM tandem_row WHERE tableName = ? AND rowId = ?"),
                arguments: [model.name, rowId])
        else { return nil }
        return try Wire.decodeFields(Array(text.utf8))
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
