import Foundation
import GRDB
import Tandem
import TandemTesting
import TandemWire
import Testing

@Suite("Two devices sync a shared account")
struct BasicSyncTests {
    @Test("an account and its entries created on one device appear on the other")
    func createAndReceive() async throws {
        let server = try await TestServer()
        let phone = try TestDevice(name: "phone", serverURL: server.url)
        let laptop = try TestDevice(name: "laptop", serverURL: server.url)
        phone.service.start()
        laptop.service.start()

        let account = try await phone.addAccount("Household")
        try await phone.addEntry("Rent", amount: -120_000, account: account.id!)
        try await phone.addEntry("Salary", amount: 300_000, account: account.id!)

        try await waitUntil("the laptop has both entries") { try await laptop.entries().count == 2 }
        let titles = try await laptop.entries().map(\.title).sorted()
        #expect(titles == ["Rent", "Salary"])
        let accounts = try await laptop.accounts()
        #expect(accounts.map(\.name) == ["Household"])
        #expect(try await laptop.entries().allSatisfy { $0.accountId == accounts[0].id! })

        let report = try await Convergence.waitUntilQuiet(server: server, devices: [phone, laptop])
        #expect(report.isConverged, "\(report.firstDifferences)")
        #expect(report.serverDocuments == 3)
    }

    @Test("edits and deletes travel both ways")
    func editsAndDeletes() async throws {
        let server = try await TestServer()
        let phone = try TestDevice(name: "phone", serverURL: server.url)
        let laptop = try TestDevice(name: "laptop", serverURL: server.url)
        phone.service.start()
        laptop.service.start()
        let account = try await phone.addAccount("Household")
        let rent = try await phone.addEntry("Rent", amount: -100, account: account.id!)
        try await waitUntil("the laptop has the entry") { try await laptop.entries().count == 1 }

        let onLaptop = try await laptop.entries()[0]
        try await laptop.database.write { db in
            try db.execute(sql: "UPDATE entry SET title = 'Rent (March)' WHERE id = ?", arguments: [onLaptop.id!])
        }
        try await waitUntil("the phone sees the edit") { try await phone.entries().first?.title == "Rent (March)" }

        _ = try await phone.database.write { db in try CashFlow.Entry.deleteOne(db, key: rent.id!) }
        try await waitUntil("the laptop sees the delete") { try await laptop.entries().isEmpty }
        let report = try await Convergence.waitUntilQuiet(server: server, devices: [phone, laptop])
        #expect(report.isConverged, "\(report.firstDifferences)")
    }

    @Test("a private account stays on its device")
    func privateStaysLocal() async throws {
        let server = try await TestServer()
        let phone = try TestDevice(name: "phone", serverURL: server.url)
        phone.service.start()
        let secret = try await phone.addAccount("Secret", shared: false)
        try await phone.addEntry("Gift", amount: -50, account: secret.id!)
        try await phone.service.syncNow()
        #expect(try await server.server.collections().isEmpty)
        #expect(phone.service.status.pendingCount == 0, "unshared rows are not pending")
    }
}
