import Foundation
import Synchronization
import TandemClient
import TandemHarness
import TandemLocal
import TandemWire

/// The cost of query listeners, on a server in its own process.
extension Bench {
    // MARK: queries

    /// 10,000 query listeners on one collection, each with its own equality filter
    /// (`owner == "member-N"`, 100 on each of 100 connections), then 1,000 writes one at a
    /// time, each matching one listener: from sending a write until its listener has it.
    /// Matched by the server's query index, a write costs about the same with 10,000 listeners
    /// as with one; the floor is that one.
    public static func queries(quick: Bool, progress: Progress) async throws -> BenchResult {
        let listeners = quick ? 1000 : 10_000
        let writes = quick ? 100 : 1000
        let wide = try await queryDeliveries(listeners: listeners, writes: writes, progress: progress)
        let single = try await queryDeliveries(listeners: 1, writes: writes, progress: progress)
        let p99 = wide.latencies.milliseconds(at: 99)
        return BenchResult(
            scenario: "queries", metric: "p99", value: p99, unit: "ms",
            goal: "p99 ≤ 50 ms (10,000 query listeners, 1,000 writes)", met: quick ? nil : p99 <= 50,
            details: [
                "p50 ms": wide.latencies.milliseconds(at: 50), "p99 ms": p99, "listeners": Double(listeners),
                "writes": Double(writes), "server CPU per write, µs": wide.cpuPerWrite * 1_000_000,
                "server CPU per write with 1 listener, µs": single.cpuPerWrite * 1_000_000,
            ],
            floor: "the same writes to 1 query listener, p99 ms", floorValue: single.latencies.milliseconds(at: 99),
            floorRatio: single.latencies.milliseconds(at: 99) / p99)
    }

    private static func queryDeliveries(listeners: Int, writes: Int, progress: Progress) async throws -> (
        latencies: Latencies, cpuPerWrite: Double
    ) {
        let folder = try TemporaryDirectory(prefix: "tandem-bench-queries")
        let process = try await ServerProcess(dataDirectory: folder.url, executable: Executable.current)
        defer { process.send(SIGTERM) }
        let items = try CollectionPath("items")
        let owner = try FieldPath("owner")
        let arrivals = Mutex<[String: ContinuousClock.Instant]>([:])
        let current = Atomic<Int>(0)
        var connections: [ServerConnection] = []
        defer { for connection in connections { connection.close() } }
        let perConnection = 100
        for first in stride(from: 0, to: listeners, by: perConnection) {
            let connection = try await ServerConnection.connect(
                to: process.url, clientId: "queries-\(first)", timeout: .seconds(60))
            connections.append(connection)
            for member in first..<min(listeners, first + perConnection) {
                connection.listen(
                    to: items, target: "member-\(member)",
                    query: Query(filters: [.init(owner, .equal, .string("member-\(member)"))])
                ) { event in
                    guard case .snapshot(let snapshot) = event else { return }
                    if snapshot.initial {
                        current.add(1, ordering: .relaxed)
                        return
                    }
                    let now = ContinuousClock.now
                    arrivals.withLock { arrivals in
                        for change in snapshot.changes { arrivals[change.document.id.rawValue] = now }
                    }
                }
            }
            if connections.count % 10 == 0 { progress("queries: \(first + perConnection)/\(listeners) listening") }
        }
        try await poll("every query listener is current") { current.load(ordering: .relaxed) >= listeners }
        let writer = try await ServerConnection.connect(to: process.url, clientId: "writer")
        defer { writer.close() }
        var latencies = Latencies()
        let cpuBefore = try cpuSeconds(of: process.processIdentifier)
        for index in 0..<writes {
            let member = index * 7919 % listeners
            let start = ContinuousClock.now
            guard
                case .ack(let results) = try await writer.write([
                    .create(
                        in: items, fields: ["owner": .string("member-\(member)"), "amount": .int(Int64(index))],
                        idempotencyKey: try ClientName("q\(index)"))
                ])
            else { throw ScenarioError("a write of the queries benchmark was refused") }
            let id = results[0].id.rawValue
            try await poll("write \(index) reaches member-\(member)", interval: .microseconds(100)) {
                arrivals.withLock { $0[id] != nil }
            }
            latencies.record(arrivals.withLock { $0[id]! } - start)
            if (index + 1) % 100 == 0 { progress("queries: \(index + 1)/\(writes) writes to \(listeners) listeners") }
        }
        let cpu = try cpuSeconds(of: process.processIdentifier) - cpuBefore
        return (latencies, cpu / Double(writes))
    }

    // MARK: query-limit

    /// One listener on `orderBy rank limit 20` over 100,000 documents, then 1,000 writes that
    /// each move a document to the top: from sending a write until the listener has its
    /// change. The floor is what the server's first read of the view costs (the whole
    /// collection): each change must cost a small part of it, computed from the view the
    /// server keeps, not by reading the collection again. A second listener, on the same
    /// order without a limit (a view of all 100,000), hears the same moves: its latency is in
    /// the details.
    public static func queryLimit(quick: Bool, progress: Progress) async throws -> BenchResult {
        let documents = quick ? 10_000 : 100_000
        let writes = quick ? 100 : 1000
        let folder = try TemporaryDirectory(prefix: "tandem-bench-query-limit")
        let process = try await ServerProcess(dataDirectory: folder.url, executable: Executable.current)
        defer { process.send(SIGTERM) }
        let items = try CollectionPath("items")
        let writer = try await ServerConnection.connect(to: process.url, clientId: "writer")
        defer { writer.close() }
        var ids: [DocumentID] = []
        for first in stride(from: 0, to: documents, by: 500) {
            let ops = try (first..<min(documents, first + 500)).map { index in
                WriteOp.create(
                    in: items, fields: ["rank": .int(Int64(index)), "title": .string("item \(index)")],
                    idempotencyKey: try ClientName("seed-\(index)"))
            }
            guard case .ack(let results) = try await writer.write(ops, timeout: .seconds(120)) else {
                throw ScenarioError("seeding the query-limit benchmark was refused")
            }
            ids += results.map(\.id)
            if (first + 500) % 20_000 == 0 { progress("query-limit: \(first + 500)/\(documents) documents") }
        }

        let listener = try await ServerConnection.connect(to: process.url, clientId: "listener")
        defer { listener.close() }
        let arrivals = Mutex<[String: ContinuousClock.Instant]>([:])
        let wholeArrivals = Mutex<[String: ContinuousClock.Instant]>([:])
        let wholeLoaded = Atomic<Bool>(false)
        let loaded = Mutex<ContinuousClock.Instant?>(nil)
        let cpuBeforeLoad = try cpuSeconds(of: process.processIdentifier)
        let loadStart = ContinuousClock.now
        listener.listen(
            to: items, query: Query(orderBy: [.init(try FieldPath("rank"))], limit: 20)
        ) { event in
            guard case .snapshot(let snapshot) = event else { return }
            let now = ContinuousClock.now
            if snapshot.initial && !snapshot.hasMore { return loaded.withLock { $0 = now } }
            arrivals.withLock { arrivals in
                // A document moved twice is already in the view: modified, not added.
                for change in snapshot.changes where change.kind != .removed {
                    arrivals[change.document.id.rawValue] = now
                }
            }
        }
        try await poll("the view is loaded") { loaded.withLock { $0 != nil } }
        let load = loaded.withLock { $0! } - loadStart
        let loadCPU = try cpuSeconds(of: process.processIdentifier) - cpuBeforeLoad
        let whole = try await ServerConnection.connect(to: process.url, clientId: "whole")
        defer { whole.close() }
        whole.listen(to: items, query: Query(orderBy: [.init(try FieldPath("rank"))])) { event in
            guard case .snapshot(let snapshot) = event else { return }
            let now = ContinuousClock.now
            if snapshot.initial {
                if !snapshot.hasMore { wholeLoaded.store(true, ordering: .releasing) }
                return
            }
            wholeArrivals.withLock { arrivals in
                for change in snapshot.changes { arrivals[change.document.id.rawValue] = now }
            }
        }
        try await poll("the whole view is loaded") { wholeLoaded.load(ordering: .acquiring) }
        progress("query-limit: the first view read \(documents) documents in \(Int(load.seconds * 1000)) ms")

        var latencies = Latencies()
        var wholeLatencies = Latencies()
        let cpuBefore = try cpuSeconds(of: process.processIdentifier)
        var random = SeededGenerator(seed: 20)
        for index in 0..<writes {
            // A document from below the view comes to its top; the 20th is pushed out.
            let id = ids[Int.random(in: 20..<documents, using: &random)]
            let start = ContinuousClock.now
            guard
                case .ack = try await writer.write([
                    .update(
                        in: items, id: id,
                        fields: ["rank": .int(Int64(-1 - index)), "title": .string("moved \(index)")],
                        baseVersion: nil, idempotencyKey: try ClientName("move-\(index)"))
                ])
            else { throw ScenarioError("a write of the query-limit benchmark was refused") }
            try await poll("move \(index) reaches the view", interval: .microseconds(100)) {
                arrivals.withLock { $0[id.rawValue] != nil }
            }
            latencies.record(arrivals.withLock { $0.removeValue(forKey: id.rawValue)! } - start)
            try await poll("move \(index) reaches the whole view", interval: .microseconds(100)) {
                wholeArrivals.withLock { $0[id.rawValue] != nil }
            }
            wholeLatencies.record(wholeArrivals.withLock { $0.removeValue(forKey: id.rawValue)! } - start)
            if (index + 1) % 100 == 0 { progress("query-limit: \(index + 1)/\(writes) moves delivered") }
        }
        let cpuPerWrite = (try cpuSeconds(of: process.processIdentifier) - cpuBefore) / Double(writes)
        let p99 = latencies.milliseconds(at: 99)
        return BenchResult(
            scenario: "query-limit", metric: "p99", value: p99, unit: "ms",
            goal: "each change from the kept view, not a new read of the collection",
            met: quick ? nil : cpuPerWrite < loadCPU / 100,
            details: [
                "p50 ms": latencies.milliseconds(at: 50), "p99 ms": p99, "documents": Double(documents),
                "writes": Double(writes), "server CPU per write (both views), µs": cpuPerWrite * 1_000_000,
                "first view, ms": load.seconds * 1000, "first view server CPU, ms": loadCPU * 1000,
                "whole view (no limit) p99 ms": wholeLatencies.milliseconds(at: 99),
            ],
            floor: "the first read of the view (the whole collection), server CPU ms", floorValue: loadCPU * 1000,
            floorRatio: loadCPU / max(cpuPerWrite, 1e-9))
    }
}
