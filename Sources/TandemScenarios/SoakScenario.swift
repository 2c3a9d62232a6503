import Foundation
import GRDB
import Synchronization
import TandemHarness
import TandemLocal
@_spi(Testing) import Tandem
import TandemServer
import TandemServerPostgres
import TandemWire

/// The soak: `tandem serve` as a child process and several devices writing at random (the
/// demo's cash-flow book), while devices lose their connections, the server is killed with
/// SIGKILL and started again, and the server loses acknowledgements on purpose. At the end
/// every promise is checked: every device equals the server, no acknowledged write is lost,
/// no document is stored twice, no delete comes back, and no device ever went back to an
/// older version of a document it had written.
///
/// `tandem soak` runs it; the test suite runs a short one.
public enum SoakScenario {
    public static func run(
        _ options: SoakOptions, progress: @escaping @Sendable (String) -> Void = { _ in }
    ) async throws -> SoakResult {
        let started = ContinuousClock.now
        var random = SeededGenerator(seed: options.seed)
        let folder = try TemporaryDirectory(prefix: "tandem-soak")
        let servers = try await SoakServers.start(options, folder: folder, progress: progress)
        defer { servers.stop() }

        let ledger = Ledger()
        let urls = servers.nodes.map(\.url)
        let devices = try (1...options.devices).map { index in
            let name = "device-\(index)"
            let database = Mutex<DatabaseQueue?>(nil)
            // Spread over the nodes; each may fail over to the others.
            let first = (index - 1) % urls.count
            // In the soak's folder, which a failed run keeps.
            let place = try TemporaryDirectory(borrowing: folder.url.appendingPathComponent(name))
            let device = try LocalDevice(name: name, serverURL: urls[first], folder: place) { configuration in
                configuration.serverURLs = Array(urls[(first + 1)...] + urls[..<first])
                configuration.pushDelay = .milliseconds(2)
                configuration.pushInterval = .seconds(1)
                configuration.reconnectDelay = .milliseconds(50)
                configuration.maxReconnectDelay = .milliseconds(400)
                configuration.requestTimeout = .seconds(5)
                // Servers go away for a while on purpose: rows must not fail for that.
                configuration.maxAttempts = 10_000
                configuration.hooks.afterWriteBack = { ops, results in
                    ledger.acknowledged(by: name, ops, results)
                }
                configuration.hooks.snapshotReceived = { snapshot in
                    ledger.note(name, snapshot, "received")
                }
                configuration.hooks.afterApply = { snapshot in
                    ledger.note(name, snapshot, "applied")
                    guard let database = database.withLock({ $0 }) else { return }
                    ledger.checkReadYourWrites(name, snapshot, database)
                }
            }
            database.withLock { $0 = device.database }
            return device
        }
        for device in devices { device.service.start() }
        do {
            var result = try await run(
                options, servers: servers, devices: devices, ledger: ledger, random: &random, started: started,
                progress: progress)
            if !result.passed {
                folder.keep()
                result.keptFolder = folder.url.path
            }
            return result
        } catch {
            for device in devices { await device.service.stop() }
            throw error
        }
    }

    /// Whether a collection is one the soak's devices sync (the demo's book: `accounts` and
    /// each account's `entries`). A database given by URL may hold others, written by other
    /// clients through other nodes: no device holds them, and the checks leave them out.
    static func isSoakCollection(_ collection: CollectionPath) -> Bool {
        let segments = collection.rawValue.split(separator: "/")
        return collection.rawValue == "accounts"
            || (segments.count == 3 && segments[0] == "accounts" && segments[2] == "entries")
    }

    private static func run(
        _ options: SoakOptions, servers: SoakServers, devices: [LocalDevice], ledger: Ledger,
        random: inout SeededGenerator, started: ContinuousClock.Instant, progress: @escaping @Sendable (String) -> Void
    ) async throws -> SoakResult {
        progress("opening the book")
        try await devices[0].addAccount("Household")
        try await devices[0].addAccount("Holiday")
        try await waitUntil("every device has the shared accounts", timeout: .seconds(60)) {
            for device in devices where try await DemoScenario.sharedAccounts(device).count < 2 { return false }
            return true
        }

        // The failures, spread evenly over the run: node (or server) kills, PostgreSQL restarts.
        var failures: [Int: SoakServers.Failure] = [:]
        let nodeKills = options.isCluster ? options.nodeRestarts : options.serverRestarts
        for index in 0..<nodeKills {
            failures[(index + 1) * options.operations / (nodeKills + 1)] = .killNode
        }
        for index in 0..<options.postgresRestarts {
            let step = (2 * index + 1) * options.operations / (2 * options.postgresRestarts + 1)
            failures[failures[step] == nil ? step : step + 1] = .restartPostgres
        }
        var counts: [String: Int] = [:]
        var restarts = 0, postgresRestarts = 0
        for step in 0..<options.operations {
            switch failures[step] {
            case .killNode?:
                restarts += 1
                try await servers.killAndRestartNode(
                    restart: restarts, of: nodeKills, random: &random, seed: options.seed, progress: progress)
            case .restartPostgres?:
                postgresRestarts += 1
                progress("restarting PostgreSQL (immediate), \(postgresRestarts) of \(options.postgresRestarts)")
                try await servers.restartPostgres()
            case nil:
                break
            }
            for device in devices where Double.random(in: 0..<1, using: &random) < options.disconnectRate {
                device.service.reconnect()
                counts["disconnect", default: 0] += 1
            }
            let device = devices[Int.random(in: 0..<devices.count, using: &random)]
            let kind = try await DemoScenario.perform(on: device, random: &random)
            counts[kind, default: 0] += 1
            if step % 5 == 4 { try await Task.sleep(for: .milliseconds(2)) }
            if step % 50 == 49 || step == options.operations - 1 {
                let pending = devices.map { $0.service.status.pendingCount }.reduce(0, +)
                progress(
                    "writing: \(step + 1)/\(options.operations) operations, \(restarts) restarts, \(pending) pending")
            }
        }

        progress("syncing until quiet")
        let contents = try servers.contents()
        let report = try await Convergence.waitUntilQuiet(
            server: contents, devices: devices.map { ($0.name, $0.service) },
            visible: { _, collection, _, _ in isSoakCollection(collection) }, timeout: options.quietTimeout,
            progress: { report in
                progress("syncing until quiet: \(report.devices.map(\.pending).reduce(0, +)) pending")
            })
        for device in devices { await device.service.stop() }
        let diagnosis = report.isConverged ? [] : try await diagnose(report, server: contents, devices: devices)
        return try await ledger.verdict(
            report: report, server: contents, devices: devices, options: options, operations: counts,
            restarts: restarts, postgresRestarts: postgresRestarts,
            lostAcksInjected: servers.nodes.map { node in
                node.standardErrorLines.count { $0.contains("injected fault: acknowledgement lost") }
            }.reduce(0, +), elapsed: ContinuousClock.now - started, diagnosis: diagnosis)
    }

    /// What a run that did not converge needs to be understood without running it again: for
    /// the first documents a device misses or holds differently, where they stand in the
    /// server's feed (their sequence, the feed around them, its last sequence and horizon),
    /// every device's resume token for their collection, and what each device heard of them.
    private static func diagnose(_ report: ConvergenceReport, server: any ServerContents, devices: [LocalDevice])
        async throws -> [String]
    {
        var documents: [(CollectionPath, DocumentID)] = []
        for device in report.devices {
            for entry in device.missing + device.different.map({ String($0.prefix { $0 != " " }) }) {
                let parts = entry.split(separator: "/")
                guard parts.count >= 2, let collection = try? CollectionPath(parts.dropLast().joined(separator: "/")),
                    let id = try? DocumentID(String(parts.last!))
                else { continue }
                if !documents.contains(where: { $0 == (collection, id) }) { documents.append((collection, id)) }
            }
        }
        var lines: [String] = []
        for (collection, id) in documents.prefix(3) {
            if let excerpt = try await server.feedExcerpt(of: collection, id: id, around: 3) {
                lines.append("server: \(excerpt)")
            } else {
                lines.append("server: \(collection)/\(id) is not in the store")
            }
            for device in devices {
                let tokens = try await device.database.read { db in
                    try Row.fetchAll(db, sql: "SELECT * FROM tandem_listener").map { row in
                        row.columnNames.map { "\($0)=\(row[$0] ?? "NULL")" }.joined(separator: " ")
                    }
                }
                lines.append("\(device.name) listeners: \(tokens.joined(separator: "; "))")
            }
        }
        return lines
    }
}

/// The soak's servers: one `tandem serve` on SQLite, or several nodes over one PostgreSQL
/// database (the soak's own throwaway cluster, or one given by URL).
final class SoakServers: Sendable {
    enum Failure { case killNode, restartPostgres }

    let nodes: [ServerProcess]
    let options: SoakOptions
    private let dataDirectory: URL?
    private let databaseURL: String?
    private let cluster: PostgresCluster?

    private init(
        nodes: [ServerProcess], options: SoakOptions, dataDirectory: URL?, databaseURL: String?,
        cluster: PostgresCluster?
    ) {
        self.nodes = nodes
        self.options = options
        self.dataDirectory = dataDirectory
        self.databaseURL = databaseURL
        self.cluster = cluster
    }

    static func start(
        _ options: SoakOptions, folder: TemporaryDirectory, progress: @escaping @Sendable (String) -> Void
    ) async throws -> SoakServers {
        var faults = ["--fault-seed", String(options.seed)]
        if options.lostAckRate > 0 { faults += ["--fault-lost-ack", String(options.lostAckRate)] }
        let executable = options.serverExecutable ?? options.executable
        guard options.isCluster else {
            let data = folder.url.appendingPathComponent("server")
            let server = try await ServerProcess.onStablePort(
                arguments: ["serve", "--data", data.path, "--log-level", "warning"] + faults, executable: executable)
            return SoakServers(
                nodes: [server], options: options, dataDirectory: data, databaseURL: nil, cluster: nil)
        }
        var cluster: PostgresCluster?
        let url: String
        if let given = options.postgresURL {
            url = given
            try await refuseSoakData(in: url)
        } else {
            progress("starting a throwaway PostgreSQL cluster")
            let own = try await PostgresCluster.start(durable: true)
            url = try await onOwnThread { try own.createDatabase() }
            cluster = own
        }
        var nodes: [ServerProcess] = []
        for index in 0..<options.nodes {
            progress("starting node \(index + 1) of \(options.nodes)")
            nodes.append(
                try await ServerProcess.onStablePort(
                    arguments: [
                        "serve", "--postgres", url, "--node-name", "node-\(index + 1)", "--log-level", "warning",
                    ] + faults.map { $0 == String(options.seed) ? String(options.seed &+ UInt64(index)) : $0 },
                    executable: executable))
        }
        return SoakServers(nodes: nodes, options: options, dataDirectory: nil, databaseURL: url, cluster: cluster)
    }

    /// The soak compares what its devices hold with the server's `accounts` and their
    /// entries: a given database must not hold any yet (a soak's before, say), since no seed
    /// would replay on them. Other collections are left alone, and out of the checks.
    private static func refuseSoakData(in url: String) async throws {
        var configuration = ServerConfiguration(storage: .postgres(url: url))
        configuration.port = 0
        configuration.logger.logLevel = .critical
        let opened = configuration
        let server = try await onOwnThread { try TandemServer(configuration: opened) }
        let taken = try await server.collections().filter(SoakScenario.isSoakCollection)
        await server.shutdown()
        guard taken.isEmpty else {
            throw ScenarioError(
                "\(opened.storage) already holds the soak's "
                    + "collections (\(taken.prefix(3).map(\.rawValue).joined(separator: ", "))\(taken.count > 3 ? ", …" : "")): "
                    + "give the soak a database without 'accounts' and their entries (other collections are fine), "
                    + "or remove them first through the admin API (docs/ADMIN.md)")
        }
    }

    /// Kills a node (the one server, or a node at random) with SIGKILL and starts it again on
    /// the same port, with another fault seed.
    func killAndRestartNode(
        restart: Int, of total: Int, random: inout SeededGenerator, seed: UInt64,
        progress: @escaping @Sendable (String) -> Void
    ) async throws {
        let index = Int.random(in: 0..<nodes.count, using: &random)
        progress(
            nodes.count == 1
                ? "killing the server (SIGKILL), restart \(restart) of \(total)"
                : "killing node \(index + 1) (SIGKILL), restart \(restart) of \(total)")
        await nodes[index].kill()
        try await Task.sleep(for: .milliseconds(Int.random(in: 50...400, using: &random)))
        try await nodes[index].restart(changing: ["--fault-seed": String(seed &+ UInt64(100 * restart + index))])
    }

    /// Restarts PostgreSQL at once, as `pg_ctl restart -m immediate` does.
    func restartPostgres() async throws {
        if let cluster {
            try await cluster.restartImmediately()
            return
        }
        guard let databaseURL else { return }
        try await PostgresCluster.restartImmediately(serving: databaseURL)
    }

    /// What the servers hold, read straight from the store.
    func contents() throws -> any ServerContents {
        if let dataDirectory { return try ServerDatabase(dataDirectory: dataDirectory) }
        var configuration = ServerConfiguration(storage: .postgres(url: databaseURL!))
        configuration.port = 0
        configuration.logger.logLevel = .critical
        return try TandemServer(configuration: configuration)
    }

    func stop() {
        for node in nodes { node.send(SIGKILL) }
        cluster?.stop()
    }
}

public struct SoakOptions: Sendable {
    public var devices = 5
    public var operations = 2000
    public var seed: UInt64 = 1
    /// Per operation, the chance that each device loses its connection.
    public var disconnectRate = 0.02
    /// How many times the server is killed with SIGKILL and started again, evenly spread.
    public var serverRestarts = 3
    /// The chance that the server commits a write and loses its acknowledgement.
    public var lostAckRate = 0.02
    public var quietTimeout: Duration = .seconds(180)
    /// How many server nodes; more than one runs them over PostgreSQL.
    public var nodes = 1
    /// The PostgreSQL database of the nodes; nil with several nodes: a throwaway cluster of
    /// the soak's own.
    public var postgresURL: String?
    /// With several nodes: how many times a node at random is killed with SIGKILL and started
    /// again (``serverRestarts`` counts the kills of the one SQLite server).
    public var nodeRestarts = 0
    /// How many times PostgreSQL is restarted at once (`-m immediate`).
    public var postgresRestarts = 0

    /// Whether the servers run over PostgreSQL.
    public var isCluster: Bool { nodes > 1 || postgresURL != nil || postgresRestarts > 0 }
    /// The `tandem` executable that runs the server; by default found next to this program.
    public var executable: URL?
    /// Another `tandem` executable to run the server with (another build of it), if not
    /// ``executable``.
    public var serverExecutable: URL?

    public init() {}
}

public struct SoakResult: Sendable {
    public var options: SoakOptions
    public var report: ConvergenceReport
    public var operations: [String: Int]
    public var restarts: Int
    public var postgresRestarts: Int
    public var lostAcksInjected: Int
    /// Writes the server acknowledged and the devices wrote back.
    public var acknowledgedWrites: Int
    /// Acknowledged writes the server does not have (at that version or later).
    public var lostWrites: [String]
    /// Entries stored twice: on the server, and on the devices.
    public var duplicates: [String]
    /// Documents whose acknowledged delete did not hold.
    public var resurrected: [String]
    /// Times a device showed an older version of a document than one it had written.
    public var readYourWritesViolations: [String]
    public var elapsed: Duration
    /// For a run that did not converge: the feed around the first documents that differ, and
    /// every device's resume tokens (``SoakScenario``'s `diagnose`).
    public var diagnosis: [String] = []
    /// For a failed run: the folder kept with the devices' databases (and the server's, on
    /// SQLite).
    public var keptFolder: String?

    public var passed: Bool {
        report.isConverged && lostWrites.isEmpty && duplicates.isEmpty && resurrected.isEmpty
            && readYourWritesViolations.isEmpty
    }

    /// The first thing that went wrong, for a failure message.
    public var firstDivergence: String? {
        report.firstDifferences.first ?? lostWrites.first.map { "acknowledged write lost: \($0)" }
            ?? duplicates.first.map { "duplicate: \($0)" } ?? resurrected.first.map { "resurrected: \($0)" }
            ?? readYourWritesViolations.first.map { "read-your-writes: \($0)" }
    }
}

/// What the devices were told the server has, and what they showed since.
final class Ledger: Sendable {
    struct Key: Hashable {
        var collection: String
        var id: String
        var description: String { "\(collection)/\(id)" }
    }

    private struct State {
        /// The highest acknowledged version of each document, over all devices.
        var versions: [Key: Int64] = [:]
        /// Per device, the highest version of each document it wrote.
        var written: [String: [String: Int64]] = [:]
        /// Per device and document, what happened to it last (acknowledgements, snapshots),
        /// to explain a violation.
        var history: [String: [String: [String]]] = [:]
        var deletes: Set<Key> = []
        var acknowledged = 0
        var violations: [String] = []
    }

    private let state = Mutex(State())

    func acknowledged(by device: String, _ ops: [WriteOp], _ results: [WriteResult]) {
        state.withLock { state in
            for (op, result) in zip(ops, results) {
                let key = Key(collection: op.collection.rawValue, id: result.id.rawValue)
                state.acknowledged += 1
                state.versions[key] = max(state.versions[key] ?? 0, result.version)
                Self.remember(&state, device, result.id.rawValue, "ack of \(op.kind) v\(result.version)")
                if op.kind == .delete {
                    state.deletes.insert(key)
                } else {
                    state.written[device, default: [:]][result.id.rawValue] = max(
                        state.written[device]?[result.id.rawValue] ?? 0, result.version)
                }
            }
        }
    }

    /// Keeps the last events of a document on a device.
    private static func remember(_ state: inout State, _ device: String, _ id: String, _ event: String) {
        var events = state.history[device, default: [:]][id, default: []]
        events.append(event)
        if events.count > 16 { events.removeFirst(events.count - 16) }
        state.history[device, default: [:]][id] = events
    }

    /// Records what a snapshot brought (when it was received, when it was applied).
    func note(_ device: String, _ snapshot: ServerMessage.Snapshot, _ what: String) {
        state.withLock { state in
            for change in snapshot.changes {
                Self.remember(
                    &state, device, change.document.id.rawValue,
                    "\(what) \(change.kind) v\(change.document.version) (snapshot \(snapshot.resumeToken)"
                        + "\(snapshot.initial ? ", initial" : ""))")
            }
        }
    }

    /// After a device applied a snapshot: each document of it that the device wrote must be
    /// at the version it wrote, or a later one (or gone, by a delete).
    func checkReadYourWrites(_ device: String, _ snapshot: ServerMessage.Snapshot, _ database: DatabaseQueue) {
        let mine = state.withLock { $0.written[device] ?? [:] }
        let relevant = snapshot.changes.compactMap { change in
            mine[change.document.id.rawValue].map { (change.document.id.rawValue, $0) }
        }
        guard !relevant.isEmpty else { return }
        let held: [(String, Int64, Int64?)]
        do {
            held = try database.read { db in
                try relevant.map { id, written in
                    // The row's version, or its filed delete's while the row is gone.
                    let rows = CashFlow.tables.map { "SELECT serverVersion FROM \"\($0.name)\" WHERE serverId = ?1" }
                    let filedDelete =
                        "SELECT serverVersion FROM tandem_row WHERE serverId = ?1 AND pendingOp = 'delete'"
                    let version = try Int64.fetchOne(
                        db, sql: (rows + [filedDelete]).joined(separator: " UNION ALL "), arguments: [id])
                    return (id, written, version)
                }
            }
        } catch {
            // Unchecked is not held: a check that cannot read counts against the promise.
            state.withLock { $0.violations.append("\(device): cannot read its own versions: \(error)") }
            return
        }
        let history = state.withLock { $0.history[device] ?? [:] }
        let violations = held.compactMap { id, written, version -> String? in
            guard let version, version < written else { return nil }
            return "\(device) shows \(id) at version \(version) after writing version \(written); its history there: "
                + (history[id] ?? []).joined(separator: "; ")
        }
        if !violations.isEmpty { state.withLock { $0.violations += violations } }
    }

    func verdict(
        report: ConvergenceReport, server: any ServerContents, devices: [LocalDevice], options: SoakOptions,
        operations: [String: Int], restarts: Int, postgresRestarts: Int, lostAcksInjected: Int, elapsed: Duration,
        diagnosis: [String]
    ) async throws -> SoakResult {
        let state = state.withLock { $0 }
        var byKey: [Key: (version: Int64, deleted: Bool)] = [:]
        var uids: [String: Int] = [:]
        for (collection, document) in try await server.everyDocument() where SoakScenario.isSoakCollection(collection) {
            let key = Key(collection: collection.rawValue, id: document.id.rawValue)
            byKey[key] = (document.version, document.deleted)
            if !document.deleted, key.collection.hasSuffix("/entries"), let uid = document.fields["uid"]?.stringValue {
                uids[uid, default: 0] += 1
            }
        }
        let lost = state.versions.compactMap { key, version -> String? in
            guard let held = byKey[key] else { return "\(key.description) v\(version): not on the server" }
            return held.version < version
                ? "\(key.description) v\(version): the server has v\(held.version)" : nil
        }
        var duplicates = uids.filter { $0.value > 1 }.map { "entry \($0.key) stored \($0.value) times on the server" }
        for device in devices {
            let repeated = try await device.database.read { db in
                try Int.fetchOne(db, sql: "SELECT COUNT(*) - COUNT(DISTINCT uid) FROM entry") ?? 0
            }
            if repeated > 0 { duplicates.append("\(device.name) holds \(repeated) entries twice") }
        }
        let resurrected = state.deletes.compactMap { key -> String? in
            byKey[key]?.deleted == false ? "\(key.description) was deleted and is live again on the server" : nil
        }
        return SoakResult(
            options: options, report: report, operations: operations, restarts: restarts,
            postgresRestarts: postgresRestarts, lostAcksInjected: lostAcksInjected,
            acknowledgedWrites: state.acknowledged, lostWrites: lost.sorted(),
            duplicates: duplicates.sorted(), resurrected: resurrected.sorted(),
            readYourWritesViolations: state.violations, elapsed: elapsed, diagnosis: diagnosis)
    }
}
