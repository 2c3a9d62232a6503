import Foundation
import GRDB
import TandemHarness
import TandemLocal
@_spi(Testing) import Tandem
import TandemServer
import TandemWire

/// The demo: an embedded server and several devices sharing a cash-flow book. Devices create,
/// edit and delete entries at random (seeded), go offline and come back, then sync until
/// quiet; the result compares every device with the server.
///
/// `tandem demo` runs it and prints the result; the convergence tests run it too.
///
/// For example:
///
/// ```swift
/// var options = DemoOptions()
/// options.devices = 3
/// options.operations = 200
/// let result = try await DemoScenario.run(options) { print($0) }
/// assert(result.report.isConverged)
/// ```
public enum DemoScenario {
    public static func run(
        _ options: DemoOptions, progress: @escaping @Sendable (DemoProgress) -> Void = { _ in }
    ) async throws -> DemoResult {
        let started = ContinuousClock.now
        var random = SeededGenerator(seed: options.seed)
        let server = try await LocalServer(store: .sqlite)
        defer { server.stopWithoutWaiting() }

        let ackDelay = options.ackDelay
        let skew = Int64(options.clockSkew.seconds * 1000)
        let offsets = (1...options.devices).map { _ in skew > 0 ? Int64.random(in: -skew...skew, using: &random) : 0 }
        let devices = try (1...options.devices).map { index in
            try LocalDevice(name: "device-\(index)", serverURL: server.url) { configuration in
                configuration.serialization = options.serialization
                configuration.conflictPolicy = options.policy
                configuration.clock = SkewedClock(offset: offsets[index - 1])
                configuration.pushDelay = .milliseconds(2)
                configuration.pushInterval = .seconds(2)
                if ackDelay > .zero {
                    configuration.hooks.afterAck = { _ in Thread.sleep(forTimeInterval: ackDelay.seconds) }
                }
            }
        }
        for device in devices { device.service.start() }
        do {
            return try await run(
                options, server: server, devices: devices, random: &random, started: started, progress: progress)
        } catch {
            for device in devices { await device.service.stop() }
            throw error
        }
    }

    private static func run(
        _ options: DemoOptions, server: LocalServer, devices: [LocalDevice], random: inout SeededGenerator,
        started: ContinuousClock.Instant, progress: @escaping @Sendable (DemoProgress) -> Void
    ) async throws -> DemoResult {

        // The first device opens the book: two shared accounts and a private one.
        progress(
            DemoProgress(
                phase: "sharing accounts", done: 0, total: options.operations, online: devices.count, pending: 0))
        try await devices[0].addAccount("Household")
        try await devices[0].addAccount("Holiday")
        try await devices[0].addAccount("Private", shared: false)
        try await waitUntil("every device has the shared accounts", timeout: .seconds(30)) {
            for device in devices where try await sharedAccounts(device).count < 2 { return false }
            return true
        }

        var counts: [String: Int] = [:]
        var online = Array(repeating: true, count: devices.count)
        let round = max(1, options.operations / 10)
        for step in 0..<options.operations {
            if step % round == 0 && step > 0 {
                await takeOffline(devices, &online, options.offlineFraction, &random, &counts)
            }
            let device = devices[Int.random(in: 0..<devices.count, using: &random)]
            let kind = try await perform(on: device, random: &random)
            counts[kind, default: 0] += 1
            try await paceAndReport(step, options, devices, online, progress)
        }

        for (index, device) in devices.enumerated() where !online[index] { device.service.start() }
        // Manual conflicts wait for "the user": here, each device settles its open ones in turn
        // with keepLocal, useServer or a merge, and syncs until nothing new comes up.
        var resolvedByHand = 0
        var report: ConvergenceReport
        let deadline = ContinuousClock.now + options.quietTimeout
        repeat {
            for device in devices {
                for (index, conflict) in try await device.service.conflicts().enumerated() {
                    let choice: ConflictResolution =
                        switch index % 3 {
                        case 0: .keepLocal
                        case 1: .useServer
                        default: .merge(fields: conflict.server.fields.filter { $0.key == "title" })
                        }
                    try await device.service.resolve(conflict, with: choice)
                    resolvedByHand += 1
                }
            }
            report = try await Convergence.waitUntilQuiet(
                server: server.server, devices: devices.map { ($0.name, $0.service) },
                timeout: max(.seconds(1), deadline - ContinuousClock.now), stall: .seconds(5)
            ) { report in
                progress(
                    DemoProgress(
                        phase: "syncing until quiet", done: options.operations, total: options.operations,
                        online: devices.count, pending: report.devices.map(\.pending).reduce(0, +)))
            }
            // A stall is a moment to resolve the conflicts that hold convergence up. A device
            // still connecting (an attempt can take its whole timeout on a busy machine) is waited
            // for; a stall with every device connected and no conflict is the end.
        } while try await
            (openConflicts(devices) > 0
            || (!report.isConverged && devices.contains(where: { !$0.service.status.isConnected })))
            && ContinuousClock.now < deadline
        let resolvedConflicts = devices.map { $0.service.status.resolvedConflicts }.reduce(0, +)
        let openConflicts = try await openConflicts(devices)
        for device in devices { await device.service.stop() }
        return try await result(
            report, server, devices, conflicts: (resolvedConflicts, openConflicts, resolvedByHand), counts, started,
            options)
    }

    /// The result of a run: the report, and the entries on the server and the devices, each
    /// counted once per `uid` to find the ones stored twice.
    static func result(
        _ report: ConvergenceReport, _ server: LocalServer, _ devices: [LocalDevice],
        conflicts: (resolved: Int, open: Int, byHand: Int), _ counts: [String: Int], _ started: ContinuousClock.Instant,
        _ options: DemoOptions
    ) async throws -> DemoResult {
        let collections = try await server.server.collections().filter { $0.rawValue.hasSuffix("/entries") }
        var documents: [Document] = []
        for collection in collections { documents += try await server.server.documents(in: collection) }
        let serverDuplicates = documents.count - Set(documents.compactMap { $0.fields["uid"]?.stringValue }).count
        let deviceDuplicates = try devices.map { device in
            try device.database.read { db in
                try Int.fetchOne(db, sql: "SELECT COUNT(*) - COUNT(DISTINCT uid) FROM entry") ?? 0
            }
        }
        return DemoResult(
            report: report, entries: documents.count, serverDuplicates: serverDuplicates,
            deviceDuplicates: deviceDuplicates, resolvedConflicts: conflicts.resolved, openConflicts: conflicts.open,
            resolvedByHand: conflicts.byHand, operations: counts, elapsed: ContinuousClock.now - started,
            options: options)
    }

    /// Takes each device offline (stops its service) or back online at random.
    static func takeOffline(
        _ devices: [LocalDevice], _ online: inout [Bool], _ fraction: Double, _ random: inout SeededGenerator,
        _ counts: inout [String: Int]
    ) async {
        for (index, device) in devices.enumerated() {
            let offline = Double.random(in: 0..<1, using: &random) < fraction
            if offline && online[index] {
                await device.service.stop()
                counts["offline", default: 0] += 1
            } else if !offline && !online[index] {
                device.service.start()
            }
            online[index] = !offline
        }
    }

    /// After an editing step: a short pause now and then (the services get to run), and
    /// progress every ten steps.
    static func paceAndReport(
        _ step: Int, _ options: DemoOptions, _ devices: [LocalDevice], _ online: [Bool],
        _ progress: @Sendable (DemoProgress) -> Void
    ) async throws {
        if step % 5 == 4 { try await Task.sleep(for: .milliseconds(2)) }
        guard step % 10 == 9 || step == options.operations - 1 else { return }
        progress(
            DemoProgress(
                phase: "editing", done: step + 1, total: options.operations, online: online.filter { $0 }.count,
                pending: devices.map { $0.service.status.pendingCount }.reduce(0, +)))
    }

    /// How many conflicts the devices hold open.
    static func openConflicts(_ devices: [LocalDevice]) async throws -> Int {
        var count = 0
        for device in devices { count += try await device.service.conflicts().count }
        return count
    }

    static func sharedAccounts(_ device: LocalDevice) async throws -> [Int64] {
        try await device.database.read { db in
            try Int64.fetchAll(db, sql: "SELECT id FROM account WHERE isShared = 1 ORDER BY id")
        }
    }

    /// One random local write; returns its kind.
    static func perform(on device: LocalDevice, random: inout SeededGenerator) async throws -> String {
        let accounts = try await sharedAccounts(device)
        let entries = try await device.database.read { db in
            try Int64.fetchAll(
                db,
                sql:
                    "SELECT entry.id FROM entry JOIN account ON account.id = entry.accountId WHERE account.isShared = 1"
            )
        }
        let roll = Double.random(in: 0..<1, using: &random)
        let account = accounts[Int.random(in: 0..<accounts.count, using: &random)]
        let amount = Int64.random(in: -50_000...50_000, using: &random)
        let title = titles[Int.random(in: 0..<titles.count, using: &random)]
        if entries.isEmpty || roll < 0.40 {
            try await device.addEntry(title, amount: amount, account: account)
            return "create"
        }
        let entry = entries[Int.random(in: 0..<entries.count, using: &random)]
        if roll < 0.50 {
            let other = accounts[Int.random(in: 0..<accounts.count, using: &random)]
            try await device.database.write { db in
                var out = CashFlow.Entry(accountId: account, title: "Transfer out", amount: -abs(amount))
                try out.insert(db)
                var into = CashFlow.Entry(
                    accountId: other, title: "Transfer in", amount: abs(amount), linkedEntryId: out.id)
                try into.insert(db)
                try db.execute(sql: "UPDATE entry SET linkedEntryId = ? WHERE id = ?", arguments: [into.id, out.id])
            }
            return "transfer"
        }
        if roll < 0.80 {
            let retitle = Bool.random(using: &random)
            try await device.database.write { db in
                if retitle {
                    try db.execute(sql: "UPDATE entry SET title = ? WHERE id = ?", arguments: [title, entry])
                } else {
                    try db.execute(sql: "UPDATE entry SET amount = ? WHERE id = ?", arguments: [amount, entry])
                }
            }
            return "edit"
        }
        _ = try await device.database.write { db in
            try db.execute(sql: "DELETE FROM entry WHERE id = ?", arguments: [entry])
        }
        return "delete"
    }

    private static let titles = [
        "Rent", "Groceries", "Salary", "Electricity", "Train", "Books", "Dinner", "Insurance", "Gift", "Coffee",
    ]
}

public struct DemoOptions: Sendable {
    public var devices = 3
    public var operations = 300
    public var seed: UInt64 = 1
    /// The share of devices offline at any time (re-drawn ten times per run).
    public var offlineFraction = 0.3
    @_spi(Testing) public var serialization = Serialization.barrier
    /// A pause between a push's acknowledgement and its write-back, to widen the window of
    /// the race that `Serialization.unserialized` leaves open.
    public var ackDelay: Duration = .zero
    public var quietTimeout: Duration = .seconds(120)
    /// How conflicts are settled on every device.
    public var policy = ConflictPolicy.lastWriteWins
    /// Each device's clock is off by a random amount within ± this.
    public var clockSkew: Duration = .zero

    public init() {}
}

public struct DemoProgress: Sendable, CustomStringConvertible {
    public var phase: String
    public var done: Int
    public var total: Int
    public var online: Int
    public var pending: Int

    public var description: String { "\(phase): \(done)/\(total) operations, \(online) online, \(pending) pending" }
}

public struct DemoResult: Sendable {
    public var report: ConvergenceReport
    /// Entries on the server at the end.
    public var entries: Int
    /// Entry documents on the server that repeat another's uid (one entry stored twice).
    public var serverDuplicates: Int
    /// Per device, entry rows that repeat another row's uid.
    public var deviceDuplicates: [Int]
    /// Conflicts settled on the devices (by the policy, or by hand for the manual policy).
    public var resolvedConflicts: Int
    /// Conflicts still waiting at the end (manual policy).
    public var openConflicts: Int
    /// Manual conflicts the scenario resolved "by hand".
    public var resolvedByHand: Int
    /// How many operations of each kind were made (create, transfer, edit, delete, offline).
    public var operations: [String: Int]
    public var elapsed: Duration
    public var options: DemoOptions

    /// Entries stored twice, on the server and on the devices.
    public var duplicates: Int { serverDuplicates + deviceDuplicates.reduce(0, +) }
    /// Server documents missing on some device, and local rows that never reached the server.
    public var lost: Int { report.devices.map { $0.missing.count }.reduce(0, +) }
    /// Converged, nothing stored twice, no conflict left open.
    public var isConverged: Bool { report.isConverged && duplicates == 0 && openConflicts == 0 }
}
