import Foundation
import GRDB
import Synchronization
@_spi(Testing) import Tandem
import TandemTesting
import TandemWire
import Testing

/// The races the sync queue's barrier exists for, forced with checkpoints instead of timing.
@Suite("Race conditions, forced at the hooks")
struct RaceTests {
    /// Creates an account on a device held after the server's ack, waits until the listener's
    /// echo of it has arrived, then lets the write-back go.
    private func createWithEchoBeforeWriteBack(_ serialization: Serialization) async throws
        -> (device: TestDevice, serverId: DocumentID, server: TestServer)
    {
        let server = try await TestServer()
        let afterAck = Checkpoint()
        let acknowledged = Seen<DocumentID>()
        let received = Seen<ServerMessage.Snapshot>()
        let applied = Seen<ServerMessage.Snapshot>()
        let device = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.serialization = serialization
            // The echo on the connection that wrote: what a device hears after a reconnect too.
            configuration.receivesOwnWrites = true
            configuration.hooks.afterAck = { results in
                results.forEach { acknowledged.append($0.id) }
                afterAck.pause()
            }
            configuration.hooks.snapshotReceived = { received.append($0) }
            configuration.hooks.afterApply = { applied.append($0) }
        }
        device.service.start()
        try await device.waitUntilConnected()
        try await waitUntil("the accounts listener is current") { applied.count >= 1 }

        try await device.addAccount("Household")
        try await afterAck.reached()
        let serverId = try #require(acknowledged.all.first)
        try await waitUntil("the echo of the create has arrived") { received.all.contains { $0.contains(serverId) } }
        if serialization == .unserialized {
            try await waitUntil("the echo was applied, concurrently with the held push") {
                applied.all.contains { $0.contains(serverId) }
            }
        } else {
            #expect(!applied.all.contains { $0.contains(serverId) }, "the echo must wait behind the push barrier")
            #expect(try device.accountCount() == 1)
        }
        afterAck.release()
        try await device.service.syncNow()
        try await waitUntil("the echo was applied") { applied.all.contains { $0.contains(serverId) } }
        return (device, serverId, server)
    }

    @Test("duplicate-creation race: with the barrier, the echo finds the row by its new server id")
    func echoAfterWriteBack() async throws {
        let (device, serverId, server) = try await createWithEchoBeforeWriteBack(.barrier)
        #expect(try device.accountCount() == 1)
        #expect(try await device.serverId(ofAccount: device.accounts()[0].id!) == serverId.rawValue)
        #expect(try await device.service.unsyncedRowCount() == 0)
        #expect(try await serverDocuments(server, "accounts").count == 1)
    }

    @Test("duplicate-creation race: without the barrier the echo is inserted a second time (the test catches it)")
    func echoWithoutBarrier() async throws {
        let (device, serverId, server) = try await createWithEchoBeforeWriteBack(.unserialized)
        #expect(try device.accountCount() == 2, "the race produces a duplicate row")
        #expect(try await device.service.unsyncedRowCount() == 1)
        let failures = try await device.service.failedRecords()
        #expect(failures.count == 1)
        #expect(failures.first?.error.code == .database)
        #expect(failures.first?.error.message.contains("duplicate") == true)
        #expect(try await serverDocuments(server, "accounts").map(\.id) == [serverId])
    }

    @Test("an edit made while its push is in flight is not lost: the row stays dirty and goes out on the new base")
    func editDuringPush() async throws {
        let server = try await TestServer()
        let afterAck = Checkpoint()
        let device = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.hooks.afterAck = { _ in afterAck.pause() }
        }
        device.service.start()
        try await device.waitUntilConnected()
        let account = try await device.addAccount("Househld")
        try await afterAck.reached()
        try await device.database.write { db in
            try db.execute(sql: "UPDATE account SET name = 'Household' WHERE id = ?", arguments: [account.id!])
        }
        afterAck.release()

        try await waitUntil("the server has the edit") {
            try await serverDocuments(server, "accounts").first?.version == 2
        }
        let document = try #require(try await serverDocuments(server, "accounts").first)
        #expect(document.fields["name"] == "Household")
        try await waitUntil("the row is clean") {
            try await device.database.read { db in
                try Bool.fetchOne(db, sql: "SELECT isDirty FROM account WHERE id = ?", arguments: [account.id!])
                    == false
            }
        }
        #expect(try await device.serverId(ofAccount: account.id!) == document.id.rawValue)
    }

    /// The write-back takes the rows of one table in groups of up to 64 per statement. Each row
    /// still gets its own outcome: one edited and one deleted while the push was held, in the
    /// first group of 64 and in the group of 4 after it.
    @Test("a write-back of 70 rows at once: rows edited or deleted meanwhile keep their own fate")
    func groupedWriteBack() async throws {
        let server = try await TestServer()
        let afterAck = Checkpoint()
        let sent = Seen<String>()
        let device = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.hooks.beforeSend = { ops in ops.forEach { sent.append($0.idempotencyKey.rawValue) } }
            configuration.hooks.afterAck = { _ in afterAck.pause() }
        }
        let ids = try await device.database.write { db in
            try (0..<70).map { index in
                var account = CashFlow.Account(name: "a\(index)", isShared: true)
                try account.insert(db)
                return account.id!
            }
        }
        device.service.start()
        try await afterAck.reached()
        // The creates were recorded before the batch went out: the batch's entry lists each row
        // and the revision it carried, and each create's key is the entry's key and its row id.
        let entries = try device.database.read { db in
            try Row.fetchAll(db, sql: "SELECT key, tableName, rows FROM tandem_sending")
        }
        #expect(entries.count == 1)
        let entry = try #require(entries.first)
        #expect(entry["tableName"] == "account")
        let listed = try JSONDecoder().decode([String: Int64].self, from: Data((entry["rows"] as String).utf8))
        #expect(listed.keys.compactMap { Int64($0) }.sorted() == ids)
        #expect(Set(sent.all) == Set(ids.map { "\(entry["key"] as String)-\($0)" }))
        #expect(sent.all.count == 70)
        #expect(
            try await device.database.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM tandem_row") } == 0)
        try await device.database.write { db in
            for index in [3, 66] {
                try db.execute(sql: "UPDATE account SET name = 'edited' WHERE id = ?", arguments: [ids[index]])
            }
            for index in [10, 67] { try db.execute(sql: "DELETE FROM account WHERE id = ?", arguments: [ids[index]]) }
        }
        // A listed row the app deletes gets the entry of a sent create, which the answer makes
        // a filed delete.
        let deletedEntries = try device.database.read { db in
            try Row.fetchAll(db, sql: "SELECT rowId, idempotencyKey, pendingOp FROM tandem_row ORDER BY rowId")
        }
        #expect(deletedEntries.map { $0["rowId"] as Int64 } == [ids[10], ids[67]])
        #expect(deletedEntries.allSatisfy { $0["pendingOp"] == "create" })
        #expect(
            deletedEntries.map { $0["idempotencyKey"] as String }
                == [10, 67].map { "\(entry["key"] as String)-\(ids[$0])" })
        afterAck.release()

        try await waitUntil("the server has the edits and the deletes") {
            let documents = try await serverDocuments(server, "accounts")
            return documents.count == 68 && documents.filter { $0.fields["name"] == "edited" }.count == 2
        }
        try await waitUntil("every row is clean") {
            try await device.database.read { db in
                try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM account WHERE isDirty = 1") == 0
            }
        }
        let rows = try device.database.read { db in
            try Row.fetchAll(db, sql: "SELECT name, serverId, serverVersion FROM account ORDER BY id")
        }
        let documents = try await serverDocuments(server, "accounts")
        let byId = Dictionary(uniqueKeysWithValues: documents.map { ($0.id.rawValue, $0) })
        #expect(rows.count == 68)
        for row in rows {
            let document = try #require(byId[row["serverId"] as String? ?? ""], "\(row)")
            #expect(document.fields["name"]?.stringValue == row["name"])
            #expect(document.version == row["serverVersion"])
        }
        #expect(try await device.service.unsyncedRowCount() == 0)
        #expect(try await device.service.failedRecords().isEmpty)
        #expect(
            try await device.database.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM tandem_row") } == 0)
        #expect(
            try await device.database.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM tandem_sending") }
                == 0)
    }

    /// Without the barrier, the echoes of three creates are inserted before their write-back;
    /// the group's statement then meets their server ids, and the row-by-row pass names each.
    @Test("a grouped write-back that meets duplicates fails each of them, and only them")
    func groupedWriteBackWithDuplicates() async throws {
        let server = try await TestServer()
        let afterAck = Checkpoint()
        let applied = Seen<ServerMessage.Snapshot>()
        let device = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.serialization = .unserialized
            configuration.hooks.afterAck = { _ in afterAck.pause() }
            configuration.hooks.afterApply = { applied.append($0) }
        }
        device.service.start()
        try await device.waitUntilConnected()
        try await waitUntil("the accounts listener is current") { applied.count >= 1 }
        try await device.database.write { db in
            for name in ["a", "b", "c"] {
                var account = CashFlow.Account(name: name, isShared: true)
                try account.insert(db)
            }
        }
        try await afterAck.reached()
        try await waitUntil("the three echoes were inserted") { try device.accountCount() == 6 }
        afterAck.release()
        try await waitUntil("the three creates failed as duplicates") {
            try await device.service.failedRecords().count == 3
        }
        let failures = try await device.service.failedRecords()
        #expect(failures.allSatisfy { $0.error.code == .database && $0.error.message.contains("duplicate") })
        #expect(try await serverDocuments(server, "accounts").count == 3)
    }

    @Test("a lost acknowledgement: the resend with the same idempotency key yields the same server id and one document")
    func lostAcknowledgement() async throws {
        let server = try await TestServer()
        let drops = AcknowledgementDropper(dropping: 1)
        let keys = Seen<String>()
        let device = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.hooks.beforeSend = { ops in ops.forEach { keys.append($0.idempotencyKey.rawValue) } }
            configuration.hooks.dropAcknowledgement = drops.dropsThis
        }
        device.service.start()
        try await device.waitUntilConnected()
        let account = try await device.addAccount("Household")
        try await waitUntil("the row has its server id after the resend") {
            try await device.serverId(ofAccount: account.id!) != nil
        }
        let documents = try await serverDocuments(server, "accounts")
        #expect(documents.count == 1)
        #expect(try await device.serverId(ofAccount: account.id!) == documents.first?.id.rawValue)
        #expect(keys.count >= 2)
        #expect(Set(keys.all).count == 1, "the resend reused the first key")
    }

    @Test(
        "a create whose acknowledgement was lost is recognized by its key when its document arrives through the listener"
    )
    func lostAcknowledgementAdoptedFromListener() async throws {
        let server = try await TestServer()
        let drops = AcknowledgementDropper(dropping: 1)
        let device = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            // One lost answer exhausts the attempts: the row is failed and not pushed again, so
            // its document first comes back through the listener.
            configuration.maxAttempts = 1
            configuration.hooks.dropAcknowledgement = drops.dropsThis
        }
        device.service.start()
        try await device.waitUntilConnected()
        let account = try await device.addAccount("Household")
        try await waitUntil("the listener's document gave the row its server id") {
            try await device.serverId(ofAccount: account.id!) != nil
        }
        #expect(try device.accountCount() == 1)
        await #expect(
            try serverDocuments(server, "accounts").map(\.id.rawValue) == [try device.serverId(ofAccount: account.id!)])
        #expect(try await device.service.failedRecords().isEmpty)
        let report = try await Convergence.waitUntilQuiet(server: server, devices: [device])
        #expect(report.isConverged, "\(report.firstDifferences)")
    }

    /// A phone for which one lost answer fails the row at once (so its document first comes
    /// back through the listener) and which stays away once its connection drops.
    private func phoneThatGivesUp(_ server: TestServer, _ drops: AcknowledgementDropper) throws -> TestDevice {
        try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.maxAttempts = 1
            configuration.reconnectDelay = .seconds(30)
            configuration.maxReconnectDelay = .seconds(30)
            configuration.hooks.dropAcknowledgement = drops.dropsThis
        }
    }

    @Test("a create whose answer was lost and whose row was deleted here meanwhile is deleted on the server too")
    func unansweredCreateDeletedLocally() async throws {
        let server = try await TestServer()
        let drops = AcknowledgementDropper(dropping: 1)
        let phone = try phoneThatGivesUp(server, drops)
        phone.service.start()
        // The create reaches the server but its answer is lost; the phone goes away.
        let account = try await phone.addAccount("Household")
        try await waitUntil("the create failed for the phone") { try await phone.service.failedRecords().count == 1 }
        await phone.service.stop()
        #expect(try await serverDocuments(server, "accounts").count == 1)
        #expect(try await phone.serverId(ofAccount: account.id!) == nil, "the phone never learned the document's id")

        // Deleted here before the phone ever learned the document's id.
        try await phone.database.write { db in
            try db.execute(sql: "DELETE FROM account WHERE id = ?", arguments: [account.id!])
        }
        phone.service.start()
        // The listener brings the document with the create's key: it is this phone's own, and
        // its delete goes out.
        try await waitUntil("the server's document is deleted") {
            try await serverDocuments(server, "accounts").isEmpty
        }
        try await waitUntil("nothing pending or failed") {
            phone.service.status.pendingCount == 0 && phone.service.status.failedCount == 0
        }
        #expect(try phone.accountCount() == 0)
        await phone.service.stop()
    }

    @Test("a create whose answer was lost and whose document was deleted meanwhile is removed, not resurrected")
    func unansweredCreateDeletedRemotely() async throws {
        let server = try await TestServer()
        let laptop = try TestDevice(name: "laptop", serverURL: server.url)
        laptop.service.start()
        let drops = AcknowledgementDropper(dropping: 0)
        let phone = try phoneThatGivesUp(server, drops)
        phone.service.start()
        let account = try await phone.addAccount("Household")
        _ = try await Convergence.waitUntilQuiet(server: server, devices: [laptop, phone])

        // The phone's create reaches the server but its answer is lost; the phone stays away.
        drops.drop(next: 1)
        let entry = try await phone.addEntry("Rent", amount: -100, account: account.id!)
        try await waitUntil("the create failed for the phone") { try await phone.service.failedRecords().count == 1 }
        await phone.service.stop()

        // Meanwhile the laptop gets the entry and deletes it.
        try await waitUntil("the laptop has the entry") { try await laptop.entries().count == 1 }
        try await laptop.database.write { db in try db.execute(sql: "DELETE FROM entry") }
        try await laptop.service.syncNow()

        // Back online, the phone hears of the delete of a document it never learned the id of.
        phone.service.start()
        try await waitUntil("the phone dropped its row") { try await phone.entries().isEmpty }
        try await phone.service.retryFailed()
        let report = try await Convergence.waitUntilQuiet(server: server, devices: [laptop, phone])
        #expect(report.isConverged, "\(report.firstDifferences)")
        #expect(try await phone.entries().isEmpty)
        _ = entry
    }

    @Test("an edit made after an update's answer was lost is pushed, not taken for pushed by the resend")
    func editAfterLostUpdateAnswer() async throws {
        let server = try await TestServer()
        // The answer is lost and the server goes away at that moment, so the phone cannot
        // resend before the edit (a long reconnect delay would do it too, until one slow
        // connection attempt on a busy machine leaves the phone waiting out the delay).
        let dropping = Mutex(false)
        let dropped = Mutex(false)
        let phone = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.hooks.dropAcknowledgement = {
                guard dropping.withLock({ $0 }) else { return false }
                dropping.withLock { $0 = false }
                server.stopBlocking()
                dropped.withLock { $0 = true }
                return true
            }
        }
        phone.service.start()
        let account = try await phone.addAccount("Household")
        let entry = try await phone.addEntry("Rent", amount: 0, account: account.id!)
        _ = try await Convergence.waitUntilQuiet(server: server, devices: [phone])
        let entryId = try #require(try await phone.serverId(ofEntry: entry.id!))
        let collection = "accounts/\(try #require(try await phone.serverId(ofAccount: account.id!)))/entries"

        // The server applies amount 1, but the answer is lost and the phone goes offline.
        dropping.withLock { $0 = true }
        try await phone.database.write { db in try db.execute(sql: "UPDATE entry SET amount = 1") }
        try await waitUntil("the answer was dropped") { dropped.withLock { $0 } }
        await phone.service.stop()
        try await phone.database.write { db in try db.execute(sql: "UPDATE entry SET amount = 2") }
        try await server.start()
        #expect(try await serverDocuments(server, collection).first?.fields["amount"] == 1)

        // The resend carries the first key and gets the first answer; the edit still goes out.
        phone.service.start()
        let report = try await Convergence.waitUntilQuiet(server: server, devices: [phone])
        #expect(
            report.isConverged,
            "\(report.firstDifferences); last error: \(phone.service.status.lastError.map { "\($0)" } ?? "none")")
        let document = try #require(try await serverDocuments(server, collection).first { $0.id.rawValue == entryId })
        #expect(document.fields["amount"] == 2)
    }

    @Test("snapshots that arrive before the first push completes are applied after it, without duplicates")
    func snapshotBeforeFirstPush() async throws {
        let server = try await TestServer()
        let laptop = try TestDevice(name: "laptop", serverURL: server.url)
        laptop.service.start()

        let afterAck = Checkpoint()
        let received = Seen<ServerMessage.Snapshot>()
        let phone = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.receivesOwnWrites = true
            configuration.hooks.afterAck = { _ in afterAck.pause() }
            configuration.hooks.snapshotReceived = { received.append($0) }
        }
        phone.service.start()
        try await waitUntil("the phone listens") { received.count >= 1 }

        // The phone's first push is held after its ack; meanwhile the laptop's account and the
        // echo of the phone's own reach the phone's listener.
        try await phone.addAccount("Holiday")
        try await afterAck.reached()
        let household = try await laptop.addAccount("Household")
        try await laptop.addEntry("Rent", amount: -100, account: household.id!)
        try await waitUntil("both accounts arrived during the push") {
            received.all.filter { $0.target == "accounts" }.flatMap(\.changes).count >= 2
        }
        #expect(try phone.accountCount() == 1, "nothing is applied while the push holds the barrier")
        afterAck.release()

        let report = try await Convergence.waitUntilQuiet(server: server, devices: [laptop, phone])
        #expect(report.isConverged, "\(report.firstDifferences)")
        #expect(try phone.accountCount() == 2)
        let (entries, accounts) = (try await phone.entries(), try await phone.accounts())
        #expect(entries.count == 1, "the phone holds \(entries), its accounts \(accounts)")
        #expect(try await phone.service.unsyncedRowCount() == 0)
    }

    @Test("changes made offline are pushed before the listeners resume, then everything converges")
    func offlineChangesPushedFirst() async throws {
        let server = try await TestServer()
        let laptop = try TestDevice(name: "laptop", serverURL: server.url)
        laptop.service.start()
        let household = try await laptop.addAccount("Household")
        try await laptop.addEntry("Rent", amount: -100, account: household.id!)
        _ = try await Convergence.waitUntilQuiet(server: server, devices: [laptop])

        let order = Seen<String>()
        let phone = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.hooks.beforeSend = { _ in order.append("push") }
            configuration.hooks.snapshotReceived = { _ in order.append("snapshot") }
        }
        try await phone.addAccount("Holiday")
        phone.service.start()
        let report = try await Convergence.waitUntilQuiet(server: server, devices: [laptop, phone])
        #expect(report.isConverged, "\(report.firstDifferences)")
        #expect(order.all.first == "push")
        #expect(try phone.accountCount() == 2)
    }

    @Test("a remote delete removes a row with unpushed local edits; it is not resurrected")
    func remoteDeleteOfDirtyRow() async throws {
        let pair = try await DevicePair()
        await pair.laptop.service.stop()
        try await pair.edit(pair.laptop, "amount = -200")
        #expect(try await pair.laptop.isDirty(entry: pair.laptop.entries()[0].id!))
        try await pair.phone.database.write { db in try db.execute(sql: "DELETE FROM entry") }
        try await pair.phone.service.syncNow()

        pair.laptop.service.start()
        try await pair.converge()
        #expect(try await pair.laptop.entries().isEmpty)
        #expect(try await pair.phone.entries().isEmpty)
        let accountServerId = try #require(try await pair.phone.serverId(ofAccount: pair.accountId))
        #expect(try await serverDocuments(pair.server, "accounts/\(accountServerId)/entries").isEmpty)
    }

    @Test("a local delete of a row modified remotely wins; the remote edit does not bring it back")
    func localDeleteOfRemotelyModifiedRow() async throws {
        let pair = try await DevicePair()
        await pair.phone.service.stop()
        try await pair.phone.database.write { db in try db.execute(sql: "DELETE FROM entry") }
        try await pair.edit(pair.laptop, "amount = -300")
        try await pair.laptop.service.syncNow()

        pair.phone.service.start()
        try await pair.converge()
        #expect(try await pair.phone.entries().isEmpty)
        #expect(try await pair.laptop.entries().isEmpty)
    }

    @Test("a child that arrives before its parent is kept and inserted when the parent arrives")
    func childBeforeParent() async throws {
        // Wallets and bills are both top-level collections, so their snapshots arrive
        // separately; "bills" sorts first, so the phone hears of the bill before its wallet.
        let tables = [
            SyncTable.root("wallet", collection: "wallets"),
            SyncTable.root("bill", collection: "bills").referencing("walletId", "wallet"),
        ]
        let model = DeviceModel(tables: tables) { db in
            try db.execute(
                sql: """
                    CREATE TABLE wallet (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, isShared INTEGER NOT NULL DEFAULT 1);
                    CREATE TABLE bill (id INTEGER PRIMARY KEY AUTOINCREMENT, walletId INTEGER NOT NULL REFERENCES wallet(id),
                        title TEXT NOT NULL, isShared INTEGER NOT NULL DEFAULT 1);
                    """)
        }
        let server = try await TestServer()
        let laptop = try TestDevice(name: "laptop", serverURL: server.url, model: model)
        laptop.service.start()
        try await laptop.database.write { db in
            try db.execute(sql: "INSERT INTO wallet (name) VALUES ('Cash')")
            try db.execute(
                sql: "INSERT INTO bill (walletId, title) VALUES (?, 'Groceries')", arguments: [db.lastInsertedRowID])
        }
        _ = try await Convergence.waitUntilQuiet(server: server, devices: [laptop])

        let billApplied = Checkpoint()
        let phone = try TestDevice(name: "phone", serverURL: server.url, model: model) { configuration in
            configuration.hooks.afterApply = { snapshot in if snapshot.target == "bills" { billApplied.pause() } }
        }
        phone.service.start()
        try await billApplied.reached()
        let heldBack = try await phone.database.read { db in
            (
                try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM bill")!,
                try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM tandem_deferred")!
            )
        }
        #expect(heldBack.0 == 0, "the bill waits for its wallet")
        #expect(heldBack.1 == 1, "the bill is kept")
        billApplied.release()

        let report = try await Convergence.waitUntilQuiet(server: server, devices: [laptop, phone])
        #expect(report.isConverged, "\(report.firstDifferences)")
        let linked = try phone.database.read { db in
            try Row.fetchOne(
                db, sql: "SELECT bill.title, wallet.name FROM bill JOIN wallet ON wallet.id = bill.walletId")
        }
        #expect(linked?["title"] == "Groceries")
        #expect(linked?["name"] == "Cash")
    }

    @Test(
        "the resume token is stored with the changes: a client killed between two snapshots misses and repeats nothing")
    func resumeTokenWithChanges() async throws {
        let server = try await TestServer()
        let phone = try TestDevice(name: "phone", serverURL: server.url)
        phone.service.start()
        let account = try await phone.addAccount("Household")
        _ = try await Convergence.waitUntilQuiet(server: server, devices: [phone])

        // The laptop applies the first entry and is held before the snapshot with the second.
        // Held by content, not by counting snapshots: on a busy machine the laptop's entries
        // listener may open after the first entry, which then comes in the initial snapshot.
        let secondLive = Checkpoint()
        let applied = Seen<ServerMessage.Snapshot>()
        let laptop = try TestDevice(name: "laptop", serverURL: server.url) { configuration in
            configuration.hooks.beforeApply = { snapshot in
                if snapshot.changes.contains(where: { $0.document.fields["title"] == "Second" }) { secondLive.pause() }
            }
            configuration.hooks.afterApply = { applied.append($0) }
        }
        laptop.service.start()
        _ = try await Convergence.waitUntilQuiet(server: server, devices: [phone, laptop])

        let first = try await phone.addEntry("First", amount: 1, account: account.id!)
        try await phone.service.syncNow()
        try await waitUntil("the laptop applied the first") { try await laptop.entries().map(\.title) == ["First"] }
        let firstId = try #require(try await phone.serverId(ofEntry: first.id!))
        try await phone.addEntry("Second", amount: 2, account: account.id!)
        try await phone.service.syncNow()
        try await secondLive.reached()

        // Kill the laptop while the second snapshot is uncommitted: the service stops, its
        // queued work is dropped, and the held snapshot is abandoned before its transaction.
        let killedService = laptop.service
        let restart = Task { try await laptop.restart(discardingQueuedWork: true, starting: false) }
        try await waitUntil("the laptop's service is stopped") { !killedService.isRunning }
        secondLive.release()
        try await restart.value
        // Looked at before the relaunched service starts: once started, it resumes at once and
        // may apply the second change before this test's task runs again on a busy machine.
        #expect(try await laptop.entries().map(\.title) == ["First"], "the second snapshot was not committed")
        let appliedBeforeRestart = applied.count
        laptop.service.start()

        let report = try await Convergence.waitUntilQuiet(server: server, devices: [phone, laptop])
        #expect(report.isConverged, "\(report.firstDifferences)")
        #expect(try await laptop.entries().map(\.title).sorted() == ["First", "Second"])
        let afterRestart = applied.all.dropFirst(appliedBeforeRestart)
        #expect(!afterRestart.contains { $0.contains(try! DocumentID(firstId)) }, "the first change came only once")
        #expect(
            afterRestart.contains { snapshot in snapshot.changes.contains { $0.document.fields["title"] == "Second" } })
    }
}

@Suite("A stale snapshot queued behind a push")
struct StaleSnapshotTests {
    /// The soak's read-your-writes failure (`device-5 shows X at version 1 after writing
    /// version 2`), forced: the echo of a create arrives while a push is under way and waits
    /// behind its barrier; the same push updates the document and then, in a later batch,
    /// deletes it (a delete filed while the push runs goes out in it). When the echo is
    /// finally applied, the row it would update is gone: without a memory of the
    /// acknowledged delete, it inserts the document again at version 1.
    @Test("an echo older than this device's acknowledged delete does not bring the document back")
    func staleEchoAfterOwnDelete() async throws {
        let server = try await TestServer()
        let deleteAcknowledged = Mutex<DocumentID?>(nil)
        let violations = Seen<String>()
        // A struct around the closure: a closure that is itself a `Mutex`'s value is wrapped in
        // more conversion thunks at each `withLock { $0 }` (see `LocalChangeObserver`).
        struct Action: Sendable { let run: @Sendable () -> Void }
        let deleteAfterUpdate = Mutex<Action?>(nil)
        let deviceBox = Mutex<TestDevice?>(nil)
        let device = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            // The echo on the connection that wrote (what a reconnect brings too) is the stale
            // snapshot here.
            configuration.receivesOwnWrites = true
            // Pushes only when the test asks, one batch at a time: the delete filed after the
            // update's write-back goes out in the same push.
            configuration.pushDelay = .seconds(3600)
            configuration.pushInterval = .seconds(3600)
            configuration.writesInFlight = 1
            configuration.hooks.afterWriteBack = { ops, results in
                if ops.contains(where: { $0.kind == .update }) {
                    deleteAfterUpdate.withLock { $0 }?.run()
                }
                for (op, result) in zip(ops, results) where op.kind == .delete {
                    deleteAcknowledged.withLock { $0 = result.id }
                }
            }
            configuration.hooks.afterApply = { snapshot in
                guard let gone = deleteAcknowledged.withLock({ $0 }),
                    let device = deviceBox.withLock({ $0 })
                else { return }
                let present =
                    (try? device.database.read { db in
                        try Int.fetchOne(
                            db, sql: "SELECT COUNT(*) FROM account WHERE serverId = ?", arguments: [gone.rawValue])
                    }) ?? 0
                if present > 0 {
                    violations.append("after applying \(snapshot.resumeToken), \(gone) is back, deleted before")
                }
            }
        }
        deviceBox.withLock { $0 = device }
        device.service.start()
        try await device.waitUntilConnected()

        // The create is acknowledged; its echo is held by the server.
        await server.server.holdDeliveries()
        let account = try await device.addAccount("Household")
        try await device.service.syncNow()
        let serverId = try await DocumentID(try #require(try device.serverId(ofAccount: account.id!) as String?))

        // The update goes out; its answer waits behind the held echo. Once the server has the
        // update, let everything go: the echo arrives while the push still runs.
        try await device.database.write { db in
            try db.execute(sql: "UPDATE account SET name = 'Home' WHERE id = ?", arguments: [account.id!])
        }
        deleteAfterUpdate.withLock {
            $0 = Action {
                try? device.database.write { db in
                    try db.execute(sql: "DELETE FROM account WHERE id = ?", arguments: [account.id!])
                }
            }
        }
        let push = Task { _ = try await device.service.syncNow() }
        do {
            try await waitUntil("the server has the update") {
                try await server.server.document(in: try CollectionPath("accounts"), id: serverId)?.version == 2
            }
        } catch {
            await server.server.releaseDeliveries()
            throw TestFailure("\(error); the push: \(await push.result); status: \(device.service.status)")
        }
        await server.server.releaseDeliveries()
        try await push.value
        try await waitUntil("the delete is acknowledged") { deleteAcknowledged.withLock { $0 } != nil }
        let report = try await Convergence.waitUntilQuiet(server: server, devices: [device])
        #expect(report.isConverged, "\(report.firstDifferences)")
        #expect(violations.all.isEmpty, "\(violations.all)")
        #expect(try device.accountCount() == 0)
    }
}
