import Foundation
import GRDB
import Synchronization
@_spi(Testing) import Tandem
import TandemServer
import TandemTesting
import TandemWire
import Testing

/// Devices against a server that fails on purpose: each fault alone, then the run must end
/// converged with every write on the server exactly once.
@Suite("Injected server faults")
struct FaultTests {
    /// A phone writes at least `minimum` entries while the server injects `plan`, and goes on
    /// writing until the fault under test has happened (`happened`): the faults are drawn at
    /// random, and a fixed number of writes may draw none. Then the faults stop and everything
    /// must converge, with no write lost or doubled.
    func writeThrough(
        _ plan: FaultPlan, minimum: Int = 40, until happened: @escaping @Sendable (FaultCounts) -> Bool
    ) async throws -> FaultCounts {
        let server = try await TestServer { $0.faults = plan }
        let device = { (name: String) in
            try TestDevice(name: name, serverURL: server.url) { configuration in
                configuration.maxAttempts = 1000  // transient faults must not fail rows for good
                configuration.requestTimeout = .seconds(2)
                configuration.maxBatchSize = 4  // many writes, so that many faults are drawn
            }
        }
        let phone = try device("phone")
        let laptop = try device("laptop")
        phone.service.start()
        laptop.service.start()
        let account = try await phone.addAccount("Household")
        var count = 0
        // Bounded by time, not by a number of writes: on a busy machine the first connection
        // can take seconds, and writes made before it reach the server only in a few pushes.
        let deadline = ContinuousClock.now + .seconds(60)
        while true {
            let counts = await server.server.faultCounts
            if count >= minimum && happened(counts) { break }
            guard ContinuousClock.now < deadline else {
                throw TestFailure("the fault did not happen in 60 s (\(count) writes): \(plan)")
            }
            try await phone.addEntry("Entry \(count)", amount: Int64(count), account: account.id!)
            count += 1
            // Past the minimum, one write at a time, each with time to be pushed (and drawn).
            if count % 10 == 0 || count > minimum { try await Task.sleep(for: .milliseconds(20)) }
        }
        try await waitUntil("most entries reached the server", timeout: .seconds(60)) {
            guard
                let entries = try await server.server.collections().first(where: { $0.rawValue.hasSuffix("/entries") })
            else { return false }
            return try await server.server.documents(in: entries).count >= count / 2
        }
        let counts = await server.server.faultCounts
        try await server.server.setFaults(nil)
        let report = try await Convergence.waitUntilQuiet(server: server, devices: [phone, laptop])
        #expect(report.isConverged, "\(report.firstDifferences)")
        let entries = try #require(try await server.server.collections().first { $0.rawValue.hasSuffix("/entries") })
        let titles = try await server.server.documents(in: entries).compactMap { $0.fields["title"]?.stringValue }
        #expect(titles.count == count, "every entry once on the server")
        #expect(Set(titles).count == titles.count, "no entry twice")
        #expect(try await server.server.documents(in: try CollectionPath("accounts")).count == 1)
        return counts
    }

    @Test("acknowledgements lost after the commit: resends get the first answer, nothing doubles")
    func lostAcks() async throws {
        let counts = try await writeThrough(FaultPlan(seed: 3, lostAckRate: 0.3)) { $0.lostAcks > 0 }
        #expect(counts.lostAcks > 0)
    }

    @Test("writes refused without being applied are sent again")
    func rejectedWrites() async throws {
        let counts = try await writeThrough(FaultPlan(seed: 4, rejectedWriteRate: 0.3)) { $0.rejectedWrites > 0 }
        #expect(counts.rejectedWrites > 0)
    }

    @Test("connections dropped at random and at their fifth message: devices reconnect and resume")
    func droppedConnections() async throws {
        let counts = try await writeThrough(FaultPlan(seed: 5, dropConnectionRate: 0.05, dropConnectionAfter: 5)) {
            $0.droppedConnections > 0
        }
        #expect(counts.droppedConnections > 0)
    }

    @Test("listeners the server fails with internal are listened to again on the same connection, and converge")
    func failedListens() async throws {
        // Half of all listens fail, and stay failing at that rate until the end: the devices
        // must get past them by listening again, not by the faults stopping or a reconnect.
        let server = try await TestServer { $0.faults = FaultPlan(seed: 9, failedListenRate: 0.5) }
        let connects = Mutex(0)
        let device = { (name: String) in
            try TestDevice(name: name, serverURL: server.url) { configuration in
                configuration.reconnectDelay = .milliseconds(20)
                configuration.hooks.beforeConnect = { connects.withLock { $0 += 1 } }
            }
        }
        let phone = try device("phone")
        let laptop = try device("laptop")
        phone.service.start()
        laptop.service.start()
        for name in ["Household", "Travel", "Savings"] {
            let account = try await phone.addAccount(name)
            try await phone.addEntry("First of \(name)", amount: -1, account: account.id!)
        }
        // Each device listens to accounts and to three entry collections: at least one of
        // those eight listens (each failing at 1 in 2) has failed, or the seed is not 9.
        let report = try await Convergence.waitUntilQuiet(server: server, devices: [phone, laptop])
        #expect(report.isConverged, "\(report.firstDifferences)")
        #expect(await server.server.faultCounts.failedListens > 0)
        #expect(connects.withLock { $0 } == 2, "no device reconnected to get past a failed listener")
        #expect(try await laptop.entries().count == 3)
    }

    @Test("deliveries delayed at random arrive late but in commit order")
    func delayedDeliveries() async throws {
        let server = try await TestServer {
            $0.faults = FaultPlan(seed: 6, delayedDeliveryRate: 0.5, deliveryDelay: .milliseconds(50))
        }
        let listener = try await ServerConnection.connect(to: server.url, clientId: "listener")
        let writer = try await ServerConnection.connect(to: server.url, clientId: "writer")
        defer {
            listener.close()
            writer.close()
        }
        let versions = Mutex<[Int64]>([])
        let notes = try CollectionPath("notes")
        listener.listen(to: notes) { event in
            guard case .snapshot(let snapshot) = event else { return }
            versions.withLock { $0 += snapshot.changes.map(\.document.version) }
        }
        let id = try DocumentID("n1")
        _ = try await writer.write([.create(in: notes, id: id, fields: ["n": 0], idempotencyKey: .random())])
        for index in 1..<30 {
            _ = try await writer.write([
                .update(
                    in: notes, id: id, fields: ["n": .int(Int64(index))], baseVersion: nil, idempotencyKey: .random())
            ])
        }
        try await waitUntil("every version arrived") { versions.withLock { $0.last } == 30 }
        #expect(versions.withLock { $0 } == Array(1...30))
        #expect(await server.server.faultCounts.delayedDeliveries > 0)
    }

    @Test("deliveries held by the test reach the device when released")
    func heldDeliveries() async throws {
        let pair = try await DevicePair()
        await pair.server.server.holdDeliveries()
        let account = try #require(
            try await pair.laptop.database.read { db in try Int64.fetchOne(db, sql: "SELECT id FROM account") })
        try await pair.laptop.addEntry("Groceries", amount: -40, account: account)
        try await pair.laptop.service.syncNow()
        // The delivery to the phone exists and is held: it cannot have arrived.
        try await waitUntil("the phone's delivery is held") { await pair.server.server.stats.heldMessages > 0 }
        #expect(try await pair.phone.entries().count == 1, "the phone has not heard of it yet")
        await pair.server.server.releaseDeliveries()
        try await waitUntil("the phone hears of it") { try await pair.phone.entries().count == 2 }
        try await pair.converge()
    }

    @Test("the same seed makes the same decisions for the same messages")
    func replay() async throws {
        func pattern() async throws -> [Bool] {
            let server = try await TestServer { $0.faults = FaultPlan(seed: 42, rejectedWriteRate: 0.5) }
            let client = try await ServerConnection.connect(to: server.url, clientId: "replay")
            defer { client.close() }
            var refused: [Bool] = []
            for index in 0..<40 {
                do {
                    _ = try await client.write([
                        .create(
                            in: try CollectionPath("notes"), fields: ["i": .int(Int64(index))],
                            idempotencyKey: .random())
                    ])
                    refused.append(false)
                } catch {
                    refused.append(true)
                }
            }
            return refused
        }
        let first = try await pattern()
        #expect(first.contains(true) && first.contains(false))
        #expect(try await pattern() == first)
    }

    @Test(
        "a push answered 'outcome-unknown' (the server's disk failed every sync) is resent under the same keys, and is not a failed attempt",
        .enabled(if: TestServer.storeKind == "sqlite"))
    func outcomeUnknownResent() async throws {
        FailingDisk.install()
        let server = try await TestServer { $0.commitOutcomeTimeout = .milliseconds(300) }
        defer { FailingDisk.heal(FailingDisk.log(of: server)) }
        let sent = Seen<[ClientName]>()
        let phone = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            // One failed attempt would fail the rows for good: the unknown answer must not count.
            configuration.maxAttempts = 1
            configuration.hooks.beforeSend = { ops in sent.append(ops.map(\.idempotencyKey)) }
        }
        phone.service.start()
        try await waitUntil("the phone is connected") { phone.service.status.isConnected }
        FailingDisk.failSyncs(ofFileEndingWith: FailingDisk.log(of: server), count: nil)
        let account = try await phone.addAccount("Household")
        try await waitUntil("the phone hears 'outcome-unknown'", timeout: .seconds(60)) {
            phone.service.status.lastError?.serverError?.code == .outcomeUnknown
        }
        FailingDisk.heal(FailingDisk.log(of: server))
        try await waitUntil("the account is on the server", timeout: .seconds(60)) {
            try await phone.serverId(ofAccount: account.id!) != nil
        }
        #expect(phone.service.status.failedCount == 0)
        #expect(try await phone.service.failedRecords().isEmpty)
        // Every push of the account carried the key of the first.
        let keys = Set(sent.all.flatMap { $0 })
        #expect(keys.count == 1, "\(sent.all)")
        let accounts = try #require(try await server.server.collections().first { $0.rawValue == "accounts" })
        #expect(try await server.server.documents(in: accounts).count == 1)
    }
}
