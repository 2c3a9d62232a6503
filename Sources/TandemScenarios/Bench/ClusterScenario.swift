import Foundation
import Tandem
import TandemHarness
import TandemLocal
import TandemServer
import TandemServerPostgres

extension Bench {
    /// Three nodes over one PostgreSQL database (a throwaway cluster with `fsync` on, or the
    /// database `postgres` names): propagation from a device on node A to a device on node B,
    /// and throughput from three writing devices, one per node, to a device on node A.
    public static func cluster(quick: Bool, postgres: String?, progress: @escaping Progress) async throws -> BenchResult
    {
        progress("cluster: starting PostgreSQL")
        let ownCluster = postgres == nil ? try await PostgresCluster.start(durable: true) : nil
        defer { ownCluster?.stop() }
        let url: String
        if let postgres { url = postgres } else { url = try await onOwnThread { try ownCluster!.createDatabase() } }
        var nodes: [LocalServer] = []
        for _ in 0..<3 {
            nodes.append(
                try await LocalServer(store: .sqlite) { configuration in
                    configuration.storage = .postgres(url: url)
                    configuration.logger.logLevel = .critical
                })
        }
        defer { for node in nodes { node.stopWithoutWaiting() } }

        let count = quick ? 200 : 1000
        let latencies = try await propagationLatencies(
            from: nodes[0], to: nodes[1], count: count, progress: progress
        ).total
        let p50 = latencies.milliseconds(at: 50)
        let p99 = latencies.milliseconds(at: 99)

        // Throughput: each writer holds a third of the rows, in the same collection.
        let total = quick ? 6_000 : 30_000
        let writers = try (0..<3).map { index in try benchDevice("writer-\(index)", server: nodes[index]) }
        let receiver = try benchDevice("receiver", server: nodes[0])
        receiver.service.start()
        try await poll("the receiver is connected") { receiver.service.status.isConnected }
        for writer in writers { try BenchModel.insert(total / 3, into: writer.database) }
        let start = ContinuousClock.now
        for writer in writers { writer.service.start() }
        // The receiver also gets the propagation run's documents, before the clock matters.
        let expected = count + total
        try await poll("the receiver has every row", interval: .milliseconds(10)) {
            let have = try BenchModel.arrived(receiver.database)
            progress("cluster: \(have)/\(expected) documents on the receiver")
            return have >= expected
        }
        let elapsed = ContinuousClock.now - start
        try BenchModel.verify(receiver.database, has: expected)
        for device in writers + [receiver] { await device.service.stop() }
        let rate = Double(total) / elapsed.seconds

        progress("cluster: floors")
        let floor = try PostgresFloors.insertNotify(url: url, count: quick ? 200 : 1000)
        let floorP50 = floor.milliseconds(at: 50)
        let floorRate = try await onOwnThread {
            try PostgresFloors.batchedInserts(url: url, rows: total, connections: 3)
        }
        return BenchResult(
            scenario: "cluster", metric: "p99", value: p99, unit: "ms",
            goal: "propagation A→B p99 ≤ 20 ms; ≥ 20,000 docs/s through 3 nodes",
            met: quick ? nil : p99 <= 20 && rate >= 20_000,
            details: [
                "propagation p50 ms": p50, "propagation p99 ms": p99, "documents/s": rate, "documents": Double(total),
                "floor INSERT+NOTIFY heard p99 ms": floor.milliseconds(at: 99),
                "floor rows/s (3 connections, 500 per transaction)": floorRate,
            ],
            floor: "raw libpq INSERT; NOTIFY heard on another connection, p50 ms", floorValue: floorP50,
            floorRatio: floorP50 / p50)
    }
}
