import Foundation
import GRDB
import Synchronization
import TandemHarness
import TandemLocal
@_spi(Testing) import Tandem
import TandemServer
import TandemSocket
import TandemWire

/// The benchmark scenarios. Each runs on loopback with a real server and real clients, each
/// client with its own SQLite file, and measures its floor in the same run.
public enum Bench {
    /// Called with a line saying how far a scenario has come.
    public typealias Progress = @Sendable (String) -> Void

    // MARK: propagation

    /// Device A writes documents one at a time (push delay 0); the time from A's local commit
    /// to B's local commit of the same document.
    public static func propagation(quick: Bool, progress: @escaping Progress) async throws -> BenchResult {
        let count = quick ? 200 : 1000
        let server = try await benchServer()
        defer { server.stopWithoutWaiting() }
        let propagation = try await propagationLatencies(from: server, to: server, count: count, progress: progress)
        let latencies = propagation.total
        let echo = try await onOwnThread { try Floors.echo(messages: quick ? 20_000 : 100_000) }
        let p50 = latencies.milliseconds(at: 50)
        let p99 = latencies.milliseconds(at: 99)
        let echoP50 = echo.roundTrip.milliseconds(at: 50)
        return BenchResult(
            scenario: "propagation", metric: "p50", value: p50, unit: "ms", goal: "p50 ≤ 1 ms, p99 ≤ 5 ms",
            met: p50 <= 1 && p99 <= 5,
            details: ["p50 ms": p50, "p99 ms": p99, "documents": Double(count)].merging(
                propagation.stageDetails
            ) { first, _ in first },
            floor: "raw libwebsockets echo round trip, p50 ms", floorValue: echoP50, floorRatio: echoP50 / p50)
    }

    /// Device A on `serverA` writes documents one at a time; for each, the time from A's local
    /// commit to B's (on `serverB`) local commit of it, and the stages of that time.
    ///
    /// The writes run on a thread of their own that sleeps until B's apply hook signals: a
    /// loop polling for the arrival would take CPU from the devices and servers it measures.
    static func propagationLatencies(
        from serverA: LocalServer, to serverB: LocalServer, count: Int, transport: (any WebSocketTransport)? = nil,
        progress: @escaping Progress
    ) async throws -> Propagation {
        /// When each stage of a document was reached, by its title.
        let marks = Mutex<[String: [Propagation.Stage: ContinuousClock.Instant]]>([:])
        @Sendable func mark(_ stage: Propagation.Stage, _ titles: some Sequence<String>) {
            let now = ContinuousClock.now
            marks.withLock { marks in for title in titles { marks[title, default: [:]][stage] = now } }
        }
        let arrived = DispatchSemaphore(value: 0)
        let a = try benchDevice("a", server: serverA) { configuration in
            if let transport { configuration.transport = transport }
            configuration.hooks.beforeSend = { ops in
                mark(.sent, ops.compactMap { $0.fields?["title"]?.stringValue })
            }
        }
        let b = try benchDevice("b", server: serverB) { configuration in
            if let transport { configuration.transport = transport }
            configuration.hooks.snapshotReceived = { snapshot in
                mark(.received, snapshot.changes.compactMap { $0.document.fields["title"]?.stringValue })
            }
            configuration.hooks.afterApply = { snapshot in
                mark(.applied, snapshot.changes.compactMap { $0.document.fields["title"]?.stringValue })
                arrived.signal()
            }
        }
        a.service.start()
        b.service.start()
        try await poll("b is connected") { b.service.status.isConnected && a.service.status.isConnected }
        try await Task.sleep(for: .milliseconds(200))

        let propagation = try await onOwnThread {
            var propagation = Propagation()
            let cpuAtStart = try cpuSeconds(of: getpid())
            for index in 0..<count {
                let title = "p\(index)"
                try a.database.write { db in
                    try db.execute(
                        sql: "INSERT INTO item (title, amount, note) VALUES (?, ?, ?)",
                        arguments: [title, index, BenchModel.note])
                }
                mark(.committed, [title])
                while marks.withLock({ $0[title]?[.applied] }) == nil {
                    guard arrived.wait(timeout: .now() + .seconds(60)) == .success else {
                        throw ScenarioError("b did not get \(title) within 60 s")
                    }
                }
                propagation.record(marks.withLock { $0.removeValue(forKey: title)! })
                if index % 50 == 0 { progress("propagation: \(index)/\(count) documents") }
            }
            propagation.cpuPerDocument = (try cpuSeconds(of: getpid()) - cpuAtStart) / Double(count)
            return propagation
        }
        await a.service.stop()
        await b.service.stop()
        return propagation
    }

    /// Propagation latencies, whole and by stage.
    struct Propagation {
        enum Stage {
            case committed, sent, received, applied
        }

        /// A's commit to B's commit.
        var total = Latencies()
        /// A's commit to its push leaving.
        var push = Latencies()
        /// The push leaving A to B receiving the change: both sockets, and the server with its
        /// sync to disk.
        var server = Latencies()
        /// B receiving the change to its commit.
        var apply = Latencies()
        /// The process's CPU time (devices and server) per document, in seconds: the work,
        /// which moves only with the code, beside the latency, which moves with the machine.
        var cpuPerDocument = 0.0

        mutating func record(_ marks: [Stage: ContinuousClock.Instant]) {
            total.record(marks[.applied]! - marks[.committed]!)
            // A push can leave before the commit's mark is taken (the observer is quick).
            guard let sent = marks[.sent], let received = marks[.received] else { return }
            push.record(max(.zero, sent - marks[.committed]!))
            server.record(received - sent)
            apply.record(marks[.applied]! - received)
        }

        /// The stages' medians, for a result's details.
        var stageDetails: [String: Double] {
            [
                "stage p50 ms: A commit → push sent": push.milliseconds(at: 50),
                "stage p50 ms: push sent → B received": server.milliseconds(at: 50),
                "stage p50 ms: B received → applied": apply.milliseconds(at: 50),
                "CPU per document, µs": cpuPerDocument * 1e6,
            ]
        }
    }

    // MARK: throughput

    /// Device A holds dirty rows of about 400 bytes; the time until B has them all in SQLite.
    public static func throughput(quick: Bool, progress: Progress) async throws -> BenchResult {
        let count = quick ? 10_000 : 100_000
        let run = try await throughputRun(count: count, progress: progress)
        let sqlite = try Floors.sqliteInserts(rows: count)
        let json = try Floors.json(documents: count)
        return BenchResult(
            scenario: "throughput", metric: "documents/s", value: run.rate, unit: "docs/s", goal: "≥ 50,000 docs/s",
            met: quick ? nil : run.rate >= 50_000,
            details: run.details.merging(["json encode+decode docs/s": json]) { first, _ in first },
            floor: "raw SQLite inserts, rows/s", floorValue: sqlite, floorRatio: run.rate / sqlite)
    }

    /// One throughput run: A's rows pushed, B has them all.
    static func throughputRun(count: Int, transport: (any WebSocketTransport)? = nil, progress: Progress)
        async throws -> (rate: Double, cpuPerDocument: Double, details: [String: Double])
    {
        let server = try await benchServer()
        defer { server.stopWithoutWaiting() }
        // What A's listener downloads: the others' writes, none of its own.
        let downloaded = Atomic<Int>(0)
        let a = try benchDevice("a", server: server) { configuration in
            if let transport { configuration.transport = transport }
            configuration.hooks.snapshotReceived = { downloaded.add($0.changes.count, ordering: .relaxed) }
        }
        let b = try benchDevice("b", server: server) { configuration in
            if let transport { configuration.transport = transport }
        }
        b.service.start()
        try await poll("b is connected") { b.service.status.isConnected }
        try BenchModel.insert(count, into: a.database)

        let start = ContinuousClock.now
        // The work per document, beside the rate: on a shared machine the rate moves with what
        // else runs, the work only with the code.
        let cpuAtStart = try cpuSeconds(of: getpid())
        a.service.start()
        var pushed: Duration?
        try await poll("b has every row", interval: .milliseconds(10)) {
            if pushed == nil, try !BenchModel.anyDirty(a.database) { pushed = ContinuousClock.now - start }
            let have = try BenchModel.arrived(b.database)
            progress("throughput: \(have)/\(count) documents on B")
            return have == count
        }
        let elapsed = ContinuousClock.now - start
        let cpu = try cpuSeconds(of: getpid()) - cpuAtStart
        try BenchModel.verify(b.database, has: count)
        await a.service.stop()
        await b.service.stop()
        let rate = Double(count) / elapsed.seconds
        return (
            rate, cpu / Double(count),
            [
                "seconds": elapsed.seconds, "documents": Double(count),
                "A pushed every row, s": (pushed ?? elapsed).seconds,
                "documents A downloaded": Double(downloaded.load(ordering: .relaxed)),
                "CPU µs per document (A, server and B)": cpu * 1e6 / Double(count),
                // The rate is the cores kept busy over the work per document: at 40 µs a
                // document, 50,000 docs/s needs two cores busy all the time.
                "cores busy": cpu / elapsed.seconds,
                "cores": Double(ProcessInfo.processInfo.activeProcessorCount),
            ]
        )
    }

    // MARK: snapshot

    /// The server holds documents; a fresh client listens and stores them all.
    public static func snapshot(quick: Bool, progress: Progress) async throws -> BenchResult {
        let count = quick ? 10_000 : 100_000
        let server = try await benchServer()
        defer { server.stopWithoutWaiting() }
        try await BenchModel.seed(count, url: server.url) { done in progress("snapshot: seeding \(done)/\(count)")
        }
        let fresh = try benchDevice("fresh", server: server)
        let start = ContinuousClock.now
        fresh.service.start()
        try await poll("the fresh client stored every document", interval: .milliseconds(5)) {
            let have = try BenchModel.arrived(fresh.database)
            progress("snapshot: \(have)/\(count) documents stored")
            return have == count
        }
        let elapsed = ContinuousClock.now - start
        try BenchModel.verify(fresh.database, has: count)
        await fresh.service.stop()
        let sqlite = try Floors.sqliteInserts(rows: count)
        let floorSeconds = Double(count) / sqlite
        return BenchResult(
            scenario: "snapshot", metric: "seconds", value: elapsed.seconds, unit: "s",
            goal: "≤ 2 s for 100,000 documents", met: quick ? nil : elapsed.seconds <= 2,
            details: ["documents": Double(count), "documents/s": Double(count) / elapsed.seconds],
            floor: "raw SQLite inserts of the same rows, s", floorValue: floorSeconds,
            floorRatio: floorSeconds / elapsed.seconds)
    }

    // MARK: fanout

    /// Listener connections on one collection; writes one at a time; for each write, the time
    /// until the last listener has it.
    public static func fanout(quick: Bool, progress: @escaping Progress) async throws -> BenchResult {
        let listeners = quick ? 100 : 1000
        let writes = quick ? 20 : 100
        raiseOpenFilesLimit()
        let server = try await benchServer()
        defer { server.stopWithoutWaiting() }
        let latencies = try await fanoutLatencies(
            url: server.url, listeners: listeners, writes: writes, scenario: "fanout", progress: progress)
        let echo = try await onOwnThread { try Floors.echo(messages: quick ? 20_000 : 100_000) }
        let p99 = latencies.milliseconds(at: 99)
        let deliveriesPerSecond = Double(listeners) / (latencies.milliseconds(at: 50) / 1000)
        return BenchResult(
            scenario: "fanout", metric: "p99", value: p99, unit: "ms", goal: "p99 ≤ 50 ms (1,000 listeners)",
            met: quick ? nil : p99 <= 50,
            details: [
                "p50 ms": latencies.milliseconds(at: 50), "p99 ms": p99, "listeners": Double(listeners),
                "deliveries/s at p50": deliveriesPerSecond,
            ],
            floor: "raw libwebsockets echo, messages/s", floorValue: echo.perSecond,
            floorRatio: deliveriesPerSecond / echo.perSecond)
    }

    // MARK: apply

    /// A client with many local rows applies a one-document change: the time of that apply
    /// (finding the row by server id, writing it, storing the resume token), at three sizes.
    public static func apply(quick: Bool, progress: Progress) async throws -> BenchResult {
        let sizes = quick ? [1000, 10_000] : [1000, 10_000, 100_000]
        var medians: [String: Double] = [:]
        for size in sizes {
            let server = try await benchServer()
            try await BenchModel.seed(size, url: server.url) { done in progress("apply: seeding \(done)/\(size)") }
            let durations = Mutex<[Duration]>([])
            let began = Mutex<ContinuousClock.Instant?>(nil)
            let device = try benchDevice("applier", server: server) { configuration in
                configuration.hooks.beforeApply = { snapshot in
                    if !snapshot.initial { began.withLock { $0 = ContinuousClock.now } }
                }
                configuration.hooks.afterApply = { snapshot in
                    guard !snapshot.initial, let start = began.withLock({ $0 }) else { return }
                    let elapsed = ContinuousClock.now - start
                    durations.withLock { $0.append(elapsed) }
                }
            }
            device.service.start()
            try await poll("the client has \(size) rows", interval: .milliseconds(10)) {
                try BenchModel.arrived(device.database) == size
            }
            let writer = try await ServerConnection.connect(to: server.url, clientId: "writer")
            let documents = try await server.server.documents(in: try CollectionPath("items"))
            let changes = quick ? 100 : 200
            for index in 0..<changes {
                let document = documents[(index * 7919) % documents.count]
                var fields = document.fields
                fields["amount"] = .int(Int64(-index))
                _ = try await writer.write([
                    .update(
                        in: try CollectionPath("items"), id: document.id, fields: fields, baseVersion: nil,
                        idempotencyKey: try ClientName("change-\(index)"))
                ])
                try await poll("the change was applied", interval: .microseconds(100)) {
                    durations.withLock { $0.count } > index
                }
            }
            let sorted = durations.withLock { $0 }.sorted()
            medians["\(size) rows, median ms"] = Double(sorted[sorted.count / 2].microseconds) / 1000
            progress("apply: \(size) rows done")
            writer.close()
            await device.service.stop()
            await server.stop()
        }
        let largest = medians["\(sizes.last!) rows, median ms"]!
        let smallest = medians["\(sizes.first!) rows, median ms"]!
        medians["growth, largest over smallest"] = largest / smallest
        progress("apply: measuring the floor")
        let floor = try Floors.indexedUpdate(rows: sizes.last!, changes: 200)
        return BenchResult(
            scenario: "apply", metric: "median at \(sizes.last!) rows", value: largest, unit: "ms",
            goal: "median ≤ 1 ms, flat from 1k to 100k rows", met: quick ? nil : largest <= 1 && largest / smallest < 2,
            details: medians, floor: "raw SQLite indexed update + commit, median ms", floorValue: floor,
            floorRatio: floor / largest)
    }

    // MARK: connections

    /// Idle listener connections to a server in its own process: the server's memory per
    /// connection, beside a raw libwebsockets echo server holding as many idle connections.
    public static func connections(quick: Bool, progress: Progress) async throws -> BenchResult {
        let count = quick ? 200 : 1000
        raiseOpenFilesLimit()
        let executable = Executable.current
        let folder = try TemporaryDirectory(prefix: "tandem-bench-connections")
        let process = try await ServerProcess(dataDirectory: folder.url, executable: executable)
        defer { process.send(SIGTERM) }
        let tandem = try await memoryPerConnection(of: process, count: count, progress: progress) { index in
            let connection = try await ServerConnection.connect(to: process.url, clientId: "idle-\(index)")
            let listening = Atomic<Bool>(false)
            connection.listen(to: try CollectionPath("idle")) { event in
                if case .snapshot(let snapshot) = event, snapshot.initial {
                    listening.store(true, ordering: .releasing)
                }
            }
            try await poll("connection \(index) listens") { listening.load(ordering: .acquiring) }
            return { connection.close() }
        }

        let echo = try await ServerProcess(arguments: ["echo-server", "--port", "0"], executable: executable)
        defer { echo.send(SIGTERM) }
        let client = try WebSocketClient()
        let floor: (perConnection: Double, before: Int, after: Int)
        do {
            floor = try await memoryPerConnection(of: echo, count: count, progress: progress) { _ in
                let socket = try client.connect(to: echo.url + "/", delegate: Floors.Echo())
                try await poll("the raw connection opens") { socket.isOpen }
                return { socket.close() }
            }
        } catch {
            await client.shutdown()
            throw error
        }
        await client.shutdown()
        return BenchResult(
            scenario: "connections", metric: "server memory per connection", value: tandem.perConnection, unit: "KB",
            goal: "≤ 60 KB per connection (1,000 idle listeners)", met: quick ? nil : tandem.perConnection <= 60,
            details: [
                "connections": Double(count), "server RSS before KB": Double(tandem.before),
                "server RSS after KB": Double(tandem.after),
            ],
            floor: "raw libwebsockets server, KB per idle connection", floorValue: floor.perConnection,
            floorRatio: floor.perConnection / tandem.perConnection)
    }

    /// Opens `count` connections with `open` (which returns how to close one), then reads the
    /// server process's resident memory.
    private static func memoryPerConnection(
        of process: ServerProcess, count: Int, progress: Progress,
        open: (Int) async throws -> () -> Void
    ) async throws -> (perConnection: Double, before: Int, after: Int) {
        try await Task.sleep(for: .milliseconds(300))
        let before = try residentKilobytes(of: process.processIdentifier)
        var closers: [() -> Void] = []
        for index in 0..<count {
            closers.append(try await open(index))
            if index % 100 == 0 { progress("connections: \(index)/\(count) open to \(process.arguments[0])") }
        }
        try await Task.sleep(for: .milliseconds(500))
        let after = try residentKilobytes(of: process.processIdentifier)
        for close in closers { close() }
        return (Double(after - before) / Double(count), before, after)
    }

    private static func residentKilobytes(of pid: Int32) throws -> Int {
        let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
        guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
            let kilobytes = Int(line.split(separator: " ").dropFirst().first ?? "")
        else { throw ScenarioError("cannot read the server's memory from /proc/\(pid)/status") }
        return kilobytes
    }
}
