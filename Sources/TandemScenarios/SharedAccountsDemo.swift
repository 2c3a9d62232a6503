import Foundation
import GRDB
import TandemHarness
import TandemLocal
@_spi(Testing) import Tandem
import TandemServer
import TandemWire

/// `tandem demo --shared-accounts`: devices of three users (alice, bob, carol) on a server
/// with row-level read rules, each syncing only the accounts that list its user
/// (``SharedAccounts``). Alice opens "Household" with bob, bob "Trip" with carol, carol
/// "Studio" with alice; devices add, edit and delete entries at random (seeded), going offline
/// and coming back; between rounds a member adds or removes another user. At the end every
/// device must hold exactly the server's documents its user may read: the accounts listing
/// them and those accounts' entries.
///
/// Membership changes are made while every device is online and quiet, and editing resumes
/// once every device has heard of them: an entry written offline in an account its user was
/// removed from meanwhile is refused by the server, and this demo is about convergence.
public enum SharedAccountsDemo {
    public static let users = ["alice", "bob", "carol"]

    /// The user of the device with this index (0-based): alice, bob, carol, alice, …
    public static func user(ofDevice index: Int) -> String { users[index % users.count] }

    /// Which server documents a user's device (named `USER-N`) must hold: the accounts that
    /// list the user, and the entries of those accounts.
    public static let visible: Convergence.Visibility = { device, collection, id, server in
        let user = JSONValue.string(String(device.prefix { $0 != "-" }))
        func lists(_ account: DocumentID) -> Bool {
            server[.accounts]?[account]?["members"]?.arrayValue?.contains(user) == true
        }
        if collection == .accounts { return lists(id) }
        let segments = collection.rawValue.split(separator: "/")
        guard segments.count == 3, segments[0] == "accounts", let account = try? DocumentID(String(segments[1]))
        else { return false }
        return lists(account)
    }

    public static func run(
        _ options: DemoOptions, progress: @escaping @Sendable (DemoProgress) -> Void = { _ in }
    ) async throws -> DemoResult {
        let started = ContinuousClock.now
        var random = SeededGenerator(seed: options.seed)
        let access = try SharedAccounts.access()
        let server = try await LocalServer(store: .sqlite) { $0.access = access }
        defer { server.stopWithoutWaiting() }
        let devices = try (0..<options.devices).map { index in
            let user = user(ofDevice: index)
            return try LocalDevice(name: "\(user)-\(index + 1)", serverURL: server.url, model: .sharedAccounts) {
                configuration in
                configuration.token = "t-\(user)"
                configuration.serialization = options.serialization
                configuration.conflictPolicy = options.policy
                configuration.pushDelay = .milliseconds(2)
                configuration.pushInterval = .seconds(2)
            }
        }
        for device in devices { device.service.start() }
        do {
            return try await run(options, server, devices, &random, started, progress)
        } catch {
            for device in devices { await device.service.stop() }
            throw error
        }
    }

    private static func run(
        _ options: DemoOptions, _ server: LocalServer, _ devices: [LocalDevice], _ random: inout SeededGenerator,
        _ started: ContinuousClock.Instant, _ progress: @escaping @Sendable (DemoProgress) -> Void
    ) async throws -> DemoResult {
        var counts: [String: Int] = [:]

        // Syncs until quiet; manual conflicts wait for "the user", who settles each in turn
        // (keep the device's, take the server's), until none comes up.
        var resolvedByHand = 0
        func quiet(_ phase: String, done: Int) async throws -> ConvergenceReport {
            let deadline = ContinuousClock.now + options.quietTimeout
            var report: ConvergenceReport
            repeat {
                for device in devices {
                    for (index, conflict) in try await device.service.conflicts().enumerated() {
                        try await device.service.resolve(conflict, with: index % 2 == 0 ? .keepLocal : .useServer)
                        resolvedByHand += 1
                    }
                }
                report = try await Convergence.waitUntilQuiet(
                    server: server.server, devices: devices.map { ($0.name, $0.service) }, visible: visible,
                    timeout: max(.seconds(1), deadline - ContinuousClock.now), stall: .seconds(5)
                ) { report in
                    progress(
                        DemoProgress(
                            phase: phase, done: done, total: options.operations, online: devices.count,
                            pending: report.devices.map(\.pending).reduce(0, +)))
                }
            } while try await DemoScenario.openConflicts(devices) > 0 && ContinuousClock.now < deadline
            return report
        }

        // Each of the first three users opens an account with the next one.
        let openings = [("Household", ["alice", "bob"]), ("Trip", ["bob", "carol"]), ("Studio", ["carol", "alice"])]
        for (index, (name, members)) in openings.enumerated() where index < devices.count {
            try await devices[index].database.write { db in
                var account = SharedAccounts.Account(name: name, members: members)
                try account.insert(db)
            }
        }
        _ = try await quiet("sharing accounts", done: 0)

        var online = Array(repeating: true, count: devices.count)
        let round = max(1, options.operations / 10)
        for step in 0..<options.operations {
            if step % round == 0 && step > 0 {
                if (step / round) % 3 == 0 {
                    try await changeMembers(devices, &online, &random, &counts, quiet: quiet, step: step)
                } else {
                    await DemoScenario.takeOffline(devices, &online, options.offlineFraction, &random, &counts)
                }
            }
            let device = devices[Int.random(in: 0..<devices.count, using: &random)]
            await counts[try perform(on: device, random: &random), default: 0] += 1
            try await DemoScenario.paceAndReport(step, options, devices, online, progress)
        }
        for (index, device) in devices.enumerated() where !online[index] { device.service.start() }
        let report = try await quiet("syncing until quiet", done: options.operations)

        let conflicts = (
            devices.map { $0.service.status.resolvedConflicts }.reduce(0, +),
            try await DemoScenario.openConflicts(devices), resolvedByHand
        )
        for device in devices { await device.service.stop() }
        return try await DemoScenario.result(report, server, devices, conflicts: conflicts, counts, started, options)
    }

    /// Brings every device online and waits for quiet; then a member of an account adds or
    /// removes another user, and the scenario waits until every device has heard of it.
    private static func changeMembers(
        _ devices: [LocalDevice], _ online: inout [Bool], _ random: inout SeededGenerator,
        _ counts: inout [String: Int],
        quiet: (String, Int) async throws -> ConvergenceReport, step: Int
    ) async throws {
        for (index, device) in devices.enumerated() where !online[index] { device.service.start() }
        online = Array(repeating: true, count: devices.count)
        _ = try await quiet("before a membership change", step)
        let index = Int.random(in: 0..<devices.count, using: &random)
        let device = devices[index]
        let me = user(ofDevice: index)
        let other = users.filter { $0 != me }.randomElement(using: &random)!
        let accounts = try await device.database.read { db in try SharedAccounts.Account.fetchAll(db) }
        guard var account = accounts.randomElement(using: &random) else { return }
        // (A device that holds no account makes no change: its user was removed from all.)
        var members = (try? JSONDecoder().decode([String].self, from: Data(account.members.utf8))) ?? []
        if members.contains(other) {
            members.removeAll { $0 == other }
            counts["removed", default: 0] += 1
        } else {
            members.append(other)
            counts["added", default: 0] += 1
        }
        account.members = SharedAccounts.Account.encode(members)
        let changed = account
        try await device.database.write { db in try changed.update(db) }
        _ = try await quiet("after a membership change", step)
    }

    /// One random local write on the entries of an account the device holds; returns its kind.
    private static func perform(on device: LocalDevice, random: inout SeededGenerator) async throws -> String {
        let (accounts, entries) = try await device.database.read { db in
            (
                try Int64.fetchAll(db, sql: "SELECT id FROM account ORDER BY id"),
                try Int64.fetchAll(db, sql: "SELECT id FROM entry ORDER BY id")
            )
        }
        guard let account = accounts.randomElement(using: &random) else { return "idle" }
        let roll = Double.random(in: 0..<1, using: &random)
        let amount = Int64.random(in: -50_000...50_000, using: &random)
        if entries.isEmpty || roll < 0.45 {
            try await device.addEntry(
                ["Rent", "Groceries", "Tickets", "Paint"].randomElement(using: &random)!, amount: amount,
                account: account)
            return "create"
        }
        let entry = entries.randomElement(using: &random)!
        if roll < 0.80 {
            try await device.database.write { db in
                try db.execute(sql: "UPDATE entry SET amount = ? WHERE id = ?", arguments: [amount, entry])
            }
            return "edit"
        }
        try await device.database.write { db in
            try db.execute(sql: "DELETE FROM entry WHERE id = ?", arguments: [entry])
        }
        return "delete"
    }
}

extension CollectionPath {
    fileprivate static let accounts = try! CollectionPath("accounts")
}
