import Foundation
import Synchronization
import TandemClient
import TandemHarness
import TandemLocal
import TandemWire

/// The scenarios whose server runs as `tandem serve` in a process of its own: the server's
/// CPU is then its own to count, and each process has its own open-files limit (10,000
/// listeners need 10,000 descriptors on each side).
extension Bench {
    // MARK: server

    /// The server alone, driven by plain protocol connections instead of the sync engine: a
    /// writer sends creates in writes of 100, eight writes in flight; one listener hears them.
    /// Documents per second, acknowledged and delivered.
    public static func serverAlone(quick: Bool, progress: Progress) async throws -> BenchResult {
        let count = quick ? 10_000 : 100_000
        let perWrite = 100
        let inFlight = 8
        let folder = try TemporaryDirectory(prefix: "tandem-bench-server")
        let process = try await ServerProcess(dataDirectory: folder.url, executable: Executable.current)
        defer { process.send(SIGTERM) }
        let items = try CollectionPath("items")

        let delivered = Atomic<Int>(0)
        let listening = Atomic<Bool>(false)
        let listener = try await ServerConnection.connect(to: process.url, clientId: "listener")
        defer { listener.close() }
        listener.listen(to: items) { event in
            guard case .snapshot(let snapshot) = event else { return }
            if snapshot.initial { listening.store(true, ordering: .releasing) }
            delivered.add(snapshot.changes.count, ordering: .relaxed)
        }
        try await poll("the listener is current") { listening.load(ordering: .acquiring) }
        let writer = try await ServerConnection.connect(to: process.url, clientId: "writer")
        defer { writer.close() }
        // The writes, built before the clock starts: the client's own costs are not the
        // server's.
        let writes = try stride(from: 0, to: count, by: perWrite).map { first in
            try (first..<min(count, first + perWrite)).map { index in
                WriteOp.create(
                    in: items, fields: BenchModel.fields(index),
                    idempotencyKey: try ClientName("w" + String(index + 10_000_000)))
            }
        }

        let cpuBefore = try cpuSeconds(of: process.processIdentifier)
        let start = ContinuousClock.now
        var acknowledged = 0
        try await withThrowingTaskGroup(of: Int.self) { group in
            var next = 0
            func send() {
                let ops = writes[next]
                next += 1
                group.addTask {
                    guard case .ack(let results) = try await writer.write(ops, timeout: .seconds(120)) else {
                        throw ScenarioError("a write of the server benchmark met a conflict")
                    }
                    return results.count
                }
            }
            while next < min(inFlight, writes.count) { send() }
            while let done = try await group.next() {
                acknowledged += done
                if next < writes.count { send() }
                if acknowledged % 10_000 == 0 { progress("server: \(acknowledged)/\(count) documents acknowledged") }
            }
        }
        let acknowledgedAfter = ContinuousClock.now - start
        try await poll("the listener has every document", interval: .milliseconds(1)) {
            delivered.load(ordering: .relaxed) >= count
        }
        let elapsed = ContinuousClock.now - start
        let serverCPU = try cpuSeconds(of: process.processIdentifier) - cpuBefore
        let rate = Double(count) / elapsed.seconds
        let sqlite = try Floors.sqliteInserts(rows: count)
        return BenchResult(
            scenario: "server", metric: "documents/s", value: rate, unit: "docs/s",
            goal: "≥ 40,000 docs/s (writes of 100, acknowledged and delivered)", met: quick ? nil : rate >= 40_000,
            details: [
                "documents": Double(count), "seconds": elapsed.seconds,
                "all acknowledged, s": acknowledgedAfter.seconds, "server CPU, s": serverCPU,
                "server CPU per document, µs": serverCPU / Double(count) * 1_000_000,
            ],
            floor: "raw SQLite inserts, rows/s", floorValue: sqlite, floorRatio: rate / sqlite)
    }

    // MARK: fanout-10k

    /// As ``fanout(quick:progress:)``, at 10,000 listener connections, to a server in its own
    /// process.
    public static func wideFanout(quick: Bool, progress: @escaping Progress) async throws -> BenchResult {
        let listeners = quick ? 1000 : 10_000
        let writes = quick ? 10 : 50
        raiseOpenFilesLimit()
        let folder = try TemporaryDirectory(prefix: "tandem-bench-fanout")
        let process = try await ServerProcess(dataDirectory: folder.url, executable: Executable.current)
        defer { process.send(SIGTERM) }
        let latencies = try await fanoutLatencies(
            url: process.url, listeners: listeners, writes: writes, scenario: "fanout-10k", swarm: true,
            progress: progress)
        // Its 10,000 connections gone before the floor is measured on the same cores.
        await process.kill(SIGTERM)
        let p99 = latencies.milliseconds(at: 99)
        let p50 = latencies.milliseconds(at: 50)
        let echo = try await onOwnThread { try Floors.echo(messages: quick ? 20_000 : 100_000) }
        let deliveriesPerSecond = Double(listeners) / (p50 / 1000)
        return BenchResult(
            scenario: "fanout-10k", metric: "p99", value: p99, unit: "ms", goal: "p99 ≤ 250 ms (10,000 listeners)",
            met: quick ? nil : p99 <= 250,
            details: [
                "p50 ms": p50, "p99 ms": p99, "listeners": Double(listeners), "writes": Double(writes),
                "deliveries/s at p50": deliveriesPerSecond,
            ],
            floor: "raw libwebsockets echo, messages/s", floorValue: echo.perSecond,
            floorRatio: deliveriesPerSecond / echo.perSecond)
    }

    /// Opens `listeners` connections listening on one collection, then writes one document at
    /// a time; for each, the time from sending the write until the last listener has it.
    ///
    /// The listeners are Tandem's `ServerConnection`s, or with `swarm` raw connections on one
    /// `epoll` loop (``ListenerSwarm``), for counts at which one process's client machinery,
    /// sharing the cores with the server, would be what is measured.
    static func fanoutLatencies(
        url: String, listeners: Int, writes: Int, scenario: String, swarm: Bool = false,
        transport: (any WebSocketTransport)? = nil, progress: @escaping Progress
    ) async throws -> Latencies {
        let items = try CollectionPath("items")
        /// Arrivals per document, in shards by listener: thousands of listeners' queues
        /// recording into one lock spend more time waiting for it than the server takes.
        final class Tally: Sendable {
            final class Shard: Sendable {
                let arrivals = Mutex<[String: (count: Int, last: ContinuousClock.Instant)]>([:])
            }
            let shards = (0..<16).map { _ in Shard() }
            let current = Atomic<Int>(0)
            /// Arrivals so far, of every document; `allArrived` is signalled when they reach
            /// `awaited`.
            let delivered = Atomic<Int>(0)
            let awaited = Atomic<Int>(0)
            let allArrived = DispatchSemaphore(value: 0)

            func record(_ id: String, by listener: Int, at now: ContinuousClock.Instant) {
                shards[listener % shards.count].arrivals.withLock { $0[id] = (($0[id]?.count ?? 0) + 1, now) }
                if delivered.add(1, ordering: .sequentiallyConsistent).newValue
                    == awaited.load(ordering: .sequentiallyConsistent)
                {
                    allArrived.signal()
                }
            }

            /// How many listeners have the document, and when the last of them got it.
            func arrivals(of id: String) -> (count: Int, last: ContinuousClock.Instant?) {
                shards.reduce((0, nil)) { total, shard in
                    guard let mine = shard.arrivals.withLock({ $0[id] }) else { return total }
                    return (total.0 + mine.count, max(total.1 ?? mine.last, mine.last))
                }
            }
        }
        let tally = Tally()
        var connections: [ServerConnection] = []
        defer { for connection in connections { connection.close() } }
        // What went wrong on a listener of the swarm, for a write that does not arrive.
        var listenerFailure: @Sendable () -> String? = { nil }
        #if canImport(Glibc)
            var listenerSwarm: ListenerSwarm?
            defer { listenerSwarm?.stop() }
            if swarm {
                let opened = try await onOwnThread {
                    try ListenerSwarm(
                        url: url, count: listeners, collection: items,
                        progress: { progress("\(scenario): \($0)/\(listeners) listeners connected") },
                        arrival: { listener, id, now in tally.record(id, by: listener, at: now) })
                }
                listenerSwarm = opened
                listenerFailure = { opened.error }
                try await poll("every listener is current") {
                    if let error = opened.error { throw ScenarioError(error) }
                    return opened.current >= listeners
                }
            }
        #endif
        // The listeners share a few queues: a queue of its own each would have a thousand
        // connections wake a thousand threads for every write.
        let lanes = (0..<4).map { DispatchQueue(label: "tandem.bench.listeners.\($0)") }
        for first in stride(from: 0, to: swarm ? 0 : listeners, by: 100) {
            // Connected a hundred at a time: one by one, 10,000 handshakes take long.
            let opened = try await withThrowingTaskGroup(of: ServerConnection.self) { group in
                for index in first..<min(listeners, first + 100) {
                    group.addTask {
                        let connection = try await ServerConnection.connect(
                            to: url, clientId: "listener-\(index)", transport: transport, timeout: .seconds(60),
                            queue: lanes[index % lanes.count])
                        connection.listen(to: items) { event in
                            guard case .snapshot(let snapshot) = event else { return }
                            if snapshot.initial {
                                tally.current.add(1, ordering: .relaxed)
                                return
                            }
                            let now = ContinuousClock.now
                            for change in snapshot.changes {
                                tally.record(change.document.id.rawValue, by: index, at: now)
                            }
                        }
                        return connection
                    }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            connections += opened
            progress("\(scenario): \(connections.count)/\(listeners) listeners connected")
        }
        if !swarm {
            try await poll("every listener is current") { tally.current.load(ordering: .relaxed) >= listeners }
        }
        let writer = try await ServerConnection.connect(to: url, clientId: "writer", transport: transport)
        defer { writer.close() }
        // The writes go from a thread of their own, which sleeps until the last arrival wakes
        // it: a loop polling the tally every 100 µs took CPU from the listeners and the server
        // it measured.
        let failure = listenerFailure
        return try await onOwnThread {
            var latencies = Latencies()
            for index in 0..<writes {
                tally.awaited.store(listeners * (index + 1), ordering: .sequentiallyConsistent)
                let start = ContinuousClock.now
                let write = WriteOp.create(
                    in: items, fields: BenchModel.fields(index), idempotencyKey: try ClientName("w\(index)"))
                guard case .ack(let results) = try writer.writeAndWait([write]).get() else {
                    throw ScenarioError("the fan-out write was refused")
                }
                guard tally.allArrived.wait(timeout: .now() + .seconds(60)) == .success else {
                    let cause = failure().map { " (a listener failed: \($0))" } ?? ""
                    throw ScenarioError("write \(index) did not reach every listener within 60 s\(cause)")
                }
                let arrivals = tally.arrivals(of: results[0].id.rawValue)
                guard arrivals.count == listeners, let last = arrivals.last else {
                    throw ScenarioError("write \(index) reached \(arrivals.count) of \(listeners) listeners")
                }
                latencies.record(last - start)
                progress("\(scenario): \(index + 1)/\(writes) writes delivered to \(listeners) listeners")
            }
            return latencies
        }
    }

    /// The user and system CPU time a process has used, in seconds (from /proc).
    static func cpuSeconds(of pid: Int32) throws -> Double {
        let stat = try String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8)
        // The fields after the command name, which is in parentheses and may hold spaces.
        guard let close = stat.lastIndex(of: ")") else { throw ScenarioError("cannot read /proc/\(pid)/stat") }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        // utime and stime are the 14th and 15th fields; the name was the 2nd, the state the 3rd.
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else {
            throw ScenarioError("cannot read the CPU times in /proc/\(pid)/stat")
        }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }
}
