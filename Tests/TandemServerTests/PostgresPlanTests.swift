import Logging
import TandemTesting
import Testing

@testable import TandemServer
@testable import TandemServerPostgres

/// The PostgreSQL store's lookups cost per key asked for, not per row the tables hold: read
/// from PostgreSQL's own plans, with the parameters' values, as it plans them for a write.
@Suite("PostgreSQL plans: lookups by key probe the index")
struct PostgresPlanTests {
    @Test("a group's idempotency lookup probes the primary key once per key, however many records its client has")
    func idempotencyLookup() async throws {
        let cluster = try await PostgresCluster.shared()
        let database = try await onOwnThread { try cluster.createDatabase() }
        defer { cluster.dropDatabase(url: database) }
        let plan = try await onOwnThread { () -> String in
            // The store makes its tables; a plain connection fills them and asks for the plan.
            let store = try PostgresStore(
                url: database, logger: Logger(label: "test"), onNews: { _ in }, onReachability: { _ in })
            defer { try? store.close() }
            let connection = try PostgresConnection(url: database)
            defer { connection.close() }
            try connection.query(
                """
                INSERT INTO tandem_idempotency (user_name, client_id, key, id, version, update_time, recorded_at)
                SELECT '', 'device-a', lpad(n::text, 20, '0'), 'doc' || n, 1, 0, 0 FROM generate_series(1, 20000) AS n
                """)
            try connection.query("ANALYZE tandem_idempotency")
            // A group of 500 keys, 200 of them recorded: parameters bound as a write binds them,
            // so that PostgreSQL plans with their values.
            let keys = (19_801...20_300).map { String(repeating: "0", count: 20 - "\($0)".count) + "\($0)" }
            let rows = try connection.query(
                "EXPLAIN " + PostgresStore.recordedResultsSQL, ["", "device-a", PostgresText.array(keys)]
            ).rows
            return rows.compactMap { $0.first ?? nil }.joined(separator: "\n")
        }
        #expect(
            plan.contains("Index Cond: ((user_name = ''::text) AND (client_id = 'device-a'::text) AND (key = k.key))"),
            "\(plan)")
        #expect(!plan.contains("Seq Scan on tandem_idempotency"), "\(plan)")
        #expect(!plan.contains("Bitmap Heap Scan on tandem_idempotency"), "\(plan)")
    }
}
