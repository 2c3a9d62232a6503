import Foundation
import GRDB
import Histogram
import Synchronization
import Tandem
import TandemHarness
import TandemLocal
import TandemWire

/// One scenario's outcome, printed in the summary table or as one JSON object.
public struct BenchResult: Encodable {
    public var scenario: String
    /// What the headline figure is ("p50", "docs/s", …).
    public var metric: String
    public var value: Double
    public var unit: String
    public var goal: String
    /// Whether the goal is met; nil when the run was too small to say (`--quick`).
    public var met: Bool?
    /// More figures of the scenario (p99, each table size, …).
    public var details: [String: Double] = [:]
    /// What the scenario is measured against, and its figure.
    public var floor: String?
    public var floorValue: Double?
    /// How close Tandem comes to the floor: Tandem's figure over the floor's (a rate) or the
    /// floor's over Tandem's (a time), so that 1.0 means as fast as the floor.
    public var floorRatio: Double?
}

/// Latencies in microseconds, with percentiles from HdrHistogram.
struct Latencies {
    private var histogram = Histogram<UInt64>(
        highestTrackableValue: 600_000_000, numberOfSignificantValueDigits: .three)

    mutating func record(_ duration: Duration) {
        _ = histogram.record(UInt64(max(1, duration.microseconds)))
    }

    /// The percentile in milliseconds.
    func milliseconds(at percentile: Double) -> Double {
        Double(histogram.valueAtPercentile(percentile)) / 1000
    }

    var count: UInt64 { histogram.totalCount }
}

/// A table of items for the benchmarks: one root collection, rows of about 400 bytes.
enum BenchModel {
    static let tables = [SyncTable.root("item", collection: "items")]

    static let device = DeviceModel(tables: tables) { db in
        try db.execute(
            sql: """
                CREATE TABLE IF NOT EXISTS item (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    title TEXT NOT NULL,
                    amount INTEGER NOT NULL,
                    note TEXT NOT NULL,
                    isShared INTEGER NOT NULL DEFAULT 1
                )
                """)
    }

    /// A note that makes the document about 400 bytes.
    static let note = String(repeating: "lorem ipsum dolor sit amet ", count: 12)

    static func fields(_ index: Int) -> JSONObject {
        ["title": .string("item \(index)"), "amount": .int(Int64(index)), "note": .string(note), "updatedAt": .int(0)]
    }

    /// Inserts `count` rows through the app's path (triggers mark them dirty).
    static func insert(_ count: Int, into database: DatabaseQueue) throws {
        try database.write { db in
            let statement = try db.makeStatement(sql: "INSERT INTO item (title, amount, note) VALUES (?, ?, ?)")
            for index in 0..<count {
                try statement.execute(arguments: ["item \(index)", index, note])
            }
        }
    }

    static func count(_ database: DatabaseQueue) throws -> Int {
        try database.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM item") ?? 0 }
    }

    /// How many rows arrived, cheaply enough to ask every few milliseconds: the benchmarks'
    /// receiving devices only insert, so the largest id counts the rows (COUNT(*) would read
    /// the whole table each time and slow the device it measures).
    ///
    /// These polls read without GRDB's `read`: on a `DatabaseQueue`, `read` sets
    /// `PRAGMA query_only` on and off, and SQLite then expires every prepared statement of the
    /// connection, so each poll would make the sync engine compile all its statements again
    /// (4 % of the CPU of the throughput run). The harness's polls are not what it measures.
    static func arrived(_ database: DatabaseQueue) throws -> Int {
        try database.unsafeRead { db in try Int.fetchOne(db, sql: "SELECT MAX(id) FROM item") ?? 0 }
    }

    static func anyDirty(_ database: DatabaseQueue) throws -> Bool {
        try database.unsafeRead { db in
            try Bool.fetchOne(db, sql: "SELECT EXISTS (SELECT 1 FROM item WHERE isDirty = 1)") ?? false
        }
    }

    /// Checks, after the clock stopped, that every row arrived once.
    static func verify(_ database: DatabaseQueue, has expected: Int) throws {
        let count = try count(database)
        guard count == expected else {
            throw ScenarioError("the benchmark's device has \(count) rows, not \(expected): a sync bug, not a slow run")
        }
    }

    /// Puts `count` documents on the server through one protocol connection, in batches.
    static func seed(_ count: Int, url: String, progress: (Int) -> Void) async throws {
        let connection = try await ServerConnection.connect(to: url, clientId: "bench-seeder")
        defer { connection.close() }
        let items = try CollectionPath("items")
        var done = 0
        while done < count {
            let size = min(500, count - done)
            let ops = try (done..<(done + size)).map { index in
                WriteOp.create(in: items, fields: fields(index), idempotencyKey: try ClientName("seed-\(index)"))
            }
            guard case .ack = try await connection.write(ops, timeout: .seconds(120)) else {
                throw ScenarioError("seeding the benchmark's server failed")
            }
            done += size
            progress(done)
        }
    }
}

/// Waits until `check` holds, checking every `interval`.
func poll(
    _ what: String, timeout: Duration = .seconds(300), interval: Duration = .milliseconds(2), _ check: () throws -> Bool
)
    async throws
{
    let deadline = ContinuousClock.now + timeout
    while try !check() {
        if ContinuousClock.now > deadline { throw ScenarioError("benchmark timed out waiting until \(what)") }
        try await Task.sleep(for: interval)
    }
}

/// Lets the process open as many files as the system allows (1,000 connections need more
/// than the usual 1,024 descriptors once the server's are counted).
func raiseOpenFilesLimit() {
    var limit = rlimit()
    guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return }
    limit.rlim_cur = limit.rlim_max
    _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
}

extension Bench {
    /// Waits until the processes a scenario started (its servers, a PostgreSQL cluster) have
    /// exited, at most 30 s, so that the next scenario does not share the machine with their
    /// shutdown: a server closing 10,000 connections takes a core for a while, and the server
    /// scenario after it measured a third less (36,055 against 55,383 docs/s).
    ///
    /// Then it waits, at most 15 s more, until this process itself is quiet (under a tenth of a
    /// core over a quarter of a second): the in-process servers and devices of a scenario stop
    /// without waiting, and their last work (closing connections, checkpoints, freeing a
    /// snapshot's pages) ran into the next scenario's measurement.
    public static func settle() async {
        let deadline = ContinuousClock.now + .seconds(30)
        while ContinuousClock.now < deadline, !childProcesses().isEmpty {
            try? await Task.sleep(for: .milliseconds(20))
        }
        let window = Duration.milliseconds(250)
        let quietBy = ContinuousClock.now + .seconds(15)
        while ContinuousClock.now < quietBy {
            guard let before = try? cpuSeconds(of: getpid()) else { return }
            try? await Task.sleep(for: window)
            guard let after = try? cpuSeconds(of: getpid()) else { return }
            if after - before < 0.1 * 0.25 { return }
        }
    }

    /// The ids of this process's children that have not been reaped yet (from /proc).
    static func childProcesses() -> [String] {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
        return tasks.flatMap { task in
            ((try? String(contentsOfFile: "/proc/self/task/\(task)/children", encoding: .utf8)) ?? "")
                .split(separator: " ").map(String.init)
        }
    }
}

/// A device for the benchmarks: pushes at once, logs nothing.
func benchDevice(
    _ name: String, server: LocalServer, model: DeviceModel = BenchModel.device,
    configure: @escaping @Sendable (inout SyncConfiguration) -> Void = { _ in }
) throws -> LocalDevice {
    try LocalDevice(name: name, serverURL: server.url, model: model) { configuration in
        configuration.pushDelay = .zero
        configuration.pushInterval = .seconds(3600)
        configure(&configuration)
    }
}

/// A quiet local server for the benchmarks.
func benchServer() async throws -> LocalServer {
    try await LocalServer(store: .sqlite) { $0.logger.logLevel = .critical }
}
