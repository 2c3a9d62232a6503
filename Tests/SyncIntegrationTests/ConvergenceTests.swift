import Foundation
import Tandem
import TandemTesting
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
