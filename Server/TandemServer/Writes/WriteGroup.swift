import TandemWire

/// One `write` message, checked and ready to apply.
struct WriteRequest {
    var ops: [WriteOp]
    /// The canonical JSON of each op's fields (`{}` for a delete), already size-checked.
    var fieldsJSON: [String]
    var client: ClientName
    /// Who sent it: the user of its token (nil for anonymous clients), and the token's claims.
    var identity: Identity

    /// The user as idempotency records store it.
    var userKey: String { identity.user ?? "" }
}

/// What became of a write message.
enum WriteOutcome {
    /// Every op applied (or was a resend of an op applied before); one result per op, and the
    /// feed sequence at which the op's document holds the state its result tells (nil for a
    /// resend answered from memory, and for a result its user may not read).
    case applied([WriteResult], sequences: [Int64?])
    /// The op at this index failed its precondition, or is a resend of an op whose document
    /// is gone since; nothing of the message was applied.
    case conflict(op: Int, server: Document)
    /// Refused (`permission-denied`, `not-found`, `too-large` after a merge); nothing applied.
    case refused(WireError)
}

/// Applies the write messages of one group commit inside one store transaction: what a write
/// means, decided in one place for every store.
///
/// Each message is all or nothing: its ops are worked out in memory, each seeing the ops
/// before it (of its own message and of the messages before it in the group), and only a
/// message whose every op passed joins what ``save()`` stores at the end. So a refused message
/// leaves no trace, and the group commits once, with one sync.
///
/// For each op, in this order:
///
/// 1. **A resend** of an op this user's client applied before (same idempotency key) gets its
///    first result, and nothing else happens; unless its document is gone since and the rules
///    would let the user make the op now: then a `conflict` with its tombstone
///    (``goneSince(_:of:index:_:_:)``). Keys belong to the user who sent them: another user's op
///    under the same client id and key is another op.
/// 2. **Access**: the rules decide before anything about the document is revealed. The stored
///    document is read because a rule may use `resource`, but a refusal is the same
///    `permission-denied` whether the document exists or not.
/// 3. **Preconditions**: `not-found` for an update or delete of a document that never existed,
///    `conflict` for a stale `baseVersion`, a tombstone, or a proposed id that is taken. A
///    conflict shows the stored document only to a user who may read the collection.
/// 4. The new document: version + 1, a field-level merge for ops with `fieldTimes`, and the
///    collection's next sequence number.
final class WriteGroup {
    private let transaction: any StoreTransaction
    private let access: AccessControl?
    private let now: Int64
    private let maxDocumentBytes: Int

    /// Documents as the group has them: read from the store, or written by accepted messages.
    private var documents: [DocumentKey: StoredDocument] = [:]
    /// Keys known not to exist in the store.
    private var absent: Set<DocumentKey> = []
    /// Keys written by accepted messages, in the order first written.
    private var writtenOrder: [DocumentKey] = []
    private var written: Set<DocumentKey> = []
    /// Documents created under an id the server picked: no op of the group can name them (no
    /// client knows the id before the answer), so they stay out of the tables above, which
    /// cost a document six hashes of its key.
    private var created: [StoredDocument] = []
    private var sequences: [CollectionPath: Int64] = [:]
    private var recorded: [RecordKey: WriteResult] = [:]
    private var records: [IdempotencyRecord] = []

    private struct RecordKey: Hashable {
        var user: String
        var client: String
        var key: String
    }

    /// What one message has done so far; joins the group only if all its ops pass.
    private struct Draft {
        var documents: [DocumentKey: StoredDocument] = [:]
        var writtenOrder: [DocumentKey] = []
        var created: [StoredDocument] = []
        var sequences: [CollectionPath: Int64] = [:]
        var records: [IdempotencyRecord] = []
        var results: [WriteResult] = []
        var resultSequences: [Int64?] = []

        /// Room for every op's result, document and record up front.
        init(reservingFor ops: [WriteOp]) {
            results.reserveCapacity(ops.count)
            resultSequences.reserveCapacity(ops.count)
            let named = ops.count { $0.id != nil }
            documents.reserveCapacity(named)
            created.reserveCapacity(ops.count - named)
            writtenOrder.reserveCapacity(ops.count)
            records.reserveCapacity(ops.count)
        }
    }

    /// Reads, in a few batched reads, what the group's messages will look at: their target
    /// documents and their remembered idempotency keys.
    init(
        _ transaction: any StoreTransaction, requests: [WriteRequest], access: AccessControl?, now: Int64,
        maxDocumentBytes: Int
    ) throws {
        self.transaction = transaction
        self.access = access
        self.now = now
        self.maxDocumentBytes = maxDocumentBytes
        let targets = requests.flatMap { request in
            request.ops.compactMap { op in op.id.map { DocumentKey(collection: op.collection, id: $0) } }
        }
        documents = try transaction.documents(targets)
        absent = Set(targets).subtracting(documents.keys)
        // Room for every op's document and record up front: grown one op at a time, the tables
        // were copied over and over (1 % of the throughput run's CPU). Only the ops that name
        // a document put it in the tables.
        let opCount = requests.reduce(0) { $0 + $1.ops.count }
        documents.reserveCapacity(targets.count)
        written.reserveCapacity(targets.count)
        writtenOrder.reserveCapacity(targets.count)
        created.reserveCapacity(opCount)
        records.reserveCapacity(opCount)
        recorded.reserveCapacity(opCount)
        var byClient: [RecordKey: [String]] = [:]
        for request in requests {
            let owner = RecordKey(user: request.userKey, client: request.client.rawValue, key: "")
            byClient[owner, default: []].append(contentsOf: request.ops.map(\.idempotencyKey.rawValue))
        }
        for (owner, keys) in byClient {
            for (key, result) in try transaction.recordedResults(user: owner.user, client: owner.client, keys: keys) {
                recorded[RecordKey(user: owner.user, client: owner.client, key: key)] = result
            }
        }
    }

    /// Works out one message. On anything but `.applied`, nothing of it is kept.
    ///
    /// - Throws: Only the store's errors (the whole group then fails).
    func apply(_ request: WriteRequest) throws -> WriteOutcome {
        var draft = Draft(reservingFor: request.ops)
        for (index, op) in request.ops.enumerated() {
            if let stop = try apply(op, index: index, of: request, to: &draft) { return stop }
        }
        accept(draft)
        return .applied(draft.results, sequences: draft.resultSequences)
    }

    /// Works out one op into the message's draft; returns the message's outcome when the op
    /// ends it (a conflict, a refusal).
    private func apply(_ op: WriteOp, index: Int, of request: WriteRequest, to draft: inout Draft) throws
        -> WriteOutcome?
    {
        let recordKey = RecordKey(
            user: request.userKey, client: request.client.rawValue, key: op.idempotencyKey.rawValue)
        if let earlier = recorded[recordKey] {
            if op.kind != .delete, let gone = try goneSince(earlier, of: op, index: index, request.identity, draft) {
                return .conflict(op: index, server: gone)
            }
            draft.results.append(earlier)
            draft.resultSequences.append(nil)
            return nil
        }
        let key = op.id.map { DocumentKey(collection: op.collection, id: $0) }
        let existing = try key.flatMap { try stored($0, draft) }
        if let refusal = try refusal(of: op, index: index, existing: existing, request.identity, draft) {
            return .refused(refusal)
        }
        switch try precondition(of: op, index: index, existing: existing) {
        case .conflict(let server):
            // A create that proposed the id of a document its user may not read learns nothing
            // of that document (not its version, not whether it was deleted).
            if op.kind == .create, try !readable(server, in: op.collection, for: request.identity, draft) {
                return .refused(Self.createRefusal(of: op, index: index, request.identity))
            }
            return .conflict(op: index, server: try redacted(server, in: op.collection, for: request.identity, draft))
        case .notFound(let error):
            return .refused(error)
        case .holds:
            break
        }
        let newDocument: StoredDocument
        do {
            newDocument = try document(after: op, index: index, of: request, existing: existing, draft: &draft)
        } catch let error as WireError {
            return .refused(error)
        }
        if op.kind == .create && op.id == nil {
            draft.created.append(newDocument)
        } else {
            if draft.documents[newDocument.key] == nil && !written.contains(newDocument.key) {
                draft.writtenOrder.append(newDocument.key)
            }
            draft.documents[newDocument.key] = newDocument
        }
        let (result, answeredSequence) = try answer(for: newDocument, of: op, request.identity, draft)
        draft.results.append(result)
        draft.resultSequences.append(answeredSequence)
        draft.records.append(
            IdempotencyRecord(
                user: request.userKey, client: request.client.rawValue, key: op.idempotencyKey.rawValue,
                result: result, recordedAt: now))
        return nil
    }

    /// What the op's writer is told of the document it wrote, and the sequence its answer
    /// covers (nil when the answer carries nothing of the document).
    private func answer(for newDocument: StoredDocument, of op: WriteOp, _ user: Identity, _ draft: Draft) throws
        -> (WriteResult, answeredSequence: Int64?)
    {
        var result = WriteResult(id: newDocument.id, version: newDocument.version, updateTime: newDocument.updateTime)
        if op.fieldTimes != nil {
            // A merge answers with the stored document: it may keep other writers' fields. Not
            // to a user who may not read it: that client does not learn this state.
            let stored = try newDocument.document
            guard try readable(stored, in: op.collection, for: user, draft) else {
                result.document = Self.withoutContent(stored)
                return (result, nil)
            }
            result.document = stored
        } else if access != nil, op.kind != .delete, try !readable(newDocument, in: op.collection, for: user, draft) {
            // Any other write its user may not read the result of says so, the same way: its
            // client should not keep what no listener of that user will bring again.
            result.document = Self.withoutContent(try newDocument.document)
            return (result, nil)
        }
        return (result, newDocument.sequence)
    }

    /// Every op of a message passed: it joins the group.
    private func accept(_ draft: Draft) {
        documents.merge(draft.documents) { _, new in new }
        absent.subtract(draft.documents.keys)
        writtenOrder.append(contentsOf: draft.writtenOrder)
        written.formUnion(draft.writtenOrder)
        created.append(contentsOf: draft.created)
        sequences.merge(draft.sequences) { _, new in new }
        for record in draft.records {
            recorded[RecordKey(user: record.user, client: record.client, key: record.key)] = record.result
        }
        records.append(contentsOf: draft.records)
    }

    /// Stores what the accepted messages wrote. Call once, after the last ``apply(_:)``.
    func save() throws {
        try transaction.save(writtenOrder.map { documents[$0]! } + created, records: records, sequences: sequences)
    }

    /// One idempotency record the group saves (nil when it saves nothing): found in the store
    /// after a commit whose answer was lost, it shows that the commit took effect.
    var witness: IdempotencyRecord? { records.first }

    /// The collections whose feed this group wrote to.
    var writtenCollections: Set<CollectionPath> { Set(sequences.keys) }

    /// The last sequence this group gave out in `collection`.
    func lastSequence(in collection: CollectionPath) -> Int64? { sequences[collection] }

    // MARK: - Steps

    /// The document at `key` as the draft, the group or the store has it.
    private func stored(_ key: DocumentKey, _ draft: Draft) throws -> StoredDocument? {
        if let document = draft.documents[key] ?? documents[key] { return document }
        if absent.contains(key) { return nil }
        let found = try transaction.documents([key])[key]
        if let found { documents[key] = found } else { absent.insert(key) }
        return found
    }

    /// What a resent create or update hears instead of its first answer when a later write
    /// deleted its document (the tombstone), or a reset or the purge of tombstones removed it
    /// (a tombstone of version 0, with nothing of the document): that answer would leave its
    /// client a row of a document that is gone, which a reset's full snapshot (live documents
    /// only) does not correct. Nil when the document is as the first answer left it or later,
    /// and when the rules would not let the user make the op now: a resend learns nothing it
    /// could not learn by sending the op anew.
    private func goneSince(_ earlier: WriteResult, of op: WriteOp, index: Int, _ user: Identity, _ draft: Draft)
        throws -> Document?
    {
        let key = DocumentKey(collection: op.collection, id: earlier.id)
        let current = try stored(key, draft)
        if let current, !(current.deleted && current.version > earlier.version) { return nil }
        // A create of this group, not stored yet, is not gone.
        if current == nil, created.contains(where: { $0.id == earlier.id }) { return nil }
        guard try refusal(of: op, index: index, existing: current, user, draft) == nil else { return nil }
        guard let current else {
            return Document(
                id: earlier.id, version: 0, fields: [:], createTime: 0, updateTime: 0, deleted: true)
        }
        return try redacted(current.document, in: op.collection, for: user, draft)
    }

    /// The live fields of another document, for `doc(…)` in rules.
    private func liveFields(_ collection: CollectionPath, _ id: DocumentID, _ draft: Draft) throws -> JSONObject? {
        guard let document = try stored(DocumentKey(collection: collection, id: id), draft), !document.deleted
        else { return nil }
        return try document.fields
    }

    /// Why the rules refuse the op, or nil when they allow it (or the server is open).
    private func refusal(
        of op: WriteOp, index: Int, existing: StoredDocument?, _ user: Identity, _ draft: Draft
    ) throws -> WireError? {
        guard let access else { return nil }
        let operation: AccessControl.Operation =
            switch op.kind {
            case .create: .create
            case .update: .update
            case .delete: .delete
            }
        // `resource` is null for a create and for a document that does not exist or was
        // deleted: a rule that needs it refuses alike whether the document exists or not.
        let resource = try op.kind == .create ? nil : existing.flatMap { $0.deleted ? nil : try $0.fields }
        let allowed = try access.allows(
            operation, in: op.collection, identity: user, resource: resource,
            request: op.kind == .delete ? nil : op.fields ?? [:]
        ) { collection, id in try liveFields(collection, id, draft) }
        guard !allowed else { return nil }
        return op.kind == .create
            ? Self.createRefusal(of: op, index: index, user)
            : WireError(
                .permissionDenied,
                "ops[\(index)]: \(AccessControl.describe(user.user)) may not \(operation.rawValue) in \(op.collection)",
                op: index)
    }

    /// The refusal of a create, the same whether the rules refuse it or its proposed id names a
    /// document the user may not read.
    private static func createRefusal(of op: WriteOp, index: Int, _ user: Identity) -> WireError {
        WireError(
            .permissionDenied, "ops[\(index)]: \(AccessControl.describe(user.user)) may not create in \(op.collection)",
            op: index)
    }

    private enum Precondition {
        case holds
        case conflict(Document)
        case notFound(WireError)
    }

    private func precondition(of op: WriteOp, index: Int, existing: StoredDocument?) throws -> Precondition {
        switch op.kind {
        case .create:
            if let existing, !existing.deleted { return .conflict(try existing.document) }
            return .holds
        case .update, .delete:
            guard let existing else {
                return .notFound(
                    WireError(
                        .notFound,
                        "ops[\(index)]: document '\(op.collection)/\(op.id!)' does not exist; create it first",
                        op: index))
            }
            if existing.deleted { return .conflict(try existing.document) }
            if let base = op.baseVersion, base != existing.version { return .conflict(try existing.document) }
            return .holds
        }
    }

    /// The document after the op (`request`'s op at `index`), with the collection's next
    /// sequence number.
    private func document(
        after op: WriteOp, index: Int, of request: WriteRequest, existing: StoredDocument?, draft: inout Draft
    ) throws -> StoredDocument {
        let client = request.client
        let sequence = try nextSequence(op.collection, &draft)
        let isCreate = op.kind == .create
        let deleted = op.kind == .delete
        // Monotonic per document even if the server's clock steps back.
        let updateTime = max(now, existing?.updateTime ?? 0)
        var fieldsJSON = deleted ? "{}" : request.fieldsJSON[index]
        var fieldTimes = op.fieldTimes
        if let incomingTimes = op.fieldTimes, op.kind == .update, let existing {
            // Field-level merge with what is stored: each field keeps its later write.
            let merged = FieldMerge.merge(
                stored: (try existing.fields, try existing.fieldTimes ?? [:]),
                incoming: (op.fields ?? [:], incomingTimes))
            fieldTimes = merged.times
            fieldsJSON = String(decoding: Wire.encodeCanonical(merged.fields), as: UTF8.self)
            if fieldsJSON.utf8.count > maxDocumentBytes {
                throw WireError(
                    .tooLarge,
                    "ops[\(index)]: merged with the stored document it is \(fieldsJSON.utf8.count) bytes; "
                        + "the limit is \(maxDocumentBytes)", op: index)
            }
        }
        if deleted { fieldTimes = try existing?.fieldTimes }
        let id = op.id ?? DocumentID.timeOrdered(milliseconds: now)
        let key = DocumentKey(collection: op.collection, id: id)
        // A row the store does not have yet is inserted; one it has (a tombstone brought back
        // included) is replaced.
        let isNew = existing == nil ? true : (draft.documents[key] ?? documents[key])?.isNew ?? false
        return StoredDocument(
            collection: op.collection, id: id, fieldsJSON: fieldsJSON, version: (existing?.version ?? 0) + 1,
            createTime: isCreate ? updateTime : existing!.createTime, updateTime: updateTime, deleted: deleted,
            sequence: sequence, createSequence: isCreate ? sequence : existing!.createSequence,
            createKey: isCreate ? op.idempotencyKey.rawValue : existing!.createKey,
            createClient: isCreate ? client.rawValue : existing!.createClient,
            fieldTimesJSON: fieldTimes.map { String(decoding: Wire.encodeTimes($0), as: UTF8.self) }, isNew: isNew)
    }

    private func nextSequence(_ collection: CollectionPath, _ draft: inout Draft) throws -> Int64 {
        let current: Int64
        if let known = draft.sequences[collection] ?? sequences[collection] {
            current = known
        } else {
            current = try transaction.lastSequence(of: collection)
        }
        draft.sequences[collection] = current + 1
        return current + 1
    }

    /// The document as a user who may not read it sees it in a conflict or merge answer: its
    /// id, version and whether it is deleted, nothing of its content.
    private func redacted(_ document: Document, in collection: CollectionPath, for user: Identity, _ draft: Draft)
        throws -> Document
    {
        try readable(document, in: collection, for: user, draft) ? document : Self.withoutContent(document)
    }

    /// What a user who may not read a document learns of it: its id, version and whether it
    /// is deleted.
    private static func withoutContent(_ document: Document) -> Document {
        Document(
            id: document.id, version: document.version, fields: [:], createTime: 0, updateTime: 0,
            deleted: document.deleted)
    }

    /// ``readable(_:in:for:_:)`` for a stored document, whose fields are parsed only when a
    /// read rule looks at each document.
    private func readable(
        _ document: StoredDocument, in collection: CollectionPath, for user: Identity, _ draft: Draft
    ) throws -> Bool {
        guard let access else { return true }
        let scope = try access.readScope(in: collection, identity: user) { collection, id in
            try liveFields(collection, id, draft)
        }
        switch scope {
        case .all: return true
        case .none: return false
        case .perDocument: return try readable(try document.document, in: collection, for: user, draft)
        }
    }

    private func readable(_ document: Document, in collection: CollectionPath, for user: Identity, _ draft: Draft)
        throws -> Bool
    {
        guard let access else { return true }
        return try access.allows(
            .read, in: collection, identity: user, resource: document.deleted ? nil : document.fields
        ) { collection, id in
            try liveFields(collection, id, draft)
        }
    }
}
