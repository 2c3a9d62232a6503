import Logging
import TandemWire

/// Where the server keeps its documents, change feed and idempotency records: the storage
/// seam. Two stores implement it, ``SQLiteStore`` (one process, the default) and the
/// PostgreSQL store of `TandemServerPostgres` (any number of server nodes over one database).
///
/// The store holds data and nothing else: what a write means (access, preconditions, merges,
/// sequences) is decided once, in ``WriteGroup``, against a ``StoreTransaction``, so that both
/// stores behave identically.
///
/// The change feed of a collection is its documents ordered by `sequence`: every write of a
/// document gives it the collection's next sequence number, inside the writing transaction,
/// while that transaction holds the collection's lock (``write(locking:_:)``). So sequences
/// follow commit order: when a reader sees sequence 8, the transaction that took 7 has
/// committed. A document written several times is in the feed once, at its latest sequence.
///
/// Stores are used from the server's core queue only (see ``ServerCore``).
package protocol DocumentStore: AnyObject {
    /// Names the database in resume tokens: a token from another database is never taken for
    /// a position in this one.
    var epoch: String { get }

    /// `sqlite` or `postgres`, for health reports and logs.
    var kind: String { get }

    /// Runs `body` in one transaction that holds the feed locks of `collections` (taken in
    /// path order, so that two writers never wait for each other in a circle), and commits
    /// durably before returning: a write is acknowledged only after this returns.
    ///
    /// - Throws: What `body` throws, or the store's own error: nothing is written. Or
    ///   ``CommitOutcomeUnknown`` when the commit was under way and its result was lost: it may
    ///   have taken effect or not.
    func write<T>(locking collections: [CollectionPath], _ body: (any StoreTransaction) throws -> T) throws -> T

    /// The remembered result of one op, read outside any write: after a commit whose outcome
    /// was lost, a record the commit saved tells whether it took effect.
    func recordedResult(user: String, client: String, key: String) throws -> WriteResult?

    /// The document, tombstone included; nil when it never existed (or its tombstone was purged).
    func document(in collection: CollectionPath, id: DocumentID) throws -> StoredDocument?

    /// The collection's last sequence and purge horizon (0, 0 for a collection never written).
    func feedBounds(of collection: CollectionPath) throws -> FeedBounds

    /// One page of a collection's change feed: the documents written after `position`, in
    /// sequence order. At most `limit` rows, and it stops once `maxBytes` of fields are in it
    /// (one row at least), so that a page of big documents still fits in a frame.
    func page(of collection: CollectionPath, after position: Int64, limit: Int, maxBytes: Int) throws -> FeedPage

    /// Pages of several collections' feeds read at one moment (a consistent snapshot), each
    /// after its position in `positions`. Collections with nothing new are left out.
    func readFeeds(after positions: [CollectionPath: Int64], limit: Int, maxBytes: Int) throws
        -> [CollectionPath: FeedPage]

    /// Deletes tombstones last written before `tombstonesBefore` and idempotency records made
    /// before `keysBefore` (milliseconds since 1970), raising each collection's horizon past
    /// the purged tombstones.
    func purge(tombstonesBefore: Int64, keysBefore: Int64) throws -> (tombstones: Int, keys: Int)

    /// Removes every document of `collection`, or of every collection (and every idempotency
    /// record) when nil, for the admin API's reset.
    ///
    /// Each emptied collection takes one more sequence and moves its horizon to it, so that
    /// every listener and resume token from before the reset is behind the horizon and gets a
    /// `reset`, on every node: its client then drops what it held. Sequences never go back, so
    /// a token from before the reset is never taken for a position after it.
    ///
    /// - Returns: How many documents (tombstones included) were removed.
    func reset(_ collection: CollectionPath?) throws -> Int

    /// The bytes the store takes (the database file and its log), when it can tell.
    func sizeInBytes() throws -> Int64?

    /// Every collection holding at least one live document, with how many it holds, in path
    /// order. For tests and tools.
    func collections() throws -> [(path: CollectionPath, documents: Int)]

    /// Every live document of the collection, in feed order. For tests and tools.
    func documents(in collection: CollectionPath) throws -> [Document]

    /// Every document, tombstones included, by collection and then sequence, handed to `body`
    /// a page at a time (the store is never read whole into memory). For exports and checks.
    func forEachDocument(_ body: (StoredDocument) throws -> Void) throws

    /// A setting of the store's connection as it is in force now (for example SQLite's
    /// `synchronous`), for tests that check what the documents promise.
    func setting(_ name: String) throws -> String?

    /// Closes the store. Nothing may be called afterwards.
    func close() throws

    /// For tests of a commit whose answer is lost: where the store cuts its connection at its
    /// next commit (``ServerHooks/cutsStoreAtCommit``). A store with no connection to cut
    /// ignores it.
    func cutNextCommit(_ cut: StoreCut?)
}

extension DocumentStore {
    package func cutNextCommit(_ cut: StoreCut?) {}
}

extension WriteResult {
    /// A result as an idempotency record keeps it: the stored document is the JSON of a
    /// merge's answer.
    package init(recordedID id: String, version: Int64, updateTime: Int64, document: String?) throws {
        self.init(
            id: try DocumentID(id), version: version, updateTime: updateTime,
            document: try document.map { try Wire.decode(Document.self, from: Array($0.utf8)) })
    }
}

/// How a server opens a store that another target provides: PostgreSQL's, from
/// `TandemServerPostgres` (`ServerConfiguration.Storage.postgres(url:)`), so that an app that
/// embeds the SQLite server links no libpq.
public struct StoreFactory: Sendable {
    /// `postgres`, for health reports and logs.
    package let kind: String
    /// What the store is, for logs (a URL without its password).
    package let summary: String
    package let open: @Sendable (StoreContext) throws -> any DocumentStore

    package init(
        kind: String, summary: String, open: @escaping @Sendable (StoreContext) throws -> any DocumentStore
    ) {
        self.kind = kind
        self.summary = summary
        self.open = open
    }
}

/// What a store made by a ``StoreFactory`` is given.
package struct StoreContext: Sendable {
    package let logger: Logger
    /// How long to wait for the database's answer to a statement.
    package let timeout: Duration
    /// Called (on the store's own thread) with the collections another node's commit wrote, or
    /// nil when every followed feed must be read again.
    package let onNews: @Sendable (Set<CollectionPath>?) -> Void
    /// Called (on the store's own thread) when the database stops or starts answering.
    package let onReachability: @Sendable (Bool) -> Void
}

/// A commit whose result was lost: the store had sent it (PostgreSQL), or was syncing it to
/// disk (SQLite), when the connection or the disk failed, so it cannot tell whether the
/// transaction took effect. Nothing may be said about its writes until someone finds out.
package struct CommitOutcomeUnknown: Error, CustomStringConvertible {
    package var cause: any Error

    package init(cause: any Error) { self.cause = cause }

    package var description: String { "the commit's outcome is unknown: \(cause)" }
}

/// The inside of one write transaction: reads at the transaction's moment, and the final
/// writes of a ``WriteGroup``.
package protocol StoreTransaction: AnyObject {
    /// The last sequence of a collection this transaction locked.
    func lastSequence(of collection: CollectionPath) throws -> Int64

    /// The stored documents (tombstones included) among `keys`; missing ones are left out.
    func documents(_ keys: [DocumentKey]) throws -> [DocumentKey: StoredDocument]

    /// The remembered results of ops sent by `client` for `user` under these idempotency keys.
    func recordedResults(user: String, client: String, keys: [String]) throws -> [String: WriteResult]

    /// Stores what the group wrote: documents (`isNew` ones inserted, the others replaced),
    /// idempotency records, and each written collection's last sequence. Called once, last.
    func save(_ documents: [StoredDocument], records: [IdempotencyRecord], sequences: [CollectionPath: Int64]) throws
}

/// A document's address.
package struct DocumentKey: Hashable, Sendable, CustomStringConvertible {
    package var collection: CollectionPath
    package var id: DocumentID

    package init(collection: CollectionPath, id: DocumentID) {
        self.collection = collection
        self.id = id
    }

    package var description: String { "\(collection)/\(id)" }
}

/// The result of one applied op, remembered under its idempotency key.
package struct IdempotencyRecord {
    /// The user of the token that sent it; empty for anonymous clients.
    package var user: String
    package var client: String
    package var key: String
    package var result: WriteResult
    /// When it was recorded (milliseconds since 1970), for its retention.
    package var recordedAt: Int64

    package init(user: String, client: String, key: String, result: WriteResult, recordedAt: Int64) {
        self.user = user
        self.client = client
        self.key = key
        self.result = result
        self.recordedAt = recordedAt
    }
}

/// A collection's feed bounds.
package struct FeedBounds: Equatable {
    /// The sequence of the collection's last write (0 when never written).
    package var last: Int64
    /// Tombstones up to this sequence were purged: a listener behind it could miss a delete.
    package var horizon: Int64

    package init(last: Int64, horizon: Int64) {
        self.last = last
        self.horizon = horizon
    }

    package static let empty = FeedBounds(last: 0, horizon: 0)
}

/// A page of a collection's change feed.
package struct FeedPage {
    package var rows: [StoredDocument]
    /// The sequence the page reaches: resume after it.
    package var position: Int64
    /// The collection's last sequence and horizon when the page was read.
    package var bounds: FeedBounds

    package var isLast: Bool { position >= bounds.last }

    /// Builds a page from rows read after `position` with `limit` and `maxBytes`, as the stores
    /// read them: fewer rows than asked and no byte cut means the feed is exhausted, so the
    /// page reaches the collection's last sequence even when the rows at its end were purged.
    package init(rows: [StoredDocument], after position: Int64, limit: Int, cutByBytes: Bool, bounds: FeedBounds) {
        self.rows = rows
        self.bounds = bounds
        let reached = rows.last?.sequence ?? position
        let exhausted = rows.count < limit && !cutByBytes
        self.position = exhausted ? max(bounds.last, position) : reached
    }
}

/// A row of the document table: a document with its place in the feed.
///
/// A write passes each row through several tables (the group's, the saved rows, the feed's
/// tail, the listeners' pages), so the row is copied often: its strings, which never change
/// once the row is made, are kept in one shared box, and a copy retains the box instead of
/// each string (the copies were 3 % of the CPU of the throughput benchmark).
package struct StoredDocument {
    /// The parts of a row that never change once it is made.
    private final class Text: Sendable {
        let collection: CollectionPath
        let id: DocumentID
        let fieldsJSON: String
        let createKey: String?
        let createClient: String?
        let fieldTimesJSON: String?

        init(
            collection: CollectionPath, id: DocumentID, fieldsJSON: String, createKey: String?,
            createClient: String?, fieldTimesJSON: String?
        ) {
            self.collection = collection
            self.id = id
            self.fieldsJSON = fieldsJSON
            self.createKey = createKey
            self.createClient = createClient
            self.fieldTimesJSON = fieldTimesJSON
        }
    }

    private let text: Text
    package var version: Int64
    package var createTime: Int64
    package var updateTime: Int64
    package var deleted: Bool
    package var sequence: Int64
    package var createSequence: Int64
    /// True for a row that did not exist before this write (inserted, not replaced).
    package var isNew: Bool

    package init(
        collection: CollectionPath, id: DocumentID, fieldsJSON: String, version: Int64, createTime: Int64,
        updateTime: Int64, deleted: Bool, sequence: Int64, createSequence: Int64, createKey: String? = nil,
        createClient: String? = nil, fieldTimesJSON: String? = nil, isNew: Bool = false
    ) {
        text = Text(
            collection: collection, id: id, fieldsJSON: fieldsJSON, createKey: createKey, createClient: createClient,
            fieldTimesJSON: fieldTimesJSON)
        self.version = version
        self.createTime = createTime
        self.updateTime = updateTime
        self.deleted = deleted
        self.sequence = sequence
        self.createSequence = createSequence
        self.isNew = isNew
    }

    package var collection: CollectionPath { text.collection }
    package var id: DocumentID { text.id }
    /// The canonical JSON of the fields (`{}` for a tombstone), spliced as is into frames.
    package var fieldsJSON: String { text.fieldsJSON }
    /// The idempotency key and client of the create that made the document.
    package var createKey: String? { text.createKey }
    package var createClient: String? { text.createClient }
    /// For field-level merges: when each field was last written, as canonical JSON.
    package var fieldTimesJSON: String? { text.fieldTimesJSON }

    package var key: DocumentKey { DocumentKey(collection: collection, id: id) }

    package var fieldsBytes: Int { fieldsJSON.utf8.count }

    package var fields: JSONObject {
        get throws { deleted ? [:] : try Wire.decodeFields(fieldsJSON.utf8) }
    }

    package var fieldTimes: [String: Int64]? {
        get throws { try fieldTimesJSON.map { try Wire.decodeTimes(Array($0.utf8)) } }
    }

    /// The document as the protocol sends it, field times included.
    package var document: Document {
        get throws {
            Document(
                id: id, version: version, fields: try fields, createTime: createTime, updateTime: updateTime,
                deleted: deleted, createKey: createKey, fieldTimes: try fieldTimes)
        }
    }

    /// How a listener of `client` positioned at `position` sees this row; nil when it should
    /// not see it.
    ///
    /// A document created after the position and deleted since is skipped, since the listener
    /// never saw it, unless `client` created it: that client may know it from the
    /// acknowledgement of its create, and must hear of the delete.
    package func changeKind(after position: Int64, for client: String?) -> Change.Kind? {
        if deleted {
            let mayKnowIt = createSequence <= position || (client != nil && createClient == client)
            return mayKnowIt ? .deleted : nil
        }
        return createSequence > position ? .added : .modified
    }

    /// Writes the row as a snapshot change, its stored JSON spliced in without parsing it
    /// (with its positions in a query listener's view, when given).
    package func writeChange(_ kind: Change.Kind, indices: (old: Int, new: Int)? = nil, to writer: inout JSONWriter) {
        writer.beginObject()
        writer.key("kind")
        writer.string(kind.rawValue)
        if let indices {
            writer.key("oldIndex")
            writer.int(Int64(indices.old))
            writer.key("newIndex")
            writer.int(Int64(indices.new))
        }
        writer.key("id")
        writer.string(id.rawValue)
        writer.key("version")
        writer.int(version)
        writer.key("fields")
        writer.raw(deleted ? "{}".utf8 : fieldsJSON.utf8)
        writer.key("createTime")
        writer.int(createTime)
        writer.key("updateTime")
        writer.int(updateTime)
        writer.key("deleted")
        writer.bool(deleted)
        if let createKey {
            writer.key("createKey")
            writer.string(createKey)
        }
        if let fieldTimesJSON {
            writer.key("fieldTimes")
            writer.raw(fieldTimesJSON.utf8)
        }
        writer.endObject()
    }
}
