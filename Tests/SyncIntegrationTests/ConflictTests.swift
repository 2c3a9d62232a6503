import TandemScenarios
import Foundation
import GRDB
import Synchronization
@_spi(Testing) import Tandem
import TandemTesting
import TandemWire
import Testing

@Suite("Conflict policies")
struct ConflictTests {
    @Test("concurrent edits of different fields both survive under fieldLevel")
    func fieldLevelKeepsBoth() async throws {
        let clock = TestClock()
        let pair = try await DevicePair(policy: .fieldLevel, phoneClock: clock, laptopClock: clock, serverClock: clock)
        await pair.phone.service.stop()
        await pair.laptop.service.stop()
        clock.advance(by: 1000)
        try await pair.edit(pair.laptop, "amount = -150")
        clock.advance(by: 1000)
        try await pair.edit(pair.phone, "title = 'Rent (May)'")
        pair.laptop.service.start()
        try await pair.laptop.service.syncNow()
        pair.phone.service.start()
        try await pair.converge()
        for entries in await [try pair.entries().phone, try pair.entries().laptop] {
            #expect(entries.map(\.title) == ["Rent (May)"])
            #expect(entries.map(\.amount) == [-150])
        }
    }

    @Test("under lastWriteWins the later edit wins the whole row")
    func lastWriteWinsWhole() async throws {
        let clock = TestClock()
        let pair = try await DevicePair(
            policy: .lastWriteWins, phoneClock: clock, laptopClock: clock, serverClock: clock)
        await pair.phone.service.stop()
        await pair.laptop.service.stop()
        clock.advance(by: 1000)
        try await pair.edit(pair.laptop, "amount = -150")
        clock.advance(by: 1000)
        try await pair.edit(pair.phone, "title = 'Rent (May)'")
        pair.laptop.service.start()
        try await pair.laptop.service.syncNow()
        pair.phone.service.start()
        try await pair.converge()
        for entries in await [try pair.entries().phone, try pair.entries().laptop] {
            #expect(entries.map(\.title) == ["Rent (May)"])
            #expect(entries.map(\.amount) == [-100], "the earlier edit of another field is lost")
        }
    }

    @Test("a device whose clock is an hour fast does not win against a later causal edit from a slow device")
    func hybridLogicalClockKeepsCausality() async throws {
        // Field-level merges compare times with no version precondition: with wall clocks, the
        // fast phone's earlier edit would beat the laptop's later one.
        let pair = try await DevicePair(policy: .fieldLevel, phoneClock: SkewedClock(offset: 3_600_000))
        try await pair.edit(pair.phone, "title = 'from the fast phone'")
        try await pair.phone.service.syncNow()
        try await waitUntil("the laptop saw the phone's edit") {
            try await pair.laptop.entries().first?.title == "from the fast phone"
        }
        try await pair.edit(pair.laptop, "title = 'later, from the slow laptop'")
        try await pair.laptop.service.syncNow()
        try await pair.converge()
        #expect(try await pair.entries().phone.map(\.title) == ["later, from the slow laptop"])
        #expect(try await pair.entries().laptop.map(\.title) == ["later, from the slow laptop"])
        let updatedAt = try await pair.laptop.database.read { db in
            try Int64.fetchOne(db, sql: "SELECT updatedAt FROM entry")!
        }
        #expect(
            HybridLogicalClock.milliseconds(updatedAt) >= SystemClock().now() + 3_000_000,
            "the slow laptop's clock moved past the fast phone's")
    }

    @Test("three-way merge: both devices changed the same field: the newer write wins, other fields kept")
    func threeWaySameField() async throws {
        let clock = TestClock()
        let pair = try await DevicePair(policy: .fieldLevel, phoneClock: clock, laptopClock: clock, serverClock: clock)
        await pair.phone.service.stop()
        await pair.laptop.service.stop()
        clock.advance(by: 1000)
        try await pair.edit(pair.phone, "title = 'older title', amount = -1")
        clock.advance(by: 1000)
        try await pair.edit(pair.laptop, "title = 'newer title'")
        pair.phone.service.start()
        try await pair.phone.service.syncNow()
        pair.laptop.service.start()
        try await pair.converge()
        for entries in await [try pair.entries().phone, try pair.entries().laptop] {
            #expect(entries.map(\.title) == ["newer title"])
            #expect(entries.map(\.amount) == [-1], "changed on one side only: kept")
        }
    }

    @Test("the same policy settles a conflict on push and a conflict on listener-apply")
    func samePolicyBothPaths() async throws {
        let contexts = Mutex<[ConflictContext]>([])
        let policy = ConflictPolicy.custom { context in
            contexts.withLock { $0.append(context) }
            return .merge(fields: [
                "title": .string(
                    "merged: \(context.local["title"]!.stringValue!) + \(context.remote.fields["title"]!.stringValue!)")
            ])
        }
        var hooks = SyncHooks()
        let holdPushes = Mutex(false)
        let held = Checkpoint(times: 100)
        hooks.beforeSend = { _ in if holdPushes.withLock({ $0 }) { held.pause() } }
        let pair = try await DevicePair(policy: policy, phoneHooks: hooks)

        // 1. Conflict on push: the phone edits offline; the laptop's edit gets there first.
        await pair.phone.service.stop()
        try await pair.edit(pair.phone, "title = 'phone 1'")
        try await pair.edit(pair.laptop, "title = 'laptop 1'")
        try await pair.laptop.service.syncNow()
        pair.phone.service.start()
        try await pair.converge()
        #expect(contexts.withLock { $0.count } == 1, "settled once, on the push")
        #expect(try await pair.entries().laptop.map(\.title) == ["merged: phone 1 + laptop 1"])

        // 2. Conflict on listener-apply: the phone's push is held while the laptop's change
        //    arrives for its dirty row.
        holdPushes.withLock { $0 = true }
        try await pair.edit(pair.phone, "title = 'phone 2'")
        try await held.reached()
        try await pair.edit(pair.laptop, "title = 'laptop 2'")
        try await pair.laptop.service.syncNow()
        holdPushes.withLock { $0 = false }
        held.release()
        try await waitUntil("the listener settled the second conflict") { contexts.withLock { $0.count } >= 2 }
        try await pair.converge()
        let second = try #require(contexts.withLock { $0.dropFirst().first })
        #expect(second.local["title"] == "phone 2")
        #expect(second.remote.fields["title"] == "laptop 2")
        #expect(second.inConflict == ["title"])
        #expect(try await pair.entries().phone.map(\.title) == ["merged: phone 2 + laptop 2"])
        #expect(pair.phone.service.status.resolvedConflicts >= 2)
    }

    @Test(
        "manual: the conflict record holds both versions and the base; each resolution converges; the row waits meanwhile",
        arguments: [ConflictResolution.keepLocal, .useServer, .merge(fields: ["title": "Rent, agreed"])])
    func manual(resolution: ConflictResolution) async throws {
        let sent = Mutex<[WriteOp]>([])
        var hooks = SyncHooks()
        hooks.beforeSend = { ops in sent.withLock { $0 += ops } }
        let pair = try await DevicePair(policy: .manual, phoneHooks: hooks)
        await pair.phone.service.stop()
        try await pair.edit(pair.phone, "title = 'Rent (phone)'")
        try await pair.edit(pair.laptop, "title = 'Rent (laptop)'")
        try await pair.laptop.service.syncNow()
        sent.withLock { $0 = [] }
        pair.phone.service.start()

        try await waitUntil("the phone holds an open conflict") { try await !pair.phone.service.conflicts().isEmpty }
        let conflict = try #require(try await pair.phone.service.conflicts().first)
        #expect(conflict.table == "entry")
        #expect(conflict.fields == ["title"])
        #expect(conflict.local["title"] == "Rent (phone)")
        #expect(conflict.server.fields["title"] == "Rent (laptop)")
        #expect(conflict.base?["title"] == "Rent")
        try await waitUntil("the status counts it") { pair.phone.service.status.openConflicts == 1 }
        // The row is dirty, but waits for the app: it is not counted pending.
        #expect(try await pair.phone.isDirty(entry: conflict.rowId))
        #expect(pair.phone.service.status.pendingCount == 0)

        // While the conflict is open the row is not pushed, however often the phone syncs.
        try await pair.phone.service.syncNow()
        try await pair.phone.service.syncNow()
        let afterDetection = sent.withLock { $0.filter { $0.kind == .update } }
        #expect(afterDetection.count <= 1, "only the push that met the conflict")

        try await pair.phone.service.resolve(conflict, with: resolution)
        try await pair.converge()
        let expected =
            switch resolution {
            case .keepLocal: "Rent (phone)"
            case .useServer: "Rent (laptop)"
            case .merge: "Rent, agreed"
            }
        #expect(try await pair.entries().phone.map(\.title) == [expected])
        #expect(try await pair.entries().laptop.map(\.title) == [expected])
        #expect(try await pair.phone.service.conflicts().isEmpty)
    }

    @Test(
        "delete against a concurrent edit: the delete wins under every policy, and a late stale update does not bring it back",
        arguments: [ConflictPolicyName.lastWriteWins, .fieldLevel, .manual])
    func deleteWins(policy: ConflictPolicyName) async throws {
        // Remote delete against a local edit.
        let pair = try await DevicePair(policy: policy.policy)
        await pair.phone.service.stop()
        try await pair.edit(pair.phone, "title = 'edited offline'")
        try await pair.laptop.database.write { db in try db.execute(sql: "DELETE FROM entry") }
        try await pair.laptop.service.syncNow()
        pair.phone.service.start()
        try await pair.converge()
        #expect(try await pair.entries().phone.isEmpty)

        // Local delete against a remote edit.
        let groceries = try await pair.phone.addEntry("Groceries", amount: -50, account: pair.accountId)
        try await pair.converge()
        let groceriesId = try #require(try await pair.phone.serverId(ofEntry: groceries.id!))
        await pair.phone.service.stop()
        try await pair.phone.database.write { db in try db.execute(sql: "DELETE FROM entry") }
        try await pair.edit(pair.laptop, "amount = -60")
        try await pair.laptop.service.syncNow()
        pair.phone.service.start()
        try await pair.converge()
        #expect(try await pair.entries().laptop.isEmpty)

        // A stale update that arrives late (an old version, sent after the delete) is refused.
        let accountServerId = try #require(try await pair.phone.serverId(ofAccount: pair.accountId))
        let collection = try CollectionPath("accounts/\(accountServerId)/entries")
        let late = try await ServerConnection.connect(to: pair.server.url, clientId: "late")
        let reply = try await late.write([
            .update(
                in: collection, id: try DocumentID(groceriesId), fields: ["title": "stale"], baseVersion: 1,
                idempotencyKey: try ClientName(UUID().uuidString))
        ])
        guard case .conflict(_, let server) = reply else {
            throw TestFailure("the stale update was accepted: \(reply)")
        }
        #expect(server.deleted)
        try await pair.converge()
        #expect(try await pair.entries().phone.isEmpty)
        #expect(try await pair.entries().laptop.isEmpty)
    }

    @Test(
        "seeded runs with clocks an hour apart converge",
        arguments: [ConflictPolicyName.lastWriteWins, .fieldLevel])
    func skewedConvergence(policy: ConflictPolicyName) async throws {
        var options = DemoOptions()
        options.devices = 3
        options.operations = 300
        options.seed = 11
        options.policy = policy.policy
        options.clockSkew = .seconds(3600)
        let result = try await DemoScenario.run(options)
        #expect(result.isConverged, "\(result.report.firstDifferences)")
        #expect(result.duplicates == 0)
        #expect(result.lost == 0)
    }
}

/// Policies by name, for test arguments.
enum ConflictPolicyName: String, Sendable, CaseIterable, CustomTestStringConvertible {
    case lastWriteWins, fieldLevel, manual

    var policy: ConflictPolicy {
        switch self {
        case .lastWriteWins: .lastWriteWins
        case .fieldLevel: .fieldLevel
        case .manual: .manual
        }
    }

    var testDescription: String { rawValue }
}

extension ConflictResolution: CustomTestStringConvertible {
    public var testDescription: String {
        switch self {
        case .keepLocal: "keepLocal"
        case .useServer: "useServer"
        case .merge: "merge"
        }
    }
}
