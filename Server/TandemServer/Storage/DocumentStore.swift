import Foundation
import GRDB
import Logging
import TandemWire

/// The server's documents, change feed and idempotency records, in one SQLite file.
///
/// Every write message is one transaction: its ops commit together or not at all. Each
/// document write takes the next sequence number of its collection, which orders the
/// collection's change feed and is the listener's resume position.
///
/// The store is used from the server's core queue only (see ``TandemServer``); GRDB's
/// `DatabaseQueue` serializes access to the connection as well.
///
/// Durability: WAL journal and `synchronous = FULL`. SQLite's documentation: "With
/// synchronous=FULL in WAL mode, an additional sync operation of the WAL file happens after
/// each transaction commit. The extra WAL sync following each transaction helps ensure that
/// transactions are durable across a power loss." An acknowledged write is on disk.
final class DocumentStore {
    let database: DatabaseQueue
    /// Names this database in resume tokens; a new data folder gets a new epoch.
    let epoch: String
    let path: String

    init(directory: URL, logger: Logger) throws {
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        path = directory.appendingPathComponent("tandem.sqlite").path
        var configuration = Configuration()
        configuration.journalMode = .wal
        configuration.label = "tandem.server"
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = FULL")
            try db.execute(sql: "PRAGMA cache_size = -65536")
        }
        database = try DatabaseQueue(path: path, configuration: configuration)
        try Self.migrator.migrate(database)
        epoch = try database.read { db in
            try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'epoch'")!
        }
        logger.debug("opened store", metadata: ["tandem.path": "\(path)", "tandem.epoch": "\(epoch)"])
    }

    func close() throws {
        try database.close()
    }

    private static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(
                sql: """
                    CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL);
                    CREATE TABLE collection (
                        path TEXT PRIMARY KEY NOT NULL,
                        lastSequence INTEGER NOT NULL,
                        -- Tombstones up to this sequence were purged: a listener behind it
                        -- could miss a delete, so it gets a reset.
                        horizonSequence INTEGER NOT NULL DEFAULT 0
                    );
                    CREATE TABLE document (
                        collection TEXT NOT NULL,
                        id TEXT NOT NULL,
                        fields TEXT NOT NULL,
                        version INTEGER NOT NULL,
                        createTime INTEGER NOT NULL,
                        updateTime INTEGER NOT NULL,
                        deleted INTEGER NOT NULL DEFAULT 0,
                        sequence INTEGER NOT NULL,
                        createSequence INTEGER NOT NULL,
                        -- The idempotency key and client of the create that made the document.
                        createKey TEXT,
                        createClient TEXT,
                        -- For field-level merges: the time of each field's last write.
                        fieldTimes TEXT
                    );
                    CREATE UNIQUE INDEX document_id ON document(collection, id);
                    CREATE UNIQUE INDEX document_feed ON document(collection, sequence);
                    CREATE INDEX document_tombstone_age ON document(updateTime) WHERE deleted = 1;
                    CREATE TABLE idempotency (
                        clientId TEXT NOT NULL,
                        key TEXT NOT NULL,
                        id TEXT NOT NULL,
                        version INTEGER NOT NULL,
                        updateTime INTEGER NOT NULL,
                        recordedAt INTEGER NOT NULL,
                        -- The stored document, for answers to field-level merges.
                        document TEXT,
                        PRIMARY KEY (clientId, key)
                    ) WITHOUT ROWID;
                    CREATE INDEX idempotency_age ON idempotency(recordedAt);
                    """)
            try db.execute(
                sql: "INSERT INTO meta (key, value) VALUES ('epoch', ?)",
                arguments: [String(DocumentID.random().rawValue.prefix(10))])
        }
        return migrator
    }

    // MARK: - Reading

    /// Runs a read on the store's serial queue. Not GRDB's `read`: on a `DatabaseQueue` that
    /// brackets the read with `PRAGMA query_only`, and SQLite expires every prepared statement
    /// of the connection when that flag changes, so each catch-up page would make the next
    /// write compile its statements again. Every access to a queue is serialized, so the read
    /// is just as isolated from writes without it.
    private func read<T>(_ body: (Database) throws -> T) throws -> T {
        try database.unsafeRead(body)
    }

    /// The document, tombstone included; nil when it never existed (or its tombstone was purged).
    func document(in collection: CollectionPath, id: DocumentID) throws -> Document? {
        try read { db in try Self.fetchDocument(db, collection, id)?.document }
    }

    /// Every live document of a collection, in feed order. For tests and tools.
    func documents(in collection: CollectionPath) throws -> [Document] {
        try read { db in
            try Row.fetchAll(
                db,
                sql: """
                    SELECT id, fields, version, createTime, updateTime, deleted, sequence, createSequence, createKey, createClient, fieldTimes
                    FROM document WHERE collection = ? AND deleted = 0 ORDER BY sequence
                    """, arguments: [collection.rawValue]
            ).map { try StoredDocument(row: $0).document }
        }
    }

    /// Every collection with a live document.
    func collections() throws -> [CollectionPath] {
        try read { db in
            try String.fetchAll(
                db, sql: "SELECT DISTINCT collection FROM document WHERE deleted = 0 ORDER BY collection"
            )
            .compactMap { try? CollectionPath($0) }
        }
    }

    /// The collection's last sequence and purge horizon (0, 0 for a collection never written).
    func feedBounds(of collection: CollectionPath) throws -> (last: Int64, horizon: Int64) {
        try read { db in try Self.bounds(db, collection) }
    }

    /// One page of a collection's change feed: the documents written after `position`, in
    /// sequence order, typed relative to `position` as the protocol says.
    ///
    /// A document created after `position` and deleted since is skipped (see
    /// `StoredDocument.change(after:for:)`). The page holds at most `limit` rows and stops once `maxBytes` of fields are in
    /// it (one row at least), so a page of big documents still fits in a frame.
    func page(
        of collection: CollectionPath, after position: Int64, for client: String?, limit: Int, maxBytes: Int
    ) throws -> FeedPage {
        try read { db in
            let (last, horizon) = try Self.bounds(db, collection)
            let statement = try db.cachedStatement(
                sql: """
                    SELECT id, fields, version, createTime, updateTime, deleted, sequence, createSequence, createKey, createClient, fieldTimes
                    FROM document WHERE collection = ? AND sequence > ? ORDER BY sequence LIMIT ?
                    """)
            let rows = try Row.fetchCursor(statement, arguments: [collection.rawValue, position, limit])
            var changes: [Change] = []
            var reached = position
            var bytes = 0
            var count = 0
            while let row = try rows.next() {
                let stored = try StoredDocument(row: row)
                reached = stored.sequence
                count += 1
                if let change = try stored.change(after: position, for: client) {
                    changes.append(change)
                    bytes += stored.fieldsBytes + 160
                }
                if bytes >= maxBytes { break }
            }
            // Fewer rows than asked and no byte cut: the feed is exhausted, so the page reaches
            // the collection's last sequence even when the rows at the end were purged.
            let exhausted = count < limit && bytes < maxBytes
            return FeedPage(
                changes: changes, position: exhausted ? max(last, position) : reached, last: last, horizon: horizon)
        }
    }

    static func bounds(_ db: Database, _ collection: CollectionPath) throws -> (last: Int64, horizon: Int64) {
        try db.cachedStatement(sql: "SELECT lastSequence, horizonSequence FROM collection WHERE path = ?")
            .firstRow(arguments: [collection.rawValue]) { row in (row[0] as Int64, row[1] as Int64) } ?? (0, 0)
    }

    static func fetchDocument(_ db: Database, _ collection: CollectionPath, _ id: DocumentID) throws -> StoredDocument?
    {
        let statement = try db.cachedStatement(
            sql: """
                SELECT id, fields, version, createTime, updateTime, deleted, sequence, createSequence, createKey, createClient, fieldTimes
                FROM document WHERE collection = ? AND id = ?
                """)
        return try statement.firstRow(arguments: [collection.rawValue, id.rawValue], StoredDocument.init(row:))
    }

    // MARK: - Maintenance

    /// Deletes tombstones last written before `tombstonesBefore` and idempotency records made
    /// before `keysBefore` (milliseconds since 1970), raising each collection's horizon past
    /// the purged tombstones.
    func purge(tombstonesBefore: Int64, keysBefore: Int64) throws -> (tombstones: Int, keys: Int) {
        try database.write { db in
            try db.execute(
                sql: """
                    UPDATE collection SET horizonSequence = MAX(horizonSequence, (
                        SELECT MAX(sequence) FROM document
                        WHERE document.collection = collection.path AND deleted = 1 AND updateTime < ?1))
                    WHERE path IN (SELECT DISTINCT collection FROM document WHERE deleted = 1 AND updateTime < ?1)
                    """, arguments: [tombstonesBefore])
            try db.execute(
                sql: "DELETE FROM document WHERE deleted = 1 AND updateTime < ?", arguments: [tombstonesBefore])
            let tombstones = db.changesCount
            try db.execute(sql: "DELETE FROM idempotency WHERE recordedAt < ?", arguments: [keysBefore])
            return (tombstones, db.changesCount)
        }
    }
}

/// A page of a collection's change feed.
struct FeedPage {
    var changes: [Change]
    /// The sequence the page reaches: resume after it.
    var position: Int64
    /// The collection's last sequence when the page was read.
    var last: Int64
    /// The collection's purge horizon when the page was read.
    var horizon: Int64

    var isLast: Bool { position >= last }
}

/// A row of the `document` table.
struct StoredDocument {
    var id: DocumentID
    var fieldsJSON: String
    var version: Int64
    var createTime: Int64
    var updateTime: Int64
    var deleted: Bool
    var sequence: Int64
    var createSequence: Int64
    var createKey: String?
    var createClient: String?
    var fieldTimes: [String: Int64]?

    init(row: Row) throws {
        id = try DocumentID(row[0])
        fieldsJSON = row[1]
        version = row[2]
        createTime = row[3]
        updateTime = row[4]
        deleted = row[5]
        sequence = row[6]
        createSequence = row[7]
        createKey = row[8]
        createClient = row[9]
        fieldTimes = try (row[10] as String?).map { try Wire.decodeTimes(Array($0.utf8)) }
    }

    var fieldsBytes: Int { fieldsJSON.utf8.count }

    var document: Document {
        get throws {
            let fields = deleted ? [:] : try Wire.decodeFields(fieldsJSON.utf8)
            return Document(
                id: id, version: version, fields: fields, createTime: createTime, updateTime: updateTime,
                deleted: deleted,
                createKey: createKey)
        }
    }

    /// How a listener of `client` positioned at `position` sees this row; nil when it should
    /// not see it.
    ///
    /// A document created after the position and deleted since is skipped, since the listener
    /// never saw it, unless `client` created it: that client may know it from the
    /// acknowledgement of its create, and must hear of the delete.
    func change(after position: Int64, for client: String?) throws -> Change? {
        if deleted {
            let mayKnowIt = createSequence <= position || (client != nil && createClient == client)
            return mayKnowIt ? Change(.deleted, try document) : nil
        }
        return Change(createSequence > position ? .added : .modified, try document)
    }
}
