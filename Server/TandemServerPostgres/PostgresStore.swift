import Foundation
import Logging
import Synchronization
import TandemServer
import TandemWire

/// The store for many server nodes: one PostgreSQL database shared by every `tandem serve
/// --postgres URL` process. PostgreSQL is the distributed engine; the nodes never talk to
/// each other.
///
/// How the change feed stays gap-free across nodes (docs/SCALE-OUT.md tells it in full):
///
/// - A write locks the counter rows of the collections it writes (`tandem_collection`, in
///   path order) before it reads anything, takes its sequence numbers from them and commits.
///   The lock is held until the commit, so a transaction that takes sequence 8 commits after
///   the one that took 7, and a reader that sees 8 sees 7 too.
/// - The commit sends `NOTIFY tandem_feed` with each collection's path. A notification is
///   only a hint: every node reads the feed by sequence, after the position it read up to,
///   in one statement (one snapshot) for all the collections it follows; it also reads on a
///   timer, and reads everything after its connection for notifications was lost and found
///   again.
///
/// The core queue uses one connection; a thread of the store's own listens for
/// notifications on another, and checks that the database answers.
package final class PostgresStore: DocumentStore {
    let url: String
    package let epoch: String
    package var kind: String { "postgres" }
    private let logger: Logger
    let timeout: Duration
    /// The core queue's connection; nil while it is down.
    private var connection: PostgresConnection?
    /// No new connection is tried before this (after a failure), so that an outage does not
    /// turn every message into a connection attempt.
    private var retryAfter = ContinuousClock.now
    private let listener: FeedListener
    /// Where to cut the connection at the next commit, for tests of a commit whose answer is
    /// lost (``ServerHooks/cutsStoreAtCommit``, which the core asks before each group commit).
    private var nextCommitCut: StoreCut?

    package func cutNextCommit(_ cut: StoreCut?) { nextCommitCut = cut }

    /// Connects, creates Tandem's tables if they are missing, and starts listening for
    /// notifications.
    ///
    /// - Parameters:
    ///   - onNews: Called (on the store's own thread) with the collections another commit
    ///     wrote, or nil when everything must be read again (after a lost connection).
    ///   - onReachability: Called (on the store's own thread) when the database stops or
    ///     starts answering.
    package init(
        url: String, logger: Logger, timeout: Duration = PostgresConnection.defaultTimeout,
        onNews: @escaping @Sendable (Set<CollectionPath>?) -> Void,
        onReachability: @escaping @Sendable (Bool) -> Void
    ) throws {
        self.url = url
        self.logger = logger
        self.timeout = timeout
        let connection = try Self.connect(url, timeout)
        epoch = try Self.migrate(connection)
        self.connection = connection
        listener = try FeedListener(
            url: url, timeout: timeout, logger: logger, onNews: onNews, onReachability: onReachability)
        logger.debug("opened store", metadata: ["tandem.store": "postgres", "tandem.epoch": "\(epoch)"])
    }

    package func close() throws {
        listener.stop()
        connection?.close()
        connection = nil
    }

    /// Whether the database answers, as the listening thread last found.
    var isReachable: Bool { listener.isReachable }

    package func setting(_ name: String) throws -> String? {
        guard name.allSatisfy({ $0.isLetter || $0 == "_" }) else { return nil }
        return try read { try $0.query("SHOW \(name)").rows.first?.first ?? nil }
    }

    /// A connection for writing: `synchronous_commit` is put on for it whatever the database's
    /// default, so that a commit returns only once it is on disk (and, with synchronous
    /// replication configured, on the standbys): an acknowledged write is durable.
    private static func connect(_ url: String, _ timeout: Duration) throws -> PostgresConnection {
        let connection = try PostgresConnection(url: url, timeout: timeout)
        try connection.query("SET synchronous_commit TO on")
        return connection
    }

    // MARK: - Schema

    /// Creates the tables on first use (under an advisory lock, so that nodes starting together
    /// do not race) and returns the database's epoch.
    private static func migrate(_ connection: PostgresConnection) throws -> String {
        try connection.query("BEGIN")
        do {
            try connection.query("SELECT pg_advisory_xact_lock(7878)")
            try connection.query("CREATE TABLE IF NOT EXISTS tandem_meta (key text PRIMARY KEY, value text NOT NULL)")
            let version = try connection.query("SELECT value FROM tandem_meta WHERE key = 'schema'").rows.first?[0]
            if version == nil {
                for statement in schema { try connection.query(statement) }
                try connection.query(
                    "INSERT INTO tandem_meta (key, value) VALUES ('schema', '1'), ('epoch', $1)",
                    [String(DocumentID.random().rawValue.prefix(10))])
            } else if version != "1" {
                throw PostgresError(
                    state: "",
                    message: "the database holds Tandem schema version \(version!), which this server does not know")
            }
            let epoch = try connection.query("SELECT value FROM tandem_meta WHERE key = 'epoch'").rows.first?[0]
            try connection.query("COMMIT")
            return epoch ?? "?"
        } catch {
            _ = try? connection.query("ROLLBACK")
            throw error
        }
    }

    private static let schema = [
        """
        CREATE TABLE tandem_collection (
            path text PRIMARY KEY,
            last_sequence bigint NOT NULL DEFAULT 0,
            -- Tombstones up to this sequence were purged: a listener behind it gets a reset.
            horizon_sequence bigint NOT NULL DEFAULT 0)
        """,
        """
        CREATE TABLE tandem_document (
            collection text NOT NULL,
            id text NOT NULL,
            -- Canonical JSON, kept as text so that it is sent byte for byte as stored.
            fields text NOT NULL,
            version bigint NOT NULL,
            create_time bigint NOT NULL,
            update_time bigint NOT NULL,
            deleted boolean NOT NULL,
            sequence bigint NOT NULL,
            create_sequence bigint NOT NULL,
            create_key text,
            create_client text,
            field_times text,
            PRIMARY KEY (collection, id))
        """,
        "CREATE UNIQUE INDEX tandem_document_feed ON tandem_document (collection, sequence)",
        "CREATE INDEX tandem_document_tombstone_age ON tandem_document (update_time) WHERE deleted",
        """
        CREATE TABLE tandem_idempotency (
            user_name text NOT NULL,
            client_id text NOT NULL,
            key text NOT NULL,
            id text NOT NULL,
            version bigint NOT NULL,
            update_time bigint NOT NULL,
            recorded_at bigint NOT NULL,
            document text,
            PRIMARY KEY (user_name, client_id, key))
        """,
        "CREATE INDEX tandem_idempotency_age ON tandem_idempotency (recorded_at)",
    ]

    static let columns =
        "collection, id, fields, version, create_time, update_time, deleted, sequence, create_sequence, create_key, create_client, field_times"

    /// ``columns`` of the row `d`.
    private static let feedColumns = columns.split(separator: ",")
        .map { "d." + $0.trimmingCharacters(in: .whitespaces) }.joined(separator: ", ")

    // MARK: - Connection

    /// Runs a read with the core's connection. A read whose connection turns out to be gone
    /// (PostgreSQL restarted since the last call) is tried once more on a new connection: it
    /// changes nothing, so trying it again is safe.
    private func read<T>(_ body: (PostgresConnection) throws -> T) throws -> T {
        do {
            return try run(body)
        } catch let error as PostgresError where error.isConnectionFailure {
            retryAfter = ContinuousClock.now
            return try run(body)
        }
    }

    /// Runs `body` with the core's connection, connecting first when it is down.
    private func run<T>(_ body: (PostgresConnection) throws -> T) throws -> T {
        if connection == nil || !connection!.isOpen {
            connection = nil
            guard ContinuousClock.now >= retryAfter || listener.isReachable else {
                throw PostgresError(connectionFailure: "PostgreSQL is unreachable")
            }
            do {
                connection = try Self.connect(url, timeout)
            } catch {
                retryAfter = ContinuousClock.now + .milliseconds(500)
                listener.connectionFailed()
                throw error
            }
        }
        do {
            return try body(connection!)
        } catch let error as PostgresError where error.isConnectionFailure {
            lostConnection()
            throw error
        } catch let error as CommitOutcomeUnknown {
            lostConnection()
            throw error
        }
    }

    /// The core's connection is gone: a new one is tried after a pause, or sooner once the
    /// listening thread finds the database answering.
    private func lostConnection() {
        connection = nil
        retryAfter = ContinuousClock.now + .milliseconds(500)
        listener.connectionFailed()
    }

    // MARK: - Reading

    package func document(in collection: CollectionPath, id: DocumentID) throws -> StoredDocument? {
        try read { connection in
            try connection.query(
                "SELECT \(Self.columns) FROM tandem_document WHERE collection = $1 AND id = $2",
                [collection.rawValue, id.rawValue], prepare: true
            ).rows.first.map(Self.storedDocument)
        }
    }

    package func documents(in collection: CollectionPath) throws -> [Document] {
        try read { connection in
            try connection.query(
                "SELECT \(Self.columns) FROM tandem_document WHERE collection = $1 AND NOT deleted ORDER BY sequence",
                [collection.rawValue]
            ).rows.map { try Self.storedDocument($0).document }
        }
    }

    package func forEachDocument(_ body: (StoredDocument) throws -> Void) throws {
        // Pages of 1,000 by (collection, sequence), so that a large store is never in memory
        // whole.
        var after: (collection: String, sequence: Int64) = ("", -1)
        while true {
            let rows = try read { connection in
                try connection.query(
                    """
                    SELECT \(Self.columns) FROM tandem_document WHERE (collection, sequence) > ($1, $2)
                    ORDER BY collection, sequence LIMIT 1000
                    """, [after.collection, String(after.sequence)], prepare: true
                ).rows
            }
            for row in rows {
                let document = try Self.storedDocument(row)
                try body(document)
                after = (document.collection.rawValue, document.sequence)
            }
            if rows.count < 1000 { return }
        }
    }

    package func collections() throws -> [(path: CollectionPath, documents: Int)] {
        try read { connection in
            try connection.query(
                "SELECT collection, count(*) FROM tandem_document WHERE NOT deleted GROUP BY collection ORDER BY collection"
            ).rows.compactMap { row in
                row[0].flatMap { try? CollectionPath($0) }.map { ($0, Int(PostgresText.int(row[1]))) }
            }
        }
    }

    package func feedBounds(of collection: CollectionPath) throws -> FeedBounds {
        try read { connection in
            let row = try connection.query(
                "SELECT last_sequence, horizon_sequence FROM tandem_collection WHERE path = $1",
                [collection.rawValue], prepare: true
            ).rows.first
            return row.map { FeedBounds(last: PostgresText.int($0[0]), horizon: PostgresText.int($0[1])) } ?? .empty
        }
    }

    /// The rows of one feed page after `$2`, at most `$3` of them and cut once `$4` bytes
    /// are in (one row at least), with the collection's bounds read in the same statement.
    private static let pageSQL = """
        SELECT b.last_sequence, b.horizon_sequence, d.running, \(feedColumns)
        FROM (SELECT coalesce(max(last_sequence), 0) AS last_sequence, coalesce(max(horizon_sequence), 0) AS horizon_sequence
              FROM tandem_collection WHERE path = $1) AS b
        LEFT JOIN LATERAL (
            SELECT r.*, sum(octet_length(r.fields) + 160) OVER (ORDER BY r.sequence) AS running
            FROM (SELECT * FROM tandem_document WHERE collection = $1 AND sequence > $2 ORDER BY sequence LIMIT $3) AS r
        ) AS d ON d.running - (octet_length(d.fields) + 160) < $4
        ORDER BY d.sequence
        """

    package func page(of collection: CollectionPath, after position: Int64, limit: Int, maxBytes: Int) throws
        -> FeedPage
    {
        try read { connection in
            let rows = try connection.query(
                Self.pageSQL, [collection.rawValue, String(position), String(limit), String(maxBytes)], prepare: true
            ).rows
            return try Self.page(rows, after: position, limit: limit, maxBytes: maxBytes)
        }
    }

    private static let feedsSQL = """
        SELECT p.path, c.last_sequence, c.horizon_sequence, d.running, \(feedColumns)
        FROM unnest($1::text[], $2::bigint[]) AS p(path, after)
        JOIN tandem_collection AS c ON c.path = p.path AND c.last_sequence > p.after
        LEFT JOIN LATERAL (
            SELECT r.*, sum(octet_length(r.fields) + 160) OVER (ORDER BY r.sequence) AS running
            FROM (SELECT * FROM tandem_document WHERE collection = p.path AND sequence > p.after
                  ORDER BY sequence LIMIT $3) AS r
        ) AS d ON d.running - (octet_length(d.fields) + 160) < $4
        ORDER BY p.path, d.sequence
        """

    package func readFeeds(after positions: [CollectionPath: Int64], limit: Int, maxBytes: Int) throws
        -> [CollectionPath: FeedPage]
    {
        guard !positions.isEmpty else { return [:] }
        let paths = Array(positions.keys)
        let rows = try read { connection in
            try connection.query(
                Self.feedsSQL,
                [
                    PostgresText.array(paths.map(\.rawValue)), PostgresText.array(paths.map { positions[$0]! }),
                    String(limit), String(maxBytes),
                ], prepare: true
            ).rows
        }
        var byPath: [String: [[String?]]] = [:]
        for row in rows { byPath[row[0] ?? "", default: []].append(Array(row.dropFirst())) }
        var pages: [CollectionPath: FeedPage] = [:]
        for collection in paths {
            guard let rows = byPath[collection.rawValue] else { continue }
            pages[collection] = try Self.page(rows, after: positions[collection]!, limit: limit, maxBytes: maxBytes)
        }
        return pages
    }

    /// A page from rows of the form (last, horizon, running, document columns…).
    private static func page(_ rows: [[String?]], after position: Int64, limit: Int, maxBytes: Int) throws -> FeedPage {
        let bounds = rows.first.map { FeedBounds(last: PostgresText.int($0[0]), horizon: PostgresText.int($0[1])) }
        var documents: [StoredDocument] = []
        documents.reserveCapacity(rows.count)
        var running: Int64 = 0
        for row in rows where row[4] != nil {
            documents.append(try storedDocument(Array(row[3...])))
            running = PostgresText.int(row[2])
        }
        return FeedPage(
            rows: documents, after: position, limit: limit, cutByBytes: running >= maxBytes, bounds: bounds ?? .empty)
    }

    /// A document from its columns, in the order of ``columns``.
    private static func storedDocument(_ row: [String?]) throws -> StoredDocument {
        StoredDocument(
            collection: try CollectionPath(row[0] ?? ""), id: try DocumentID(row[1] ?? ""), fieldsJSON: row[2] ?? "{}",
            version: PostgresText.int(row[3]), createTime: PostgresText.int(row[4]),
            updateTime: PostgresText.int(row[5]), deleted: PostgresText.bool(row[6]),
            sequence: PostgresText.int(row[7]), createSequence: PostgresText.int(row[8]), createKey: row[9],
            createClient: row[10], fieldTimesJSON: row[11])
    }

    // MARK: - Writing

    /// Locks the collections' counter rows, in path order, creating those that are new, and
    /// returns their last sequences.
    private static let lockSQL = """
        INSERT INTO tandem_collection AS c (path) SELECT p FROM unnest($1::text[]) AS p ORDER BY p
        ON CONFLICT (path) DO UPDATE SET path = excluded.path
        RETURNING path, last_sequence
        """

    package func write<T>(locking collections: [CollectionPath], _ body: (any StoreTransaction) throws -> T) throws -> T
    {
        var attempt = 0
        while true {
            attempt += 1
            do {
                return try run { connection in
                    try connection.query("BEGIN")
                    do {
                        var sequences: [CollectionPath: Int64] = [:]
                        if !collections.isEmpty {
                            let locked = try connection.query(
                                Self.lockSQL, [PostgresText.array(collections.map(\.rawValue).sorted())],
                                prepare: true)
                            for row in locked.rows {
                                sequences[try CollectionPath(row[0] ?? "")] = PostgresText.int(row[1])
                            }
                        }
                        let transaction = Transaction(connection, sequences: sequences)
                        let result = try body(transaction)
                        try commit(connection)
                        return result
                    } catch {
                        if connection.isOpen { _ = try? connection.query("ROLLBACK") }
                        throw error
                    }
                }
            } catch let error as PostgresError where error.isRetryable && attempt < 3 {
                logger.debug("write retried", metadata: ["tandem.error": "\(error)"])
            }
        }
    }

    /// Commits. A connection lost while `COMMIT` is on its way (sent, or being sent) leaves the
    /// outcome unknown: PostgreSQL may have committed and lost only its answer, or never read
    /// the command. An error PostgreSQL answers (a serialization failure at commit) is its
    /// answer: nothing was committed.
    private func commit(_ connection: PostgresConnection) throws {
        let cut = nextCommitCut
        nextCommitCut = nil
        if cut == .beforeCommitSent { connection.cutForTesting() }
        do {
            try connection.query("COMMIT", afterSending: { if cut == .afterCommitSent { connection.cutForTesting() } })
        } catch  where error.isConnectionFailure {
            connection.close()
            throw CommitOutcomeUnknown(cause: error)
        }
    }

    package func recordedResult(user: String, client: String, key: String) throws -> WriteResult? {
        try read { connection in
            try connection.query(Self.recordedResultsSQL, [user, client, PostgresText.array([key])], prepare: true)
                .rows.first.map { row in
                    try WriteResult(
                        recordedID: row[1] ?? "", version: PostgresText.int(row[2]),
                        updateTime: PostgresText.int(row[3]),
                        document: row[4])
                }
        }
    }

    /// The idempotency records of a group's keys ($3) for one user ($1) and client ($2): one
    /// probe of the primary key per key. Written as `key = ANY($3)`, the lookup was planned
    /// with the parameters' values as a scan of the records (the table's, or the client's
    /// part of it), each compared against every key of the group: with 30,000 records, 10,000
    /// of them the client's, and a group of 500 keys, 3.3 ms and growing with the records,
    /// against 1.8 ms here whatever their number. `LIMIT 1` keeps the planner from flattening
    /// the subquery into a hash join over the same scan.
    package static let recordedResultsSQL = """
        SELECT i.key, i.id, i.version, i.update_time, i.document FROM unnest($3::text[]) AS k(key),
            LATERAL (
                SELECT key, id, version, update_time, document FROM tandem_idempotency
                WHERE user_name = $1 AND client_id = $2 AND key = k.key LIMIT 1) AS i
        """

    private final class Transaction: StoreTransaction {
        let connection: PostgresConnection
        let locked: [CollectionPath: Int64]

        init(_ connection: PostgresConnection, sequences: [CollectionPath: Int64]) {
            self.connection = connection
            self.locked = sequences
        }

        package func lastSequence(of collection: CollectionPath) throws -> Int64 {
            guard let last = locked[collection] else {
                throw PostgresError(state: "", message: "the collection \(collection) was not locked for this write")
            }
            return last
        }

        package func documents(_ keys: [DocumentKey]) throws -> [DocumentKey: StoredDocument] {
            guard !keys.isEmpty else { return [:] }
            let rows = try connection.query(
                """
                SELECT \(PostgresStore.columns) FROM tandem_document
                WHERE (collection, id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
                """,
                [
                    PostgresText.array(keys.map(\.collection.rawValue)), PostgresText.array(keys.map(\.id.rawValue)),
                ], prepare: true
            ).rows
            var found: [DocumentKey: StoredDocument] = [:]
            for row in rows {
                let document = try PostgresStore.storedDocument(row)
                found[document.key] = document
            }
            return found
        }

        package func recordedResults(user: String, client: String, keys: [String]) throws -> [String: WriteResult] {
            guard !keys.isEmpty else { return [:] }
            let rows = try connection.query(
                PostgresStore.recordedResultsSQL, [user, client, PostgresText.array(keys)], prepare: true
            ).rows
            var found: [String: WriteResult] = [:]
            for row in rows {
                found[row[0] ?? ""] = try WriteResult(
                    recordedID: row[1] ?? "", version: PostgresText.int(row[2]), updateTime: PostgresText.int(row[3]),
                    document: row[4])
            }
            return found
        }

        /// Everything a group wrote, in one statement: new documents inserted, the others
        /// replaced, idempotency records, the collections' last sequences, and a notification
        /// per written collection (sent by PostgreSQL when the transaction commits).
        private static let saveSQL = """
            WITH
            inserted AS (
                INSERT INTO tandem_document (\(PostgresStore.columns))
                SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[],
                    $7::boolean[], $8::bigint[], $9::bigint[], $10::text[], $11::text[], $12::text[])
                RETURNING 1),
            replaced AS (
                UPDATE tandem_document AS d SET fields = u.fields, version = u.version, create_time = u.create_time,
                    update_time = u.update_time, deleted = u.deleted, sequence = u.sequence,
                    create_sequence = u.create_sequence, create_key = u.create_key, create_client = u.create_client,
                    field_times = u.field_times
                FROM unnest($13::text[], $14::text[], $15::text[], $16::bigint[], $17::bigint[], $18::bigint[],
                    $19::boolean[], $20::bigint[], $21::bigint[], $22::text[], $23::text[], $24::text[])
                    AS u(collection, id, fields, version, create_time, update_time, deleted, sequence,
                        create_sequence, create_key, create_client, field_times)
                WHERE d.collection = u.collection AND d.id = u.id
                RETURNING 1),
            recorded AS (
                INSERT INTO tandem_idempotency (user_name, client_id, key, id, version, update_time, recorded_at, document)
                SELECT * FROM unnest($25::text[], $26::text[], $27::text[], $28::text[], $29::bigint[], $30::bigint[],
                    $31::bigint[], $32::text[])
                RETURNING 1),
            counted AS (
                UPDATE tandem_collection AS c SET last_sequence = u.last
                FROM unnest($33::text[], $34::bigint[]) AS u(path, last) WHERE c.path = u.path
                RETURNING 1)
            SELECT (SELECT count(*) FROM inserted), (SELECT count(*) FROM replaced), (SELECT count(*) FROM recorded),
                (SELECT count(*) FROM counted)
            """

        package func save(
            _ documents: [StoredDocument], records: [IdempotencyRecord], sequences: [CollectionPath: Int64]
        )
            throws
        {
            let new = documents.filter(\.isNew)
            let old = documents.filter { !$0.isNew }
            func columns(_ documents: [StoredDocument]) -> [String?] {
                [
                    PostgresText.array(documents.map(\.collection.rawValue)),
                    PostgresText.array(documents.map(\.id.rawValue)),
                    PostgresText.array(documents.map(\.fieldsJSON)),
                    PostgresText.array(documents.map(\.version)),
                    PostgresText.array(documents.map(\.createTime)),
                    PostgresText.array(documents.map(\.updateTime)),
                    "{" + documents.map { $0.deleted ? "t" : "f" }.joined(separator: ",") + "}",
                    PostgresText.array(documents.map(\.sequence)),
                    PostgresText.array(documents.map(\.createSequence)),
                    PostgresText.array(documents.map(\.createKey)),
                    PostgresText.array(documents.map(\.createClient)),
                    PostgresText.array(documents.map(\.fieldTimesJSON)),
                ]
            }
            let paths = Array(sequences.keys)
            let parameters: [String?] =
                columns(new) + columns(old) + [
                    PostgresText.array(records.map(\.user)), PostgresText.array(records.map(\.client)),
                    PostgresText.array(records.map(\.key)), PostgresText.array(records.map(\.result.id.rawValue)),
                    PostgresText.array(records.map(\.result.version)),
                    PostgresText.array(records.map(\.result.updateTime)), PostgresText.array(records.map(\.recordedAt)),
                    PostgresText.array(
                        records.map { record in
                            record.result.document.map { String(decoding: Wire.encode($0), as: UTF8.self) }
                        }),
                    PostgresText.array(paths.map(\.rawValue)), PostgresText.array(paths.map { sequences[$0]! }),
                ]
            let counts = try connection.query(Self.saveSQL, parameters, prepare: true).rows.first ?? []
            let replaced = PostgresText.int(counts.count > 1 ? counts[1] : nil)
            guard replaced == old.count else {
                // A row this group read is gone: never leave a write half-done.
                throw PostgresError(
                    state: "", message: "\(old.count - Int(replaced)) documents changed under the write; retry")
            }
            // Delivered by PostgreSQL when the transaction commits, to every node listening.
            try connection.query(
                "SELECT pg_notify('tandem_feed', p) FROM unnest($1::text[]) AS p",
                [PostgresText.array(paths.map(\.rawValue))], prepare: true)
        }
    }

    // MARK: - Maintenance

    package func reset(_ collection: CollectionPath?) throws -> Int {
        let paths: [CollectionPath] =
            try collection.map { [$0] }
            ?? run { connection in
                try connection.query("SELECT path FROM tandem_collection").rows.compactMap {
                    $0[0].flatMap { try? CollectionPath($0) }
                }
            }
        // Under the collections' locks, like a write, so that the new sequence and horizon
        // follow every commit before them; the notification makes every node read the feeds
        // and send its listeners their reset.
        return try write(locking: paths) { transaction in
            let connection = (transaction as! Transaction).connection
            let names = PostgresText.array(paths.map(\.rawValue))
            let row = try connection.query(
                """
                WITH removed AS (DELETE FROM tandem_document WHERE collection = ANY($1::text[]) RETURNING 1),
                moved AS (
                    UPDATE tandem_collection SET last_sequence = last_sequence + 1,
                        horizon_sequence = last_sequence + 1
                    WHERE path = ANY($1::text[]) RETURNING 1)
                SELECT (SELECT count(*) FROM removed), (SELECT count(*) FROM moved)
                """, [names]
            ).rows.first
            if collection == nil { try connection.query("DELETE FROM tandem_idempotency") }
            try connection.query("SELECT pg_notify('tandem_feed', p) FROM unnest($1::text[]) AS p", [names])
            return Int(PostgresText.int(row?[0]))
        }
    }

    package func sizeInBytes() throws -> Int64? {
        try read { connection in
            let row = try connection.query(
                """
                SELECT pg_total_relation_size('tandem_document') + pg_total_relation_size('tandem_collection')
                    + pg_total_relation_size('tandem_idempotency')
                """
            ).rows.first
            return PostgresText.int(row?[0])
        }
    }

    package func purge(tombstonesBefore: Int64, keysBefore: Int64) throws -> (tombstones: Int, keys: Int) {
        let collections = try run { connection in
            try connection.query(
                "SELECT DISTINCT collection FROM tandem_document WHERE deleted AND update_time < $1",
                [String(tombstonesBefore)]
            ).rows.compactMap { $0[0].flatMap { try? CollectionPath($0) } }
        }
        // Under the collections' locks, like a write: a writer bringing back a tombstone's id
        // never meets a row that vanished under it.
        let tombstones = try write(locking: collections) { transaction in
            let connection = (transaction as! Transaction).connection
            let row = try connection.query(
                """
                WITH purged AS (
                    DELETE FROM tandem_document WHERE deleted AND update_time < $1 AND collection = ANY($2::text[])
                    RETURNING collection, sequence),
                raised AS (
                    UPDATE tandem_collection AS c SET horizon_sequence = greatest(c.horizon_sequence, m.sequence)
                    FROM (SELECT collection, max(sequence) AS sequence FROM purged GROUP BY collection) AS m
                    WHERE c.path = m.collection RETURNING 1)
                SELECT (SELECT count(*) FROM purged), (SELECT count(*) FROM raised)
                """, [String(tombstonesBefore), PostgresText.array(collections.map(\.rawValue))]
            ).rows.first
            return Int(PostgresText.int(row?[0]))
        }
        let keys = try run { connection in
            let row = try connection.query(
                "WITH gone AS (DELETE FROM tandem_idempotency WHERE recorded_at < $1 RETURNING 1) SELECT count(*) FROM gone",
                [String(keysBefore)]
            ).rows.first
            return Int(PostgresText.int(row?[0]))
        }
        return (tombstones, keys)
    }
}

/// The store's own thread: a connection that `LISTEN`s for the feed's notifications and
/// checks every second that the database answers, reconnecting with backoff when it does not.
final class FeedListener: Sendable {
    private let state = Mutex(State())
    private let stopped = Atomic<Bool>(false)
    private let reachable = Atomic<Bool>(true)
    private let finished = DispatchSemaphore(value: 0)

    private struct State {
        /// The core's connection failed: check the database now, not at the next second.
        var checkNow = false
    }

    init(
        url: String, timeout: Duration, logger: Logger,
        onNews: @escaping @Sendable (Set<CollectionPath>?) -> Void,
        onReachability: @escaping @Sendable (Bool) -> Void
    ) throws {
        // The first connection must work: a server does not start on a database it cannot reach.
        let first = Handover(connection: try PostgresConnection(url: url, timeout: timeout))
        try first.connection.query("LISTEN tandem_feed")
        let thread = Thread { [self] in
            var connection: PostgresConnection? = first.connection
            var backoff = Duration.milliseconds(100)
            var lastCheck = ContinuousClock.now
            while !stopped.load(ordering: .relaxed) {
                guard let current = connection, current.isOpen else {
                    // Down: try again, catch up once back.
                    connection = nil
                    if reachable.exchange(false, ordering: .relaxed) {
                        logger.error("PostgreSQL is unreachable; retrying", metadata: ["tandem.store": "postgres"])
                        onReachability(false)
                    }
                    do {
                        let fresh = try PostgresConnection(url: url, timeout: timeout)
                        try fresh.query("LISTEN tandem_feed")
                        connection = fresh
                        backoff = .milliseconds(100)
                        reachable.store(true, ordering: .relaxed)
                        logger.notice("PostgreSQL answers again", metadata: ["tandem.store": "postgres"])
                        onReachability(true)
                        onNews(nil)
                    } catch {
                        Thread.sleep(forTimeInterval: backoff.seconds)
                        backoff = min(backoff * 2, .seconds(2))
                    }
                    continue
                }
                do {
                    if current.waitForInput(.milliseconds(250)) {
                        let news = try current.notifications()
                        let paths = Set(news.compactMap { try? CollectionPath($0.payload) })
                        if !paths.isEmpty { onNews(paths) }
                    }
                    let checkNow = state.withLock { state in
                        defer { state.checkNow = false }
                        return state.checkNow
                    }
                    if checkNow || ContinuousClock.now - lastCheck >= .seconds(1) {
                        // A check that the database answers, and a periodic read: notifications
                        // are hints, the feed is the truth.
                        try current.query("SELECT 1")
                        lastCheck = ContinuousClock.now
                        onNews(nil)
                    }
                } catch {
                    connection?.close()
                    connection = nil
                }
            }
            connection?.close()
            finished.signal()
        }
        thread.name = "tandem-pg-listen"
        thread.start()
    }

    var isReachable: Bool { reachable.load(ordering: .relaxed) }

    /// A connection handed to the thread that will be its only user.
    private struct Handover: @unchecked Sendable {
        let connection: PostgresConnection
    }

    /// The core's connection failed: check the database now rather than at the next second.
    func connectionFailed() {
        state.withLock { $0.checkNow = true }
    }

    func stop() {
        guard !stopped.exchange(true, ordering: .relaxed) else { return }
        finished.wait()
    }
}
