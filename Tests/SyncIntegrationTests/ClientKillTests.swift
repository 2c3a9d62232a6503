import Foundation
import GRDB
import Synchronization
@_spi(Testing) import Tandem
import TandemServer
import TandemTesting
import TandemWire
import Testing

/// Devices in processes of their own, killed with SIGKILL at a hook, then reopened from the
/// same SQLite file: nothing committed is lost, nothing half-done is kept, and what was sent
/// goes out again under the same idempotency keys.
@Suite("A device killed with SIGKILL")
struct ClientKillTests {
    /// The ops a device's database holds for sending, by idempotency key: what is left of its
    /// outbox, read from the file the killed process left (keys recorded on rows, and creates
    /// listed in batch entries, each under `batchKey-rowId`).
    static func outbox(_ folder: TemporaryDirectory, _ name: String) throws -> [String: String] {
        let database = try DatabaseQueue(path: folder.path("\(name).sqlite"))
        return try database.read { db in
            try Row.fetchAll(
                db,
                sql: """
                    SELECT idempotencyKey, tableName || '#' || rowId FROM tandem_row WHERE idempotencyKey IS NOT NULL
                    UNION ALL
                    SELECT s.key || '-' || sent.key, s.tableName || '#' || sent.key
                    FROM tandem_sending AS s, json_each(s.rows) AS sent
                    """
            ).reduce(into: [:]) { keys, row in keys[row[0]] = row[1] }
        }
    }

    /// Live documents on the server by collection kind (`accounts`, `entries`), and how many
    /// distinct entry uids there are.
    static func serverCounts(_ server: TestServer) async throws -> (accounts: Int, entries: Int, entryUids: Int) {
        var accounts = 0
        var entries: [Document] = []
        for collection in try await server.server.collections() {
            let documents = try await server.server.documents(in: collection)
            if collection.rawValue == "accounts" { accounts += documents.count } else { entries += documents }
        }
        return (accounts, entries.count, Set(entries.compactMap { $0.fields["uid"]?.stringValue }).count)
    }

    @Test(
        "killed after the server acknowledged a push, before the write-back: the outbox is intact, the resend uses the same keys, nothing doubles"
    )
    func killedMidPush() async throws {
        let (server, folder, held) = try await Self.killDuringPush()
        // The server applied what it acknowledged; the device never recorded the answer.
        let before = try await Self.serverCounts(server)
        #expect(before.entries > 0, "the server has the acknowledged entries (\(held))")
        let keys = try Self.outbox(folder, "phone")
        #expect(keys.count >= before.entries, "every sent op keeps its key on disk")

        let resent = Seen<String>()
        let reopened = try TestDevice(name: "phone", serverURL: server.url, folder: folder) { configuration in
            configuration.hooks.beforeSend = { ops in ops.forEach { resent.append($0.idempotencyKey.rawValue) } }
        }
        #expect(try await reopened.entries().count == 30, "the local rows survived the kill")
        let laptop = try TestDevice(name: "laptop", serverURL: server.url)
        reopened.service.start()
        laptop.service.start()
        let report = try await Convergence.waitUntilQuiet(server: server, devices: [reopened, laptop])
        #expect(report.isConverged, "\(report.firstDifferences)")

        #expect(
            Set(keys.keys).isSubset(of: Set(resent.all)), "the ops sent before the kill went out again with their keys")
        let after = try await Self.serverCounts(server)
        #expect(after.accounts == 1 && after.entries == 30 && after.entryUids == 30, "\(after)")
        #expect(try await laptop.entries().count == 30)
        #expect(try await reopened.entries().count == 30)
        #expect(reopened.service.status.pendingCount == 0)
    }

    @Test("the same kill with the keys forgotten before the reopen makes duplicates: the test above can fail")
    func killedMidPushForgettingKeys() async throws {
        let (server, folder, _) = try await Self.killDuringPush()
        let database = try DatabaseQueue(path: folder.path("phone.sqlite"))
        try await database.write { db in
            try db.execute(sql: "UPDATE tandem_row SET idempotencyKey = NULL")
            try db.execute(sql: "DELETE FROM tandem_sending")
        }
        try database.close()

        let reopened = try TestDevice(name: "phone", serverURL: server.url, folder: folder)
        reopened.service.start()
        let report = try await Convergence.waitUntilQuiet(server: server, devices: [reopened])
        #expect(report.isConverged, "\(report.firstDifferences)")
        let after = try await Self.serverCounts(server)
        #expect(after.entryUids == 30)
        #expect(after.entries > after.entryUids, "the resends under new keys were created again: \(after)")
    }

    /// A phone with a synced account writes 30 entries in a process of its own, which is
    /// killed with SIGKILL once the server acknowledged their push, before the answer is
    /// written back.
    static func killDuringPush() async throws -> (TestServer, TemporaryDirectory, held: String) {
        let server = try await TestServer()
        let folder = try TemporaryDirectory(prefix: "tandem-killed-phone")
        // The account is synced first, so that the push the kill interrupts is of entries.
        do {
            let phone = try TestDevice(name: "phone", serverURL: server.url, folder: folder)
            phone.service.start()
            try await phone.addAccount("Household")
            _ = try await phone.service.syncNow()
            await phone.service.stop()
        }
        let phone = try DeviceProcess([
            "--server", server.url, "--folder", folder.url.path, "--name", "phone", "--entries", "30",
            "--hold-at", "push",
        ])
        let held = try await phone.waitForLine(prefix: "held:")
        await phone.kill()
        return (server, folder, held)
    }

    @Test(
        "killed inside the transaction applying a snapshot: nothing of it is kept, the resume token neither; reopened, it converges without duplicates"
    )
    func killedMidApply() async throws {
        let server = try await TestServer()
        let laptop = try TestDevice(name: "laptop", serverURL: server.url)
        laptop.service.start()
        let account = try await laptop.addAccount("Household")
        for index in 0..<30 { try await laptop.addEntry("entry \(index)", amount: Int64(index), account: account.id!) }
        _ = try await laptop.service.syncNow()
        try await waitUntil("the laptop pushed everything") {
            try await Self.serverCounts(server).entries == 30
        }

        let folder = try TemporaryDirectory(prefix: "tandem-killed-phone")
        let phone = try DeviceProcess([
            "--server", server.url, "--folder", folder.url.path, "--name", "phone", "--entries", "5",
            "--hold-at", "apply",
        ])
        _ = try await phone.waitForLine(prefix: "held:")
        await phone.kill()

        // The transaction was open when the process died: SQLite kept none of it.
        let database = try DatabaseQueue(path: folder.path("phone.sqlite"))
        let (household, tokens) = try await database.read { db in
            (
                try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM account WHERE name = 'Household'") ?? 0,
                try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM tandem_listener WHERE resumeToken IS NOT NULL") ?? 0
            )
        }
        #expect(household == 0, "no row of the unfinished apply")
        #expect(tokens == 0, "no resume token of the unfinished apply")
        try database.close()

        let reopened = try TestDevice(name: "phone", serverURL: server.url, folder: folder)
        reopened.service.start()
        let report = try await Convergence.waitUntilQuiet(server: server, devices: [reopened, laptop])
        #expect(report.isConverged, "\(report.firstDifferences)")
        let after = try await Self.serverCounts(server)
        #expect(after.accounts == 2 && after.entries == 35 && after.entryUids == 35, "\(after)")
        #expect(try await reopened.entries().count == 35)
        let phoneUids = try await reopened.database.read { db in
            try Int.fetchOne(db, sql: "SELECT COUNT(DISTINCT uid) FROM entry") ?? 0
        }
        #expect(phoneUids == 35, "no entry twice on the phone")
        #expect(try await laptop.entries().count == 35)
    }
}
