import GRDB
import TandemWire

/// A write op with its fields already encoded (canonically) and size-checked.
struct PreparedOp {
    var op: WriteOp
    /// The canonical JSON of the fields; `{}` for a delete.
    var fieldsJSON: String
}

/// What became of a write message.
enum WriteOutcome {
    /// Every op applied (or was a resend of an applied op); one result per op.
    case applied([WriteResult], [CommittedChange])
    /// The op at this index failed its precondition; nothing was applied.
    case conflict(op: Int, server: Document)
}

/// A document write, as fan-out sends it to the collection's listeners.
struct CommittedChange {
    var collection: CollectionPath
    var change: Change
    var sequence: Int64
    /// About how many bytes the change takes in a snapshot frame.
    var size: Int
}

extension DocumentStore {
    /// Checks one op before it is applied, inside the write's transaction: the op's index, the
    /// op, the stored document (nil for a new one). Throws to refuse the whole write.
    typealias Authorization = (Int, WriteOp, StoredDocument?, Database) throws -> Void

    /// Applies the ops of one write message in one transaction.
    ///
    /// An op whose `(clientId, idempotencyKey)` was applied before is not applied again: its
    /// first result stands in its place. A failed precondition rolls back the whole message.
    ///
    /// - Parameter now: The server clock, in milliseconds since 1970.
    /// - Throws: ``WireError`` `.notFound` (with the op's index) for an update or delete of a
    ///   document that never existed; GRDB's `DatabaseError` when SQLite fails.
    func apply(
        _ ops: [PreparedOp], clientId: ClientName, now: Int64, maxDocumentBytes: Int, authorize: Authorization? = nil
    ) throws -> WriteOutcome {
        do {
            return try database.write { db in
                var results: [WriteResult] = []
                var changes: [CommittedChange] = []
                var sequences = SequenceCounter()
                results.reserveCapacity(ops.count)
                for (index, prepared) in ops.enumerated() {
                    let op = prepared.op
                    if let earlier = try Self.recordedResult(db, clientId, op.idempotencyKey) {
                        results.append(earlier)
                        continue
                    }
                    var (id, existing) = try Self.target(db, op, index: index, now: now)
                    try authorize?(index, op, existing, db)
                    let sequence = try sequences.next(op.collection, db)
                    let version = (existing?.version ?? 0) + 1
                    // Monotonic per document even if the server's clock steps back.
                    let updateTime = max(now, existing?.updateTime ?? 0)
                    let isCreate = op.kind == .create
                    let createTime = isCreate ? updateTime : existing!.createTime
                    let createSequence = isCreate ? sequence : existing!.createSequence
                    let createKey = isCreate ? op.idempotencyKey.rawValue : existing!.createKey
                    let createClient = isCreate ? clientId.rawValue : existing!.createClient
                    let deleted = op.kind == .delete

                    var fields = deleted ? [:] : op.fields ?? [:]
                    var fieldsJSON = prepared.fieldsJSON
                    var fieldTimes = op.fieldTimes
                    if let incomingTimes = op.fieldTimes, op.kind == .update, let existing {
                        // Field-level merge with what is stored: each field keeps its later write.
                        let merged = FieldMerge.merge(
                            stored: (try existing.document.fields, existing.fieldTimes ?? [:]),
                            incoming: (fields, incomingTimes))
                        fields = merged.fields
                        fieldTimes = merged.times
                        fieldsJSON = String(decoding: Wire.encodeCanonical(fields), as: UTF8.self)
                        if fieldsJSON.utf8.count > maxDocumentBytes {
                            throw WireError(
                                .tooLarge,
                                "ops[\(index)]: merged with the stored document it is \(fieldsJSON.utf8.count) bytes; "
                                    + "the limit is \(maxDocumentBytes)", op: index)
                        }
                    }
                    if deleted { fieldTimes = existing?.fieldTimes }
                    let timesJSON = fieldTimes.map { String(decoding: Wire.encodeTimes($0), as: UTF8.self) }

                    let columns = """
                        INSERT INTO document
                            (collection, id, fields, version, createTime, updateTime, deleted, sequence, createSequence,
                            createKey, createClient, fieldTimes)
                        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                        """
                    if isCreate && op.id == nil {
                        // A fresh id: inserted without looking first. Should it ever collide
                        // (71 random bits within one millisecond), the unique index refuses it
                        // and another id is drawn.
                        while true {
                            do {
                                try db.cachedStatement(sql: columns).execute(arguments: [
                                    op.collection.rawValue, id.rawValue, fieldsJSON, version, createTime, updateTime,
                                    deleted, sequence, createSequence, createKey, createClient, timesJSON,
                                ])
                                break
                            } catch let error as DatabaseError where error.resultCode == .SQLITE_CONSTRAINT {
                                id = DocumentID.timeOrdered(milliseconds: now)
                            }
                        }
                    } else {
                        try db.cachedStatement(
                            sql: columns + """

                                ON CONFLICT (collection, id) DO UPDATE SET
                                    fields = excluded.fields, version = excluded.version,
                                    createTime = excluded.createTime, updateTime = excluded.updateTime,
                                    deleted = excluded.deleted, sequence = excluded.sequence,
                                    createSequence = excluded.createSequence, createKey = excluded.createKey,
                                    createClient = excluded.createClient, fieldTimes = excluded.fieldTimes
                                """
                        ).execute(arguments: [
                            op.collection.rawValue, id.rawValue, fieldsJSON, version, createTime, updateTime,
                            deleted, sequence, createSequence, createKey, createClient, timesJSON,
                        ])
                    }

                    let document = Document(
                        id: id, version: version, fields: fields, createTime: createTime, updateTime: updateTime,
                        deleted: deleted, createKey: createKey, fieldTimes: fieldTimes)
                    // A merge answers with the stored document: it may keep other writers' fields.
                    let result = WriteResult(
                        id: id, version: version, updateTime: updateTime,
                        document: op.fieldTimes != nil ? document : nil)
                    try db.cachedStatement(
                        sql: """
                            INSERT INTO idempotency (clientId, key, id, version, updateTime, recordedAt, document)
                            VALUES (?, ?, ?, ?, ?, ?, ?)
                            """
                    ).execute(arguments: [
                        clientId.rawValue, op.idempotencyKey.rawValue, id.rawValue, version, updateTime, now,
                        result.document.map { String(decoding: Wire.encode($0), as: UTF8.self) },
                    ])
                    results.append(result)
                    let kind: Change.Kind = isCreate ? .added : deleted ? .deleted : .modified
                    changes.append(
                        CommittedChange(
                            collection: op.collection, change: Change(kind, document), sequence: sequence,
                            size: fieldsJSON.utf8.count + 160))
                }
                try sequences.store(db)
                return .applied(results, changes)
            }
        } catch let conflict as PreconditionFailed {
            return .conflict(op: conflict.op, server: conflict.server)
        }
    }

    /// Thrown inside the transaction to roll it back; turned into ``WriteOutcome/conflict``.
    private struct PreconditionFailed: Error {
        var op: Int
        var server: Document
    }

    /// The id the op writes and the document there now, after checking the op's precondition.
    private static func target(_ db: Database, _ op: WriteOp, index: Int, now: Int64) throws -> (
        DocumentID, StoredDocument?
    ) {
        switch op.kind {
        case .create:
            guard let proposed = op.id else { return (DocumentID.timeOrdered(milliseconds: now), nil) }
            let existing = try fetchDocument(db, op.collection, proposed)
            if let existing, !existing.deleted {
                throw PreconditionFailed(op: index, server: try existing.document)
            }
            return (proposed, existing)
        case .update, .delete:
            let id = op.id!
            guard let existing = try fetchDocument(db, op.collection, id) else {
                throw WireError(
                    .notFound, "document '\(op.collection)/\(id)' does not exist; create it first", op: index)
            }
            if existing.deleted {
                throw PreconditionFailed(op: index, server: try existing.document)
            }
            if let base = op.baseVersion, base != existing.version {
                throw PreconditionFailed(op: index, server: try existing.document)
            }
            return (id, existing)
        }
    }

    private static func recordedResult(_ db: Database, _ clientId: ClientName, _ key: ClientName) throws -> WriteResult?
    {
        let statement = try db.cachedStatement(
            sql: "SELECT id, version, updateTime, document FROM idempotency WHERE clientId = ? AND key = ?")
        return try statement.firstRow(arguments: [clientId.rawValue, key.rawValue]) { row in
            let document = try (row[3] as String?).map { try Wire.decode(Document.self, from: Array($0.utf8)) }
            return WriteResult(id: try DocumentID(row[0]), version: row[1], updateTime: row[2], document: document)
        }
    }

    /// Hands out each collection's sequence numbers for one transaction: read once, counted
    /// here, stored once at the end (one statement per collection, not one per op).
    private struct SequenceCounter {
        private var last: [CollectionPath: Int64] = [:]

        /// The collection's next sequence number (1 for its first write).
        mutating func next(_ collection: CollectionPath, _ db: Database) throws -> Int64 {
            let current: Int64
            if let known = last[collection] {
                current = known
            } else {
                current =
                    try Int64.fetchOne(
                        db.cachedStatement(sql: "SELECT lastSequence FROM collection WHERE path = ?"),
                        arguments: [collection.rawValue]) ?? 0
            }
            last[collection] = current + 1
            return current + 1
        }

        func store(_ db: Database) throws {
            let statement = try db.cachedStatement(
                sql: """
                    INSERT INTO collection (path, lastSequence) VALUES (?, ?)
                    ON CONFLICT (path) DO UPDATE SET lastSequence = excluded.lastSequence
                    """)
            for (collection, sequence) in last {
                try statement.execute(arguments: [collection.rawValue, sequence])
            }
        }
    }
}
