import Foundation
import GRDB
import Synchronization
import Tandem
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
        let dataDirectory = folder.url.appendingPathComponent("server")
        var serverOptions = ["--fault-seed", String(options.seed)]
        if options.lostAckRate > 0 { serverOptions += ["--fault-lost-ack", String(options.lostAckRate)] }
        let server = try await ServerProcess.onStablePort(
            dataDirectory: dataDirectory, options: serverOptions,
            executable: options.serverExecutable ?? options.executable)
        defer { server.kill() }

        let ledger = Ledger()
        let devices = try (1...options.devices).map { index in
            let name = "device-\(index)"
            let database = Mutex<DatabaseQueue?>(nil)
            let device = try TestDevice(name: name, serverURL: server.url) { configuration in
                configuration.pushDelay = .milliseconds(2)
                configuration.pushInterval = .seconds(1)
                configuration.reconnectDelay = .milliseconds(50)
                configuration.maxReconnectDelay = .milliseconds(400)
                configuration.requestTimeout = .seconds(5)
                // The server goes away for a while on purpose: rows must not fail for that.
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
            return try await run(
                options, server: server, dataDirectory: dataDirectory, devices: devices, ledger: ledger,
                random: &random, started: started, progress: progress)
        } catch {
            for device in devices { await device.service.stop() }
            throw error
        }
    }

    private static func run(
        _ options: SoakOptions, server: ServerProcess, dataDirectory: URL, devices: [TestDevice], ledger: Ledger,
        random: inout SeededGenerator, started: ContinuousClock.Instant, progress: @escaping @Sendable (String) -> Void
    ) async throws -> SoakResult {
        progress("opening the book")
        try devices[0].addAccount("Household")
        try devices[0].addAccount("Holiday")
        try await waitUntil("every device has the shared accounts", timeout: .seconds(60)) {
            try devices.allSatisfy { try DemoScenario.sharedAccounts($0).count >= 2 }
        }

        var counts: [String: Int] = [:]
        let restartEvery = options.operations / (options.serverRestarts + 1)
        var restarts = 0
        for step in 0..<options.operations {
            if options.serverRestarts > 0, step > 0, step % restartEvery == 0, restarts < options.serverRestarts {
                progress("killing the server (SIGKILL), restart \(restarts + 1) of \(options.serverRestarts)")
                server.kill()
                try await Task.sleep(for: .milliseconds(Int.random(in: 50...400, using: &random)))
                // Another fault seed for each server process, so that they do not all make the
                // same choices.
                try await server.restart(changing: ["--fault-seed": String(options.seed &+ UInt64(restarts + 1))])
                restarts += 1
            }
            for device in devices where Double.random(in: 0..<1, using: &random) < options.disconnectRate {
                device.service.reconnect()
                counts["disconnect", default: 0] += 1
            }
            let device = devices[Int.random(in: 0..<devices.count, using: &random)]
            let kind = try DemoScenario.perform(on: device, random: &random)
            counts[kind, default: 0] += 1
            if step % 5 == 4 { try await Task.sleep(for: .milliseconds(2)) }
            if step % 50 == 49 || step == options.operations - 1 {
                let pending = devices.map { $0.service.status.pendingCount }.reduce(0, +)
                progress(
                    "writing: \(step + 1)/\(options.operations) operations, \(restarts) restarts, \(pending) pending")
            }
        }

        progress("syncing until quiet")
        let contents = try ServerDatabase(dataDirectory: dataDirectory)
        let report = try await Convergence.waitUntilQuiet(
            server: contents, devices: devices, timeout: options.quietTimeout,
            progress: { report in
                progress("syncing until quiet: \(report.devices.map(\.pending).reduce(0, +)) pending")
            })
        for device in devices { await device.service.stop() }
        return try ledger.verdict(
            report: report, server: contents, devices: devices, options: options, operations: counts,
            restarts: restarts,
            lostAcksInjected: server.standardErrorLines.count {
                $0.contains("injected fault: acknowledgement lost")
            }, elapsed: ContinuousClock.now - started)
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
                    let version = try Int64.fetchOne(
                        db, sql: "SELECT serverVersion FROM tandem_row WHERE serverId = ?", arguments: [id])
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
        report: ConvergenceReport, server: ServerDatabase, devices: [TestDevice], options: SoakOptions,
        operations: [String: Int], restarts: Int, lostAcksInjected: Int, elapsed: Duration
    ) throws -> SoakResult {
        let state = state.withLock { $0 }
        var byKey: [Key: (version: Int64, deleted: Bool)] = [:]
        var uids: [String: Int] = [:]
        for document in try server.everyDocument() {
            let key = Key(collection: document.collection, id: document.id)
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
            let repeated = try device.database.read { db in
                try Int.fetchOne(db, sql: "SELECT COUNT(*) - COUNT(DISTINCT uid) FROM entry") ?? 0
            }
            if repeated > 0 { duplicates.append("\(device.name) holds \(repeated) entries twice") }
        }
        let resurrected = state.deletes.compactMap { key -> String? in
            byKey[key]?.deleted == false ? "\(key.description) was deleted and is live again on the server" : nil
        }
        return SoakResult(
            options: options, report: report, operations: operations, restarts: restarts,
            lostAcksInjected: lostAcksInjected, acknowledgedWrites: state.acknowledged, lostWrites: lost.sorted(),
            duplicates: duplicates.sorted(), resurrected: resurrected.sorted(),
            readYourWritesViolations: state.violations, elapsed: elapsed)
    }
}
