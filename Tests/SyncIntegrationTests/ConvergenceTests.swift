import TandemScenarios
import Foundation
import Synchronization
@_spi(Testing) import Tandem
import TandemServer
import TandemTesting
import TandemWire
import Testing

@Suite("Convergence")
struct ConvergenceTests {
    @Test("local writes succeed with the server down; on reconnect everything converges")
    func offline() async throws {
        let server = try await TestServer()
        let phone = try TestDevice(name: "phone", serverURL: server.url)
        let laptop = try TestDevice(name: "laptop", serverURL: server.url)
        phone.service.start()
        laptop.service.start()
        let account = try await phone.addAccount("Household")
        _ = try await Convergence.waitUntilQuiet(server: server, devices: [phone, laptop])

        await server.stop()
        try await waitUntil("the phone notices") { !phone.service.status.isConnected }
        for index in 0..<10 { try await phone.addEntry("Offline \(index)", amount: Int64(index), account: account.id!) }
        try await laptop.addEntry("Also offline", amount: 1, account: try laptop.accounts()[0].id!)
        #expect(try await phone.entries().count == 10)
        try await waitUntil("the phone counts them pending") { phone.service.status.pendingCount == 10 }
        await #expect(throws: TandemError.self) { try await phone.service.syncNow(connectionWait: .milliseconds(50)) }

        try await server.start()
        let report = try await Convergence.waitUntilQuiet(server: server, devices: [phone, laptop])
        #expect(report.isConverged, "\(report.firstDifferences)")
        #expect(try await laptop.entries().count == 11)
        #expect(try await phone.entries().count == 11)
    }

    /// The route the code left open to the flake of `RaceTests.snapshotBeforeFirstPush` (one run
    /// in about seventy, loaded, over TLS; found by reading, not seen in that run): the comparison
    /// read the server before the laptop's entry arrived there and the phone after, and called
    /// the phone, which did not have the entry yet, converged.
    @Test("a comparison during which the server changes does not report convergence")
    func serverChangesDuringComparison() async throws {
        let server = try await TestServer()
        let laptop = try TestDevice(name: "laptop", serverURL: server.url)
        let rentArrived = Checkpoint()
        let phone = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.hooks.beforeApply = { snapshot in
                if snapshot.changes.contains(where: { $0.document.fields["title"] == "Rent" }) { rentArrived.pause() }
            }
        }
        laptop.service.start()
        phone.service.start()
        let household = try await laptop.addAccount("Household")
        #expect(try await Convergence.waitUntilQuiet(server: server, devices: [laptop, phone]).isConverged)

        // The laptop pushes its entry right after the comparison's first read of the server; the
        // phone's apply of it is held, so the phone is read without it.
        let changing = ServerChangedAfterFirstRead(server.server) {
            try await laptop.addEntry("Rent", amount: -100, account: household.id!)
            try await laptop.service.syncNow()
        }
        let report = try await Convergence.compare(server: changing, devices: [(phone.name, phone.service)])
        #expect(!report.isConverged, "the phone does not have the entry the server holds now")
        #expect(report.firstDifferences.contains { $0.contains("phone misses") }, "\(report.firstDifferences)")

        rentArrived.release()
        let quiet = try await Convergence.waitUntilQuiet(server: server, devices: [laptop, phone])
        #expect(quiet.isConverged, "\(quiet.firstDifferences)")
        #expect(try await phone.entries().map(\.title) == ["Rent"])
    }

    @Test(
        "three devices and two hundred seeded random operations with random disconnects converge",
        arguments: [UInt64(1), 2, 3])
    func randomRun(seed: UInt64) async throws {
        let result = try await DemoScenario.run(Self.options(devices: 3, operations: 200, seed: seed))
        #expect(result.report.isConverged, "seed \(seed): \(result.report.firstDifferences)")
        #expect(result.duplicates == 0)
        #expect(result.lost == 0)
        #expect((result.operations["offline"] ?? 0) > 0, "the run took devices offline")
        #expect(result.entries > 0)
    }

    @Test(
        "tandem demo --shared-accounts: four devices of three users, each syncing only the accounts it shares, converge as members come and go",
        arguments: [UInt64(1), 2])
    func sharedAccountsRun(seed: UInt64) async throws {
        let result = try await SharedAccountsDemo.run(Self.options(devices: 4, operations: 300, seed: seed))
        #expect(result.isConverged, "seed \(seed): \(result.report.firstDifferences)")
        #expect(result.lost == 0)
        #expect((result.operations["added"] ?? 0) + (result.operations["removed"] ?? 0) > 0)
    }

    static func options(devices: Int, operations: Int, seed: UInt64) -> DemoOptions {
        var options = DemoOptions()
        options.devices = devices
        options.operations = operations
        options.seed = seed
        options.offlineFraction = 0.3
        return options
    }
}

/// A server whose documents `change` changes once, right after the first time its collections
/// are read.
final class ServerChangedAfterFirstRead: ServerContents, Sendable {
    private let server: TandemServer
    private let change: @Sendable () async throws -> Void
    private let changed = Mutex(false)

    init(_ server: TandemServer, change: @escaping @Sendable () async throws -> Void) {
        self.server = server
        self.change = change
    }

    func collections() async throws -> [CollectionPath] {
        let collections = try await server.collections()
        if changed.withLock({ changed in
            defer { changed = true }
            return !changed
        }) {
            try await change()
        }
        return collections
    }

    func documents(in collection: CollectionPath) async throws -> [Document] {
        try await server.documents(in: collection)
    }

    func everyDocument() async throws -> [(collection: CollectionPath, document: Document)] {
        try await server.everyDocument()
    }
}
