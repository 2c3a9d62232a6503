import Foundation
import GRDB
import TandemWire

/// What syncing does to the app's database: which rows go out, what the server's answers
/// change, how documents become rows, how conflicts settle. It decides; the sync state it
/// changes is kept by its ``SyncLedger``, and nowhere else.
///
/// Every method runs inside a transaction its caller opened (one per push answer, one per
/// snapshot), so that a change and its bookkeeping commit together.
struct Reconciler: Sendable {
    /// In push order: parents before children.
    let tables: [TableModel]
    let byName: [String: TableModel]
    /// Stamps Tandem's own writes and takes in the times of remote ones.
    let clock: HybridLogicalClock
    /// Whether a listener's document carrying the key of one of this device's unanswered
    /// creates is taken as that row's document (see `adoptOwnCreate`). Off only with
    /// `Serialization.unserialized`, which shows what happens without Tandem's guards.
    let recognizesOwnCreates: Bool
    /// Every read and write of sync state goes through it.
    let ledger = SyncLedger()

    init(tables: [TableModel], clock: HybridLogicalClock, recognizesOwnCreates: Bool = true) {
        self.tables = tables
        self.byName = Dictionary(uniqueKeysWithValues: tables.map { ($0.name, $0) })
        self.clock = clock
        self.recognizesOwnCreates = recognizesOwnCreates
    }

    // MARK: - Where rows go

    /// The collection a row of `model` belongs to, given its parent's local id; nil while the
    /// parent (or an ancestor) has no server id or is not shared.
    func collection(of model: TableModel, parentRowId: Int64?, _ db: Database, memo: inout [String: CollectionPath?])
        throws
        -> CollectionPath?
    {
        if let root = model.rootCollection { return root }
        guard let parentName = model.parentTable, let parent = byName[parentName], let parentRowId else { return nil }
        let key = "\(parentName)#\(parentRowId)"
        if let known = memo[key] { return known }
        var result: CollectionPath?
        let columns = "serverId, isShared, " + (parent.foreignKey.map { SQL.quote($0) } ?? "NULL")
        if let row = try Row.fetchOne(
            db.cachedStatement(sql: "SELECT \(columns) FROM \(parent.quotedName) WHERE id = ?"),
            arguments: [parentRowId]),
            let serverId: String = row[0], parent.parentTable != nil || row[1] == true,
            let parentCollection = try collection(of: parent, parentRowId: row[2], db, memo: &memo),
            case .nested(_, _, let name) = model.definition.location
        {
            result = try? CollectionPath("\(parentCollection.rawValue)/\(serverId)/\(name)")
        }
        memo[key] = result
        return result
    }

    /// A SQL condition true for rows of `model` (as `alias`) that sync: shared root rows, and
    /// nested rows whose parent has a server id and syncs.
    ///
    /// With `waitingForParents`, nested rows whose parent will sync but has no server id yet
    /// count too: they are pending, not local-only.
    func syncsCondition(_ model: TableModel, alias: String, waitingForParents: Bool = false) -> String {
        guard let parentName = model.parentTable, let parent = byName[parentName], let foreignKey = model.foreignKey
        else {
            return "\(alias).isShared = 1"
        }
        let parentAlias = alias + "p"
        let hasServerId = waitingForParents ? "" : "AND \(parentAlias).serverId IS NOT NULL "
        return """
            EXISTS (SELECT 1 FROM \(parent.quotedName) AS \(parentAlias) WHERE \(parentAlias).id = \(alias).\(SQL.quote(foreignKey)) \
            \(hasServerId)AND \(syncsCondition(parent, alias: parentAlias, waitingForParents: waitingForParents)))
            """
    }

    /// The collections that should be listened to now, with the table and parent row each
    /// one fills.
    ///
    /// - Parameters:
    ///   - user: The user the server named, for scopes on the current user.
    ///   - problems: Told why a scoped table cannot be listened to (then it is not).
    func desiredListeners(_ db: Database, user: String?, problems: (TandemError) -> Void = { _ in }) throws
        -> [CollectionPath: ListenerTarget]
    {
        var result: [CollectionPath: ListenerTarget] = [:]
        var memo: [String: CollectionPath?] = [:]
        for model in tables {
            if let root = model.rootCollection {
                do {
                    let query = try model.definition.scopeQuery(user: user)
                    result[root] = ListenerTarget(table: model.name, parentRowId: nil, query: query)
                } catch let error as TandemError {
                    problems(error)
                }
                continue
            }
            guard let parentName = model.parentTable, let parent = byName[parentName] else { continue }
            let fk = parent.foreignKey.map { ", \(SQL.quote($0))" } ?? ", NULL"
            let rows = try Row.fetchAll(
                db,
                sql: """
                    SELECT t.id\(fk) FROM \(parent.quotedName) AS t
                    WHERE t.serverId IS NOT NULL AND \(syncsCondition(parent, alias: "t"))
                    """)
            for row in rows {
                let parentRowId: Int64 = row[0]
                if let path = try collection(of: model, parentRowId: parentRowId, db, memo: &memo) {
                    result[path] = ListenerTarget(table: model.name, parentRowId: parentRowId)
                }
            }
        }
        return result
    }

    /// The scope of each scoped table, as its listener asks for it (a table whose scope cannot
    /// be listened to has none here either).
    ///
    /// - Parameter user: The user the server named, for scopes on the current user.
    func scopes(user: String?) -> [String: Query] {
        var result: [String: Query] = [:]
        for model in tables where model.rootCollection != nil {
            if let query = try? model.definition.scopeQuery(user: user) { result[model.name] = query }
        }
        return result
    }

    /// The server ids of a table's rows, in the order of a query without `orderBy`: what a
    /// scoped listener's view holds, sent when it resumes. Rows out of scope are not in it: if
    /// their document is back in the scope, it comes as added and closes their conflict.
    func viewIDs(of table: String, _ db: Database) throws -> [DocumentID] {
        guard let model = byName[table] else { return [] }
        return try String.fetchAll(
            db,
            sql: """
                SELECT t.serverId FROM \(model.quotedName) t WHERE t.serverId IS NOT NULL AND NOT EXISTS (
                    SELECT 1 FROM tandem_row m WHERE m.tableName = ? AND m.rowId = t.id AND m.outOfScope = 1)
                """, arguments: [model.name]
        ).compactMap { try? DocumentID($0) }.sorted()
    }

    // MARK: - Mapping

    /// The local id of the row of `table` with this server id (through the unique index).
    func localId(_ table: TableModel, serverId: String, _ db: Database) throws -> Int64? {
        try Int64.fetchOne(
            db.cachedStatement(sql: "SELECT id FROM \(table.quotedName) WHERE serverId = ?"), arguments: [serverId])
    }

    /// The server id of the row of `table` with this local id.
    func serverId(_ table: String, localId: Int64, _ db: Database) throws -> String? {
        guard let model = byName[table] else { return nil }
        return try String.fetchOne(
            db.cachedStatement(sql: "SELECT serverId FROM \(model.quotedName) WHERE id = ?"), arguments: [localId])
    }

    // MARK: - Counts

    /// The status's counts: rows waiting to be pushed (dirty shared rows and filed deletes;
    /// failed ones and ones in conflict excluded), failed rows, open conflicts. Rows that do
    /// not sync (not shared) are local-only, not pending.
    func counts(_ db: Database) throws -> (pending: Int, failed: Int, conflicts: Int) {
        try ledger.counts(tables.map { ($0, syncsCondition($0, alias: "t", waitingForParents: true)) }, db)
    }

    // MARK: - Clock

    /// The latest time this database has seen: the stored clock, and every stamped time.
    func latestTime(_ db: Database) throws -> Int64 { try ledger.latestTime(tables, db) }

    /// Takes in the times a server document carries.
    func receiveTimes(of document: Document) {
        clock.receive(HybridLogicalClock.timestamp(milliseconds: document.updateTime))
        if let updatedAt = document.fields["updatedAt"]?.intValue { clock.receive(updatedAt) }
        for time in (document.fieldTimes ?? [:]).values { clock.receive(time) }
    }
}

/// What a listener's changes fill: a table, and for nested tables the parent row.
struct ListenerTarget: Hashable, Sendable {
    var table: String
    var parentRowId: Int64?
    /// A scoped root table's query (``SyncTable/where(_:arrayContains:)``).
    var query: Query?
}

extension Reconciler {
    /// Every synced row with a server id, as the document a push would send.
    func localDocuments(_ db: Database) throws -> [CollectionPath: [DocumentID: JSONObject]] {
        var result: [CollectionPath: [DocumentID: JSONObject]] = [:]
        var memo: [String: CollectionPath?] = [:]
        for model in tables {
            let foreignKey = model.foreignKey.map { "t.\(SQL.quote($0))" } ?? "NULL"
            let columns =
                (["t.serverId", "t.updatedAt", foreignKey, "t.id"] + model.fieldColumns.map { "t.\(SQL.quote($0))" })
                .joined(separator: ", ")
            let rows = try Row.fetchAll(
                db,
                sql: """
                    SELECT \(columns) FROM \(model.quotedName) AS t
                    WHERE t.serverId IS NOT NULL AND \(syncsCondition(model, alias: "t"))
                    """)
            for row in rows {
                guard let id = try? DocumentID(row[0] as String),
                    let collection = try collection(of: model, parentRowId: row[2], db, memo: &memo)
                else { continue }
                var fields: JSONObject = ["updatedAt": .int(row[1])]
                try addOutgoingFields(model, of: RowFields(row, from: 4, rowId: row[3]), to: &fields, db)
                result[collection, default: [:]][id] = fields
            }
        }
        return result
    }

    func unsyncedRowCount(_ db: Database) throws -> Int {
        var count = 0
        for model in tables {
            count +=
                try Int.fetchOne(
                    db,
                    sql:
                        "SELECT COUNT(*) FROM \(model.quotedName) AS t WHERE t.serverId IS NULL AND \(syncsCondition(model, alias: "t"))"
                )
                ?? 0
        }
        return count
    }
}

/// The field columns of a row read for the server: `row`'s columns from `offset` on, in
/// ``TableModel/fieldColumns``' order, and the id of the row they were read from.
struct RowFields {
    let row: Row
    let offset: Int
    let rowId: Int64

    init(_ row: Row, from offset: Int, rowId: Int64) {
        self.row = row
        self.offset = offset
        self.rowId = rowId
    }

    subscript(column: Int) -> DatabaseValue { row[offset + column] }
}

extension Reconciler {
    /// Adds the row's field columns to `fields` as they go to the server: values as JSON,
    /// references as what ``outgoingReferenceValue(_:_:in:_:)`` says.
    ///
    /// - Parameter unsyncedTarget: Called for each reference whose target row has no server
    ///   id yet, with the column and the target's local id.
    func addOutgoingFields(
        _ model: TableModel, of row: RowFields, to fields: inout JSONObject, _ db: Database,
        unsyncedTarget: (_ column: String, _ targetLocalId: Int64) throws -> Void = { _, _ in }
    ) throws {
        for pushed in model.pushedKeys {
            guard let column = pushed.column else { continue }
            guard pushed.target != nil else {
                fields[pushed.key] = FieldCoding.json(row[column], isJSON: pushed.isJSON)
                continue
            }
            let (reference, targetLocalId) = try outgoingReferenceValue(model, pushed, in: row, db)
            fields[pushed.key] = reference
            if reference == .null, let targetLocalId { try unsyncedTarget(pushed.key, targetLocalId) }
        }
    }

    /// The row's document as it goes to the server, as canonical JSON (the bytes
    /// `Wire.encodeCanonical` writes for the dictionary ``addOutgoingFields(_:of:to:_:unsyncedTarget:)``
    /// fills, with `updatedAt`): written straight from the row in key order
    /// (``TableModel/pushedKeys``), with no dictionary between. The server then finds the
    /// members sorted and copies them as they are.
    func outgoingFieldsJSON(
        _ model: TableModel, of row: RowFields, updatedAt: Int64, _ db: Database,
        unsyncedTarget: (_ column: String, _ targetLocalId: Int64) throws -> Void
    ) throws -> [UInt8] {
        var writer = JSONWriter(sortsKeys: true, capacity: 64 + 32 * model.pushedKeys.count)
        writer.beginObject()
        for pushed in model.pushedKeys {
            writer.key(encoded: pushed.encoded)
            guard let column = pushed.column else {
                writer.int(updatedAt)
                continue
            }
            guard pushed.target != nil else {
                writer.value(FieldCoding.json(row[column], isJSON: pushed.isJSON))
                continue
            }
            let (reference, targetLocalId) = try outgoingReferenceValue(model, pushed, in: row, db)
            writer.value(reference)
            if reference == .null, let targetLocalId { try unsyncedTarget(pushed.key, targetLocalId) }
        }
        writer.endObject()
        return writer.bytes
    }

    /// What a reference column says on the wire: the target's server id; or, when the column
    /// is null because the target has not arrived here, the server id it waits for (the
    /// reference is kept, not lost); or null. `targetLocalId` is set when the column holds a
    /// local id. `reference` is one of the model's reference columns.
    func outgoingReferenceValue(
        _ model: TableModel, _ reference: TableModel.PushedKey, in row: RowFields, _ db: Database
    ) throws -> (value: JSONValue, targetLocalId: Int64?) {
        guard let column = reference.column, let target = reference.target else {
            preconditionFailure("\(reference.key) is not a reference column")
        }
        if let targetId = Int64.fromDatabaseValue(row[column]) {
            return (try serverId(target, localId: targetId, db).map(JSONValue.string) ?? .null, targetId)
        }
        let waiting = try ledger.waitingReference(model, rowId: row.rowId, column: reference.key, db)
        return (waiting.map(JSONValue.string) ?? .null, nil)
    }
}
