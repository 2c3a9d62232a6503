import Foundation
import Synchronization
import TandemHarness
import TandemLocal
import TandemServerPostgres

/// What PostgreSQL can do through libpq without Tandem, to measure the cluster scenario
/// against: the same client library, the same database, the same machine, no Tandem.
enum PostgresFloors {
    /// A connection for the floors: the store's own (``PostgresConnection``), with one
    /// blocking wait for a notification. The floors run alone, so blocking calls are fine;
    /// each connection is used by one thread at a time.
    final class Connection: @unchecked Sendable {
        let connection: PostgresConnection

        init(url: String) throws {
            do {
                connection = try PostgresConnection(url: url)
            } catch {
                throw ScenarioError("the floor could not connect to PostgreSQL at \(url): \(error)")
            }
        }

        func execute(_ sql: String) throws {
            do { try connection.script(sql) } catch { throw ScenarioError("the floor's statement failed: \(error)") }
        }

        /// Waits until a notification arrives.
        func awaitNotification() throws {
            while true {
                let received: [(channel: String, payload: String)]
                do { received = try connection.notifications() } catch {
                    throw ScenarioError("the floor's listening connection failed: \(error)")
                }
                if !received.isEmpty { return }
                _ = connection.waitForInput(.seconds(1))
            }
        }
    }

    static func createTable(_ connection: Connection) throws {
        try connection.execute(
            "CREATE TABLE IF NOT EXISTS floor_item (id bigserial PRIMARY KEY, title text, amount bigint, note text)")
    }

    /// One row inserted and notified in one transaction on one connection, heard on another
    /// that listens: the latency of each, sequentially.
    static func insertNotify(url: String, count: Int) throws -> Latencies {
        let writer = try Connection(url: url)
        let listener = try Connection(url: url)
        try createTable(writer)
        try listener.execute("LISTEN floor_feed")
        var latencies = Latencies()
        for index in 0..<count {
            let start = ContinuousClock.now
            try writer.execute(
                "BEGIN; INSERT INTO floor_item (title, amount, note) VALUES ('f\(index)', \(index), '\(BenchModel.note)'); NOTIFY floor_feed, 'items'; COMMIT"
            )
            try listener.awaitNotification()
            latencies.record(ContinuousClock.now - start)
        }
        return latencies
    }

    /// Rows of the benchmark's shape inserted in transactions of 500 with one NOTIFY each,
    /// from `connections` connections at once: rows per second.
    static func batchedInserts(url: String, rows: Int, connections: Int) throws -> Double {
        try createTable(try Connection(url: url))
        let note = BenchModel.note
        let statements = (0..<connections).map { _ in
            var batch = "BEGIN; INSERT INTO floor_item (title, amount, note) VALUES "
            batch += (0..<500).map { "('b\($0)', \($0), '\(note)')" }.joined(separator: ", ")
            return batch + "; NOTIFY floor_feed, 'items'; COMMIT"
        }
        let perConnection = max(1, rows / connections / 500)
        let all = try (0..<connections).map { _ in try Connection(url: url) }
        let failure = Mutex<(any Error)?>(nil)
        let start = ContinuousClock.now
        DispatchQueue.concurrentPerform(iterations: connections) { index in
            do {
                for _ in 0..<perConnection { try all[index].execute(statements[index]) }
            } catch {
                failure.withLock { $0 = error }
            }
        }
        if let error = failure.withLock({ $0 }) { throw error }
        return Double(perConnection * connections * 500) / (ContinuousClock.now - start).seconds
    }
}
