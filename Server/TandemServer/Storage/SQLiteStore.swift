import Foundation
import GRDB
import GRDBSQLite
import Logging
import Synchronization
import TandemSQLite
import TandemWire

/// The embedded store: one SQLite file (`tandem.sqlite`) in the data folder, for one server
/// process.
///
/// Durability: WAL journal and `synchronous = FULL`, set on the connection after GRDB has
/// opened it. (GRDB's own WAL set-up, `Configuration.journalMode = .wal`, runs after
/// `prepareDatabase` and sets `synchronous = NORMAL`, under which a WAL commit is not synced
/// to disk: it would survive a killed process but not a power loss.) SQLite's documentation:
/// "With synchronous=FULL in WAL mode, an additional sync operation of the WAL file happens
/// after each transaction commit. The extra WAL sync following each transaction helps ensure
/// that transactions are durable across a power loss." The server acknowledges a write only
/// after its transaction committed, so an acknowledged write is on disk. Several writes
/// waiting at once commit in one transaction (``ServerCore`` groups them), so one sync covers
/// them all.
///
/// Only one process may use a data folder, and the server's core queue is its only user, so
/// the feed locks of ``write(locking:_:)`` are the transaction itself.
final class SQLiteStore: DocumentStore {
    let database: DatabaseQueue
    let epoch: String
    let path: String

    /// What the last write committed, per collection, for the feed round that follows it: the
    /// rows a page after the collection's previous last sequence would read back from the
    /// file, already in memory.
    ///
    /// Valid only while the connection has changed no row since (SQLite's count of changed
    /// rows, `sqlite3_total_changes64`, is what it was at the commit): any other write, a
    /// reset, a purge of tombstones, or a write that failed and rolled back makes the feed be
    /// read from the file again.
    private let tail = Mutex<Tail?>(nil)

    private struct Tail {
        var changes: Int64
        var collections: [CollectionPath: TailRows]
        /// Pages served from these rows (for the tests).
        var served = 0
    }

    /// How many feed pages the last write's rows served instead of the file (for the tests).
    var pagesFromMemory: Int { tail.withLock { $0?.served ?? 0 } }

    /// The rows one write left in a collection: every row after `after`, up to `last`.
    struct TailRows {
        var after: Int64
        var last: Int64
        var rows: [StoredDocument]
    }

    /// Past this many bytes of documents, a write's rows are not kept: the feed reads them.
    static let tailBytes = 4 << 20
    var kind: String { path == ":memory:" ? "memory" : "sqlite" }

    /// Opens (or creates) `tandem.sqlite` in `directory`.
    convenience init(directory: URL, logger: Logger) throws {
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let path = directory.appendingPathComponent("tandem.sqlite").path
        var configuration = Configuration()
        configuration.label = "tandem.server"
        configuration.prepareDatabase { db in
            // journal_mode is persistent in the file; synchronous is per connection.
            let mode = try String.fetchOne(db, sql: "PRAGMA journal_mode = WAL")
            guard mode == "wal" else {
                throw DatabaseError(message: "the database refused WAL mode (journal_mode is \(mode ?? "unknown"))")
            }
            try db.execute(sql: "PRAGMA synchronous = FULL")
            // 8 MB of page cache. SQLite hashes its cached pages into as many buckets as pages it
            // has held, and after a B-tree balance that parks a page at the pending-byte page number
            // (seen with 3.40, Debian 12's) the next commit walks every bucket: 16,384 at 64 MB, 2.2 %
            // of bench throughput's samples; 0.6 % at 8 MB.
            try db.execute(sql: "PRAGMA cache_size = -8192")
        }
        try self.init(database: try DatabaseQueue(path: path, configuration: configuration), path: path, logger: logger)
    }

    /// A database in memory, gone when the store closes (`tandem serve --memory`).
    convenience init(inMemoryWith logger: Logger) throws {
        var configuration = Configuration()
        configuration.label = "tandem.server"
        try self.init(database: try DatabaseQueue(configuration: configuration), path: ":memory:", logger: logger)
    }

    private init(database: DatabaseQueue, path: String, logger: Logger) throws {
        self.database = database
        self.path = path
        try Self.migrator.migrate(database)
        epoch = try database.read { db in
            try String.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'epoch'")!
        }
        logger.debug("opened store", metadata: ["tandem.path": "\(path)", "tandem.epoch": "\(epoch)"])
    }

    func close() throws {
        try database.close()
    }

    func setting(_ name: String) throws -> String? {
        guard name.allSatisfy({ $0.isLetter || $0 == "_" }) else { return nil }
        return try read { db in try String.fetchOne(db, sql: "PRAGMA \(name)") }
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
        migrator.registerMigration("v2: idempotency keys belong to a user") { db in
            // Records of v1 have no user: they take the anonymous one (''), every client's user
            // on a server without a token file.
            try db.execute(
                sql: """
                    CREATE TABLE idempotency_v2 (
                        user TEXT NOT NULL,
                        clientId TEXT NOT NULL,
                        key TEXT NOT NULL,
                        id TEXT NOT NULL,
                        version INTEGER NOT NULL,
                        updateTime INTEGER NOT NULL,
                        recordedAt INTEGER NOT NULL,
                        document TEXT,
                        PRIMARY KEY (user, clientId, key)
                    ) WITHOUT ROWID;
                    INSERT INTO idempotency_v2
                        SELECT '', clientId, key, id, version, updateTime, recordedAt, document FROM idempotency;
                    DROP TABLE idempotency;
                    ALTER TABLE idempotency_v2 RENAME TO idempotency;
                    CREATE INDEX idempotency_age ON idempotency(recordedAt);
                    """)
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

    static let columns =
        "collection, id, fields, version, createTime, updateTime, deleted, sequence, createSequence, createKey, createClient, fieldTimes"

    func document(in collection: CollectionPath, id: DocumentID) throws -> StoredDocument? {
        try read { db in try Self.fetchDocument(db, DocumentKey(collection: collection, id: id)) }
    }

    func documents(in collection: CollectionPath) throws -> [Document] {
        try read { db in
            try Row.fetchAll(
                db,
                sql: "SELECT \(Self.columns) FROM document WHERE collection = ? AND deleted = 0 ORDER BY sequence",
                arguments: [collection.rawValue]
            ).map { try Self.storedDocument($0).document }
        }
    }

    func forEachDocument(_ body: (StoredDocument) throws -> Void) throws {
        try read { db in
            let rows = try Row.fetchCursor(
                db, sql: "SELECT \(Self.columns) FROM document ORDER BY collection, sequence")
            while let row = try rows.next() { try body(try Self.storedDocument(row)) }
        }
    }

    func collections() throws -> [(path: CollectionPath, documents: Int)] {
        try read { db in
            try Row.fetchAll(
                db,
                sql:
                    "SELECT collection, count(*) FROM document WHERE deleted = 0 GROUP BY collection ORDER BY collection"
            )
            .compactMap { row in (try? CollectionPath(row[0] as String)).map { ($0, row[1] as Int) } }
        }
    }

    func feedBounds(of collection: CollectionPath) throws -> FeedBounds {
        try read { db in try Self.bounds(db, collection) }
    }

    func page(of collection: CollectionPath, after position: Int64, limit: Int, maxBytes: Int) throws -> FeedPage {
        try read { db in
            try page(
                db, collection, after: position, bounds: Self.bounds(db, collection),
                PageSize(limit: limit, maxBytes: maxBytes))
        }
    }

    func readFeeds(after positions: [CollectionPath: Int64], limit: Int, maxBytes: Int) throws
        -> [CollectionPath: FeedPage]
    {
        try read { db in
            var pages: [CollectionPath: FeedPage] = [:]
            for (collection, position) in positions {
                let bounds = try Self.bounds(db, collection)
                guard bounds.last > position else { continue }
                pages[collection] = try page(
                    db, collection, after: position, bounds: bounds, PageSize(limit: limit, maxBytes: maxBytes))
            }
            return pages
        }
    }

    /// A page of the feed: from the last write's rows when they are what the file holds after
    /// `position`, else read from the file.
    private func page(
        _ db: Database, _ collection: CollectionPath, after position: Int64, bounds: FeedBounds, _ size: PageSize
    ) throws -> FeedPage {
        let (limit, maxBytes) = (size.limit, size.maxBytes)
        guard
            let kept = tail.withLock({ tail -> TailRows? in
                guard let current = tail, current.changes == sqlite3_total_changes64(db.sqliteConnection),
                    let kept = current.collections[collection], kept.after == position, kept.last == bounds.last
                else { return nil }
                tail?.served += 1
                return kept
            })
        else {
            return try Self.page(db, collection, after: position, size, bounds: bounds)
        }
        var next = kept.rows.prefix(limit).makeIterator()
        let (rows, cut) = Self.collect(maxBytes: maxBytes) { next.next() }
        return FeedPage(rows: rows, after: position, limit: limit, cutByBytes: cut, bounds: bounds)
    }

    /// A page's rows, in order, until they reach `maxBytes` (the row that reaches it included):
    /// each counts its fields and 160 bytes for the rest, as the PostgreSQL store's page query does.
    private static func collect(maxBytes: Int, _ next: () throws -> StoredDocument?) rethrows
        -> (rows: [StoredDocument], cutByBytes: Bool)
    {
        var rows: [StoredDocument] = []
        var bytes = 0
        while let row = try next() {
            rows.append(row)
            bytes += row.fieldsBytes + 160
            if bytes >= maxBytes { break }
        }
        return (rows, bytes >= maxBytes)
    }

    /// A page of the feed read from the file; `bounds` are the collection's, as just read.
    static func page(
        _ db: Database, _ collection: CollectionPath, after position: Int64, _ size: PageSize, bounds: FeedBounds
    ) throws -> FeedPage {
        let (limit, maxBytes) = (size.limit, size.maxBytes)
        let statement = try db.cachedStatement(
            sql: "SELECT \(columns) FROM document WHERE collection = ? AND sequence > ? ORDER BY sequence LIMIT ?")
        let cursor = try Row.fetchCursor(statement, arguments: [collection.rawValue, position, limit])
        let (rows, cut) = try collect(maxBytes: maxBytes) { try cursor.next().map(storedDocument) }
        return FeedPage(rows: rows, after: position, limit: limit, cutByBytes: cut, bounds: bounds)
    }

    static func bounds(_ db: Database, _ collection: CollectionPath) throws -> FeedBounds {
        try db.cachedStatement(sql: "SELECT lastSequence, horizonSequence FROM collection WHERE path = ?")
            .firstRow(arguments: [collection.rawValue]) { row in FeedBounds(last: row[0], horizon: row[1]) } ?? .empty
    }

    static func fetchDocument(_ db: Database, _ key: DocumentKey) throws -> StoredDocument? {
        let statement = try db.cachedStatement(
            sql: "SELECT \(columns) FROM document WHERE collection = ? AND id = ?")
        return try statement.firstRow(arguments: [key.collection.rawValue, key.id.rawValue], storedDocument)
    }

    static func storedDocument(_ row: Row) throws -> StoredDocument {
        StoredDocument(
            collection: try CollectionPath(row[0] as String), id: try DocumentID(row[1] as String), fieldsJSON: row[2],
            version: row[3], createTime: row[4], updateTime: row[5], deleted: row[6], sequence: row[7],
            createSequence: row[8], createKey: row[9], createClient: row[10], fieldTimesJSON: row[11])
    }

    // MARK: - Writing

    func write<T>(locking collections: [CollectionPath], _ body: (any StoreTransaction) throws -> T) throws -> T {
        var kept: Tail?
        let result = try database.writeWithoutTransaction { db in
            try db.beginTransaction(.immediate)
            let result: T
            do {
                let transaction = Transaction(db)
                result = try body(transaction)
                // Counted before the commit, which changes no row.
                kept = transaction.saved.map {
                    Tail(changes: sqlite3_total_changes64(db.sqliteConnection), collections: $0)
                }
            } catch {
                if db.isInsideTransaction { try? db.rollback() }
                throw error
            }
            try Self.commit(db)
            return result
        }
        // Committed: what it wrote is what the file holds.
        tail.withLock { $0 = kept }
        return result
    }

    /// Commits, telling a commit that failed from one whose outcome is unknown.
    ///
    /// In WAL mode a commit appends the transaction's pages to the log, the last one marked
    /// as a commit, and then syncs the log (`synchronous = FULL`). An I/O error there (a failed
    /// `fsync`) leaves frames in the log that this connection rolls back, but that a process
    /// opening the file after a crash may find whole and take as committed (SQLite's recovery
    /// reads every frame up to the last valid commit frame). So an I/O error at the commit
    /// leaves the outcome unknown. Any other error (`SQLITE_FULL`, `SQLITE_BUSY`) fails before a
    /// commit frame is written: nothing was committed.
    private static func commit(_ db: Database) throws {
        do {
            try db.commit()
        } catch let error as DatabaseError {
            if db.isInsideTransaction { try? db.rollback() }
            if error.resultCode.primaryResultCode == .SQLITE_IOERR { throw CommitOutcomeUnknown(cause: error) }
            throw error
        }
    }

    func recordedResult(user: String, client: String, key: String) throws -> WriteResult? {
        try read { db in
            try db.cachedStatement(
                sql:
                    "SELECT id, version, updateTime, document FROM idempotency WHERE user = ? AND clientId = ? AND key = ?"
            ).firstRow(arguments: [user, client, key]) { row in
                try WriteResult(recordedID: row[0], version: row[1], updateTime: row[2], document: row[3])
            }
        }
    }

    /// One SQLite transaction. The connection is the only writer, so reads see exactly what
    /// the transaction will build on.
    private final class Transaction: StoreTransaction {
        let db: Database
        /// Each collection's last sequence before this transaction wrote to it.
        private var before: [CollectionPath: Int64] = [:]
        /// What ``save(_:records:sequences:)`` wrote, per collection, for the feed (nil when
        /// nothing was saved, or too much to keep).
        private(set) var saved: [CollectionPath: TailRows]?

        init(_ db: Database) { self.db = db }

        func lastSequence(of collection: CollectionPath) throws -> Int64 {
            let last = try SQLiteStore.bounds(db, collection).last
            if before[collection] == nil { before[collection] = last }
            return last
        }

        func documents(_ keys: [DocumentKey]) throws -> [DocumentKey: StoredDocument] {
            var found: [DocumentKey: StoredDocument] = [:]
            for key in keys where found[key] == nil {
                if let stored = try SQLiteStore.fetchDocument(db, key) { found[key] = stored }
            }
            return found
        }

        func recordedResults(user: String, client: String, keys: [String]) throws -> [String: WriteResult] {
            // Runs of keys that share a long prefix (a batch of creates from Tandem's push,
            // `batchKey-rowId`, each batch's keys one after the other) are read as one range of
            // the primary key each, instead of a probe per key: a group's 2,000 probes were
            // 1.6 % of bench throughput's samples. The other keys are probed, in one query.
            var found: [String: WriteResult] = [:]
            var probed: [String] = []
            var start = keys.startIndex
            while start < keys.endIndex {
                var prefix = Array(keys[start].utf8)
                var end = start + 1
                while end < keys.endIndex {
                    let common = zip(prefix, keys[end].utf8).prefix { $0 == $1 }.count
                    guard common >= Self.sharedPrefixBytes else { break }
                    prefix.removeSubrange(common...)
                    end += 1
                }
                if end - start >= 16,
                    let inRange = try recordedResults(user: user, client: client, keys[start..<end], prefix)
                {
                    found.merge(inRange) { first, _ in first }
                } else {
                    probed += keys[start..<end]
                }
                start = end
            }
            guard !probed.isEmpty else { return found }
            // One query for the rest (a JSON array of them), instead of one per key.
            let statement = try db.cachedStatement(
                sql: """
                    SELECT key, id, version, updateTime, document FROM idempotency
                    WHERE user = ? AND clientId = ? AND key IN (SELECT value FROM json_each(?))
                    """)
            let list = String(decoding: Wire.encode(JSONValue.array(probed.map(JSONValue.string))), as: UTF8.self)
            let probedResults = try Self.results(Row.fetchAll(statement, arguments: [user, client, list]))
            found.merge(probedResults) { first, _ in first }
            return found
        }

        /// How long a prefix keys must share to be read as a range: past a time-ordered key's
        /// eight characters of time, four random ones (two batches made in the same millisecond
        /// share them once in 14 million).
        private static let sharedPrefixBytes = 12

        /// The records of `keys`, which all start with `prefix`, read as one range of the
        /// primary key; nil when the range holds more than twice as many records as the keys
        /// (other keys under the same prefix), which the probes then look up.
        private func recordedResults(user: String, client: String, _ keys: ArraySlice<String>, _ prefix: [UInt8])
            throws -> [String: WriteResult]?
        {
            // Keys are names: ASCII letters, digits and - _ . ~ : @ +, so the prefix's last byte
            // has a successor below 0x80, and every key that starts with the prefix sorts below
            // the prefix with that byte raised (the column's collation is binary).
            guard let last = prefix.last, last < 0x7F else { return nil }
            var upper = prefix
            upper[upper.count - 1] = last + 1
            let limit = keys.count * 2
            let statement = try db.cachedStatement(
                sql: """
                    SELECT key, id, version, updateTime, document FROM idempotency
                    WHERE user = ? AND clientId = ? AND key >= ? AND key < ? LIMIT ?
                    """)
            let rows = try Row.fetchAll(
                statement,
                arguments: [
                    user, client, String(decoding: prefix, as: UTF8.self), String(decoding: upper, as: UTF8.self),
                    limit + 1,
                ])
            guard rows.count <= limit else { return nil }
            if rows.isEmpty { return [:] }
            let wanted = Set(keys)
            return try Self.results(rows.lazy.filter { wanted.contains($0[0]) })
        }

        /// Each row's key and its result (key, id, version, updateTime, document).
        private static func results(_ rows: some Sequence<Row>) throws -> [String: WriteResult] {
            var found: [String: WriteResult] = [:]
            for row in rows {
                found[row[0]] = try WriteResult(
                    recordedID: row[1], version: row[2], updateTime: row[3], document: row[4])
            }
            return found
        }

        func save(_ documents: [StoredDocument], records: [IdempotencyRecord], sequences: [CollectionPath: Int64])
            throws
        {
            // New documents and records many per statement (see `StatementRows`): SQLite ran
            // 51,600 instructions for a created document and its record one statement each,
            // 39,700 in statements of 20 rows, 38,800 of 100 (callgrind, a C program with this
            // schema, commits of 500). The rows go in the order they come, an update between
            // new documents in its place.
            let update = try db.cachedStatement(
                sql: """
                    UPDATE document SET fields = ?3, version = ?4, createTime = ?5, updateTime = ?6, deleted = ?7,
                        sequence = ?8, createSequence = ?9, createKey = ?10, createClient = ?11, fieldTimes = ?12
                    WHERE collection = ?1 AND id = ?2
                    """)
            var start = documents.startIndex
            while start < documents.endIndex {
                guard documents[start].isNew else {
                    try update.executeBinding { values in Self.bind(documents[start], to: &values) }
                    start += 1
                    continue
                }
                var end = start + 1
                while end < documents.endIndex && documents[end].isNew { end += 1 }
                for group in StatementRows.groups(of: start..<end) {
                    try db.cachedStatement(sql: Self.insertDocumentsSQL[group.count]!).executeBinding { values in
                        for index in group { Self.bind(documents[index], to: &values) }
                    }
                }
                start = end
            }
            for group in StatementRows.groups(of: records.indices) {
                try db.cachedStatement(sql: Self.insertRecordsSQL[group.count]!).executeBinding { values in
                    for entry in records[group] {
                        values.bind(entry.user)
                        values.bind(entry.client)
                        values.bind(entry.key)
                        values.bind(entry.result.id.rawValue)
                        values.bind(entry.result.version)
                        values.bind(entry.result.updateTime)
                        values.bind(entry.recordedAt)
                        values.bind(entry.result.document.map { String(decoding: Wire.encode($0), as: UTF8.self) })
                    }
                }
            }
            let sequence = try db.cachedStatement(
                sql: """
                    INSERT INTO collection (path, lastSequence) VALUES (?, ?)
                    ON CONFLICT (path) DO UPDATE SET lastSequence = excluded.lastSequence
                    """)
            for (collection, last) in sequences {
                try sequence.execute(arguments: [collection.rawValue, last])
            }
            keep(documents, sequences)
        }

        /// A document's columns, in the order of ``SQLiteStore/columns``.
        private static func bind(_ document: StoredDocument, to values: inout RawBinder) {
            values.bind(document.collection.rawValue)
            values.bind(document.id.rawValue)
            values.bind(document.fieldsJSON)
            values.bind(document.version)
            values.bind(document.createTime)
            values.bind(document.updateTime)
            values.bind(document.deleted)
            values.bind(document.sequence)
            values.bind(document.createSequence)
            values.bind(document.createKey)
            values.bind(document.createClient)
            values.bind(document.fieldTimesJSON)
        }

        /// `INSERT INTO document` of 1, 4, 16 or 64 rows.
        private static let insertDocumentsSQL = Dictionary(
            uniqueKeysWithValues: StatementRows.groupSizes.map { rows in
                (
                    rows,
                    "INSERT INTO document (\(SQLiteStore.columns)) VALUES "
                        + StatementRows.placeholders(rows: rows, columns: 12)
                )
            })

        /// `INSERT INTO idempotency` of 1, 4, 16 or 64 rows.
        private static let insertRecordsSQL = Dictionary(
            uniqueKeysWithValues: StatementRows.groupSizes.map { rows in
                (
                    rows,
                    """
                    INSERT INTO idempotency (user, clientId, key, id, version, updateTime, recordedAt, document)
                    VALUES \(StatementRows.placeholders(rows: rows, columns: 8))
                    """
                )
            })

        /// Keeps the saved rows for the feed round after the commit, unless they are many
        /// bytes, or a collection's sequence was not read here first (then which rows follow
        /// its previous last is not known).
        private func keep(_ documents: [StoredDocument], _ sequences: [CollectionPath: Int64]) {
            guard documents.reduce(0, { $0 + $1.fieldsBytes }) <= SQLiteStore.tailBytes else { return }
            var kept: [CollectionPath: TailRows] = [:]
            for (collection, last) in sequences {
                guard let after = before[collection] else { return }
                kept[collection] = TailRows(after: after, last: last, rows: [])
            }
            for var document in documents {
                guard kept[document.collection] != nil else { return }
                // As the file gives it back.
                document.isNew = false
                kept[document.collection]!.rows.append(document)
            }
            for collection in kept.keys { kept[collection]!.rows.sort { $0.sequence < $1.sequence } }
            saved = kept
        }
    }

    // MARK: - Maintenance

    func reset(_ collection: CollectionPath?) throws -> Int {
        try database.write { db in
            guard let collection else {
                try db.execute(sql: "DELETE FROM document")
                let removed = db.changesCount
                try db.execute(
                    sql: "UPDATE collection SET lastSequence = lastSequence + 1, horizonSequence = lastSequence + 1")
                try db.execute(sql: "DELETE FROM idempotency")
                return removed
            }
            try db.execute(sql: "DELETE FROM document WHERE collection = ?", arguments: [collection.rawValue])
            let removed = db.changesCount
            try db.execute(
                sql: """
                    UPDATE collection SET lastSequence = lastSequence + 1, horizonSequence = lastSequence + 1
                    WHERE path = ?
                    """, arguments: [collection.rawValue])
            return removed
        }
    }

    func sizeInBytes() throws -> Int64? {
        let pages = try read { db in
            try Int64.fetchOne(db, sql: "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()")
        }
        let log = (try? FileManager.default.attributesOfItem(atPath: path + "-wal")[.size] as? Int64) ?? 0
        return (pages ?? 0) + log
    }

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

/// How much of a feed one page may hold: rows, and bytes (each row its fields and 160).
struct PageSize {
    let limit: Int
    let maxBytes: Int
}
