import Foundation
import GRDB
import Synchronization
@_spi(Testing) import Tandem
import TandemTesting
import TandemWire
import Testing

@Suite("Sync service behaviour")
struct ServiceBehaviorTests {
    @Test("syncNow waits for a connection attempt under way, however short its connectionWait")
    func syncNowWaitsForAttemptUnderWay() async throws {
        let server = try await TestServer()
        let attempt = Checkpoint()
        let phone = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.hooks.beforeConnect = { attempt.pause() }
        }
        let account = try await phone.addAccount("Household")
        phone.service.start()
        try await attempt.reached()
        // The attempt is held: a zero wait must not be taken for "no connection".
        let sync = Task { try await phone.service.syncNow(connectionWait: .zero) }
        try await Task.sleep(for: .milliseconds(50))  // time for a wrong syncNow to give up
        attempt.release()
        _ = try await sync.value
        #expect(try await phone.serverId(ofAccount: account.id!) != nil)
        #expect(phone.service.status.pendingCount == 0)
    }

    /// A phone whose snapshots are recorded as they arrive, listening.
    private static func listeningPhone(_ server: TestServer, tokenStoreDelay: Duration = .seconds(1)) async throws
        -> (TestDevice, Seen<ServerMessage.Snapshot>)
    {
        let received = Seen<ServerMessage.Snapshot>()
        let phone = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.hooks.snapshotReceived = { received.append($0) }
            configuration.tokenStoreDelay = tokenStoreDelay
        }
        phone.service.start()
        try await waitUntil("the phone listens") { received.all.contains { $0.isCurrent(target: "accounts") } }
        return (phone, received)
    }

    /// Pushes a new account from the phone and waits for the snapshot of that write, which
    /// brings the new token alone. Returns the account's document id and that token.
    private static func pushOwnWrite(_ phone: TestDevice, _ received: Seen<ServerMessage.Snapshot>) async throws
        -> (own: DocumentID, token: String)
    {
        let account = try await phone.addAccount("Household")
        _ = try await phone.service.syncNow()
        let own = try DocumentID(try #require(try await phone.serverId(ofAccount: account.id!) as String?))
        try await waitUntil("the token of the phone's own write arrives alone") {
            received.all.contains { $0.movesTokenAlone(target: "accounts") }
        }
        return (own, try #require(received.all.last { $0.movesTokenAlone(target: "accounts") }?.resumeToken))
    }

    /// The device's stored token of a collection, if any.
    private static func storedToken(_ device: TestDevice, _ collection: String = "accounts") async throws -> String? {
        try await device.database.read { db in
            try String.fetchOne(
                db, sql: "SELECT resumeToken FROM tandem_listener WHERE collection = ?", arguments: [collection])
        }
    }

    @Test(
        "a device does not hear its own writes back on the connection that made them: its listener gets the new resume token alone, and another device's write in full"
    )
    func ownWritesNotEchoed() async throws {
        let server = try await TestServer()
        let laptop = try TestDevice(name: "laptop", serverURL: server.url)
        laptop.service.start()
        let (phone, received) = try await Self.listeningPhone(server)

        let (own, token) = try await Self.pushOwnWrite(phone, received)
        try await waitUntil("the phone stored that token") { try await Self.storedToken(phone) == token }

        try await laptop.addAccount("Trip")
        try await waitUntil("the phone has the laptop's account") { try phone.accountCount() == 2 }
        #expect(!received.all.contains { $0.contains(own) }, "the phone's own account came back")
        #expect(received.all.contains { $0.changes.contains { $0.document.fields["name"] == "Trip" } })
    }

    @Test("a token that moved alone, stored late, never takes the place of a later one")
    func tokenMovedAloneNeverReplacesALaterOne() async throws {
        let server = try await TestServer()
        let laptop = try TestDevice(name: "laptop", serverURL: server.url)
        laptop.service.start()
        let (phone, received) = try await Self.listeningPhone(server, tokenStoreDelay: .seconds(3600))

        // The phone's push: its listener gets the new token alone, which is kept, not stored.
        let (_, kept) = try await Self.pushOwnWrite(phone, received)
        try await waitUntil("the phone keeps that token") { phone.service.keptTokens["accounts"] == kept }
        #expect(try await Self.storedToken(phone) != kept)
        // The laptop's write brings a later token, with a change (a parent row: the phone's
        // listeners are refreshed, which stores what is kept).
        try await laptop.addAccount("Trip")
        _ = try await laptop.service.syncNow()
        try await waitUntil("the phone has the laptop's account") { try phone.accountCount() == 2 }
        let trip = try #require(received.all.last { $0.changes.contains { $0.document.fields["name"] == "Trip" } })
        #expect(try await Self.storedToken(phone) == trip.resumeToken)

        // Stopping stores what is still kept: nothing.
        await phone.service.stop()
        #expect(try await Self.storedToken(phone) == trip.resumeToken)
    }

    @Test(
        "a token that moved alone is stored when the service stops: relaunched, the device does not download its own write"
    )
    func tokenMovedAloneStoredOnStop() async throws {
        let server = try await TestServer()
        let (phone, received) = try await Self.listeningPhone(server, tokenStoreDelay: .seconds(3600))
        let (own, token) = try await Self.pushOwnWrite(phone, received)
        try await waitUntil("the phone keeps that token") { phone.service.keptTokens["accounts"] == token }
        #expect(try await Self.storedToken(phone) != token)

        // Relaunched long before the token's own store would come.
        let before = received.all.count
        try await phone.restart(starting: false)
        #expect(try await Self.storedToken(phone) == token)
        phone.service.start()
        try await waitUntil("the relaunched phone's accounts listener is current") {
            received.all.dropFirst(before).contains { $0.isCurrent(target: "accounts") }
        }
        #expect(!received.all.dropFirst(before).contains { $0.contains(own) }, "the phone downloaded its own account")
    }

    /// The server leaves a connection's own writes out of its listeners' live snapshots once it
    /// answered them, whether or not the device still waited for the answer. A device that
    /// gave up on one (a timeout) and stored the next snapshot's resume token would be past a
    /// write of its own it does not know: so it drops that connection, and its frames are not
    /// applied.
    @Test(
        "a write that times out drops the connection: no snapshot from it is applied while the device does not know that write"
    )
    func timedOutWriteDropsTheConnection() async throws {
        let holding = Mutex(false)
        let held = Checkpoint()
        let server = try await TestServer { configuration in
            configuration.hooks.beforeCommit = { if holding.withLock({ $0 }) { held.pause() } }
        }
        defer { held.release() }
        let violations = Seen<String>()
        let deviceBox = Mutex<TestDevice?>(nil)
        let phone = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.requestTimeout = .seconds(1)
            configuration.pushDelay = .seconds(3600)
            configuration.pushInterval = .seconds(3600)
            // A token that comes alone is stored at once, when the check below sees it.
            configuration.tokenStoreDelay = .zero
            configuration.hooks.afterApply = { snapshot in
                guard !snapshot.initial, snapshot.changes.isEmpty, let device = deviceBox.withLock({ $0 }) else {
                    return
                }
                let unknown =
                    (try? device.database.read { db in
                        try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM account WHERE serverId IS NULL")
                    }) ?? 0
                if unknown > 0 { violations.append("token \(snapshot.resumeToken) applied before the write was known") }
            }
        }
        deviceBox.withLock { $0 = phone }
        phone.service.start()
        try await phone.waitUntilConnected()
        let account = try await phone.addAccount("Household")

        holding.withLock { $0 = true }
        let push = Task { try await phone.service.syncNow() }
        try await held.reached()
        holding.withLock { $0 = false }
        await #expect(throws: (any Error).self) { try await push.value }
        held.release()

        try await waitUntil("the phone knows its account") { try await phone.serverId(ofAccount: account.id!) != nil }
        try await waitUntil("the phone is connected again") { phone.service.status.isConnected }
        _ = try await phone.service.syncNow()
        #expect(try await serverDocuments(server, "accounts").count == 1)
        #expect(try phone.accountCount() == 1)
        // Tokens that came alone are stored late: stopping stores the last of them, checked too.
        await phone.service.stop()
        #expect(violations.all.isEmpty, "\(violations.all)")
    }

    @Test("with the server down, syncNow fails with disconnected once its wait is over; the row stays pending")
    func syncNowOffline() async throws {
        let offline = try RefusingPort()
        let phone = try TestDevice(name: "phone", serverURL: offline.url)
        phone.service.start()
        try await phone.addAccount("Household")
        await #expect(throws: TandemError.self) {
            try await phone.service.syncNow(connectionWait: .milliseconds(200))
        }
        #expect(phone.service.status.pendingCount == 1)
    }

    @Test("with pushDelay zero and the server down, a local commit shows as pending (its push reads the counts)")
    func pendingShownByTheImmediatePush() async throws {
        let offline = try RefusingPort()
        let phone = try TestDevice(name: "phone", serverURL: offline.url) { $0.pushDelay = .zero }
        phone.service.start()
        try await phone.addAccount("Household")
        // The commit reads no counts itself: the push it queued, which finds no connection,
        // shows them.
        try await waitUntil("the new row is pending") { phone.service.status.pendingCount == 1 }
    }

    @Test("a row the server refuses fails at once and is listed with the reason; the others still sync")
    func refusalFailsAtOnce() async throws {
        let server = try await TestServer { $0.limits.maxDocumentBytes = 512 }
        let phone = try TestDevice(name: "phone", serverURL: server.url)
        phone.service.start()
        let account = try await phone.addAccount("Household")
        let big = try await phone.addEntry(String(repeating: "x", count: 2000), amount: 1, account: account.id!)
        try await phone.addEntry("Small", amount: 2, account: account.id!)
        try await waitUntil("the big row failed") { try await phone.service.failedRecords().count == 1 }
        let failure = try #require(try await phone.service.failedRecords().first)
        #expect(failure.table == "entry")
        #expect(failure.rowId == big.id)
        #expect(failure.error.message.contains("the limit is 512"))
        // A code to switch on, and the server's own answer.
        #expect(failure.error.code == .server)
        #expect(failure.error.serverError?.code == .tooLarge)
        try await waitUntil("the status counts it") { phone.service.status.failedCount == 1 }
        // The status says what went wrong with a code to switch on, not only a sentence.
        let lastError = try #require(phone.service.status.lastError)
        #expect(lastError.code == .server)
        #expect(lastError.serverError?.code == .tooLarge)
        // The failed row is still dirty, but it is counted failed, not pending.
        #expect(try await phone.isDirty(entry: big.id!))
        try await waitUntil("nothing else is pending") { phone.service.status.pendingCount == 0 }
        try await waitUntil("the small row reached the server") {
            try await server.server.collections().contains { $0.rawValue.hasSuffix("/entries") }
        }
        // Shortened, the row is retried on its own (an edit makes a failed row pending again).
        try await phone.database.write { db in
            try db.execute(sql: "UPDATE entry SET title = 'Big' WHERE id = ?", arguments: [big.id!])
        }
        let report = try await Convergence.waitUntilQuiet(server: server, devices: [phone])
        #expect(report.isConverged, "\(report.firstDifferences)")
    }

    @Test("a row whose push keeps failing becomes failed after the configured attempts, then retries on demand")
    func attemptsExhausted() async throws {
        let server = try await TestServer()
        let drops = AcknowledgementDropper(dropping: 2)
        // The first snapshot that brings the account is held: applied, it shows the row reached
        // the server after all (it carries the create's key), and the row is synced, not failed.
        // A poll could miss the failed state between the second drop and that snapshot: the
        // live echo (held below too) once, in a TLS pass under load; the next connection's
        // catch-up snapshot once, in a run with every core busy.
        let accountArrives = Checkpoint()
        let phone = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.maxAttempts = 2
            configuration.hooks.dropAcknowledgement = drops.dropsThis
            configuration.hooks.beforeApply = { snapshot in
                if !snapshot.changes.isEmpty { accountArrives.pause() }
            }
        }
        await server.server.holdDeliveries()
        phone.service.start()
        try await phone.addAccount("Household")
        do {
            try await waitUntil("the row failed after two attempts") {
                try await phone.service.failedRecords().first?.attempts == 2
            }
        } catch {
            throw TestFailure("\(error); status: \(phone.service.status); drops left: \(drops.remainingDrops)")
        }
        #expect(phone.service.status.lastError?.code == .disconnected, "\(phone.service.status)")
        accountArrives.release()
        await server.server.releaseDeliveries()
        try await phone.service.retryFailed()
        let report = try await Convergence.waitUntilQuiet(server: server, devices: [phone])
        #expect(report.isConverged, "\(report.firstDifferences)")
        #expect(try await serverDocuments(server, "accounts").count == 1)
    }

    @Test("a backlog longer than one push's 64 batches is pushed in full without waiting for the periodic push")
    func longBacklog() async throws {
        let server = try await TestServer()
        let phone = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.maxBatchSize = 2
            configuration.pushInterval = .seconds(3600)
        }
        try await phone.database.write { db in
            for index in 0..<150 {
                var account = CashFlow.Account(name: "Account \(index)", isShared: true)
                try account.insert(db)
            }
        }
        phone.service.start()
        try await waitUntil("all 150 accounts reached the server") {
            try await serverDocuments(server, "accounts").count == 150
        }
        try await waitUntil("none is left pending") { phone.service.status.pendingCount == 0 }
    }

    @Test("one syncNow pushes a new account and the entry under it: the entry goes once the account has its id")
    func parentAndChildInOnePush() async throws {
        let server = try await TestServer()
        let applied = Seen<ServerMessage.Snapshot>()
        // Only the pushes the test asks for.
        let phone = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.pushDelay = .seconds(3600)
            configuration.pushInterval = .seconds(3600)
            configuration.hooks.afterApply = { applied.append($0) }
        }
        phone.service.start()
        // The push a new connection starts with runs before its listeners: once a snapshot is
        // applied, it is over, and cannot take the rows below from the syncNow.
        try await waitUntil("the accounts listener is current") { applied.count >= 1 }
        let account = try await phone.addAccount("Household")
        try await phone.addEntry("Rent", amount: -100, account: account.id!)
        let report = try await phone.service.syncNow()
        #expect(report.pushed == 2)
        #expect(report.pending == 0)
        let accountId = try #require(try await phone.serverId(ofAccount: account.id!))
        #expect(try await serverDocuments(server, "accounts/\(accountId)/entries").count == 1)
    }

    @Test(
        "times received from a server whose clock runs an hour ahead are kept across a restart: the restarted devices stamp their edits after them"
    )
    func clockKeptAcrossRestart() async throws {
        let ahead = Int64((Date().timeIntervalSince1970 + 3600) * 1000)
        let server = try await TestServer { $0.clock = { ahead } }
        let laptop = try TestDevice(name: "laptop", serverURL: server.url)
        let phone = try TestDevice(name: "phone", serverURL: server.url)
        laptop.service.start()
        phone.service.start()
        try await laptop.addAccount("Household")
        _ = try await laptop.service.syncNow()
        try await waitUntil("the phone has the account") { try phone.accountCount() == 1 }
        // The laptop took the time in with its write's acknowledgement, the phone with the
        // document; neither has it in a row (the account's updatedAt is the laptop's own time).
        let received = HybridLogicalClock.timestamp(milliseconds: ahead)
        for device in [laptop, phone] {
            #expect(device.service.clock.latest >= received, "\(device.name)")
            try await device.restart()
            #expect(device.service.clock.now() > received, "\(device.name) after its restart")
        }
    }

    @Test("last write wins: of two offline edits of one entry, the later one wins on every device")
    func lastWriteWins() async throws {
        let clock = TestClock()
        let server = try await TestServer { $0.clock = { clock.now() } }
        let phone = try TestDevice(name: "phone", serverURL: server.url) { $0.clock = clock }
        let laptop = try TestDevice(name: "laptop", serverURL: server.url) { $0.clock = clock }
        phone.service.start()
        laptop.service.start()
        let account = try await phone.addAccount("Household")
        try await phone.addEntry("Rent", amount: -100, account: account.id!)
        _ = try await Convergence.waitUntilQuiet(server: server, devices: [phone, laptop])

        await phone.service.stop()
        await laptop.service.stop()
        clock.advance(by: 1000)
        try await laptop.database.write { db in try db.execute(sql: "UPDATE entry SET title = 'Rent (laptop)'") }
        clock.advance(by: 1000)
        try await phone.database.write { db in try db.execute(sql: "UPDATE entry SET title = 'Rent (phone, later)'") }

        // The earlier edit reaches the server first; the later one still wins.
        laptop.service.start()
        try await laptop.service.syncNow()
        phone.service.start()
        let report = try await Convergence.waitUntilQuiet(server: server, devices: [phone, laptop])
        #expect(report.isConverged, "\(report.firstDifferences)")
        #expect(try await laptop.entries().map(\.title) == ["Rent (phone, later)"])
        #expect(try await phone.entries().map(\.title) == ["Rent (phone, later)"])
    }

    @Test("a listener change never overwrites a newer unpushed local edit")
    func listenerDoesNotOverwriteNewerLocalEdit() async throws {
        let clock = TestClock()
        let server = try await TestServer { $0.clock = { clock.now() } }
        let held = Checkpoint()
        let phone = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.clock = clock
            configuration.hooks.beforeSend = { _ in held.pause() }
        }
        let laptop = try TestDevice(name: "laptop", serverURL: server.url) { $0.clock = clock }
        laptop.service.start()
        let account = try await laptop.addAccount("Household")
        try await laptop.addEntry("Rent", amount: -100, account: account.id!)
        _ = try await Convergence.waitUntilQuiet(server: server, devices: [laptop])
        held.release()  // the phone's first pushes go through
        phone.service.start()
        _ = try await Convergence.waitUntilQuiet(server: server, devices: [phone, laptop])

        // The laptop edits first; the phone edits later but cannot push before the change arrives.
        await phone.service.stop()
        clock.advance(by: 1000)
        try await laptop.database.write { db in try db.execute(sql: "UPDATE entry SET amount = -200") }
        try await laptop.service.syncNow()
        clock.advance(by: 1000)
        try await phone.database.write { db in try db.execute(sql: "UPDATE entry SET amount = -300") }
        phone.service.start()
        let report = try await Convergence.waitUntilQuiet(server: server, devices: [phone, laptop])
        #expect(report.isConverged, "\(report.firstDifferences)")
        #expect(try await phone.entries().map(\.amount) == [-300])
        #expect(try await laptop.entries().map(\.amount) == [-300])
    }

    @Test("listeners follow sharing: an unshared account stops syncing, sharing it again resumes")
    func listenersFollowSharing() async throws {
        let server = try await TestServer()
        let phone = try TestDevice(name: "phone", serverURL: server.url)
        let laptop = try TestDevice(name: "laptop", serverURL: server.url)
        phone.service.start()
        laptop.service.start()
        let account = try await phone.addAccount("Household")
        _ = try await Convergence.waitUntilQuiet(server: server, devices: [phone, laptop])
        // Accounts and the account's entries, on each device: a device opens the entries
        // listener after it has the account, so convergence can come before the last listen.
        try await waitUntil("4 live listeners") { await server.server.stats.liveListeners == 4 }

        let laptopAccount = try #require(try await laptop.accounts().first)
        try await laptop.database.write { db in
            try db.execute(sql: "UPDATE account SET isShared = 0 WHERE id = ?", arguments: [laptopAccount.id!])
        }
        try await waitUntil("the laptop closed the entries listener") { await server.server.stats.liveListeners == 3 }
        try await phone.addEntry("Rent", amount: -100, account: account.id!)
        try await phone.service.syncNow()
        // A marker committed after the entry, on a collection the laptop still listens to: once
        // the laptop has it, it would have had the entry, had it still listened to the entries.
        _ = try await phone.addAccount("Marker")
        try await phone.service.syncNow()
        try await waitUntil("the laptop has the marker") {
            try await laptop.accounts().contains { $0.name == "Marker" }
        }
        #expect(try await laptop.entries().isEmpty)

        try await laptop.database.write { db in
            try db.execute(sql: "UPDATE account SET isShared = 1 WHERE id = ?", arguments: [laptopAccount.id!])
        }
        try await waitUntil("the laptop resumed and has the entry") { try await laptop.entries().count == 1 }
        try await waitUntil("6 live listeners: accounts and two accounts' entries, on each device") {
            await server.server.stats.liveListeners == 6
        }
    }

    @Test(
        "a nested collection whose path is longer than a listener's name may be (128 bytes) is listened to under a shorter name, and syncs"
    )
    func longCollectionPaths() async throws {
        let accounts = String(repeating: "a", count: 60)
        let entries = String(repeating: "e", count: 60)
        let model = DeviceModel(
            tables: [
                SyncTable.root(CashFlow.Account.self, collection: accounts),
                SyncTable.nested(
                    CashFlow.Entry.self, under: CashFlow.Account.self, foreignKey: "accountId", collection: entries),
            ],
            createTables: CashFlow.createTables)
        let server = try await TestServer()
        let phone = try TestDevice(name: "phone", serverURL: server.url, model: model)
        let laptop = try TestDevice(name: "laptop", serverURL: server.url, model: model)
        phone.service.start()
        laptop.service.start()
        let account = try await phone.addAccount("Household")
        try await phone.addEntry("Rent", amount: -100, account: account.id!)
        try await phone.service.syncNow()
        let serverId = try #require(
            try await phone.database.read { db in
                try String.fetchOne(db, sql: "SELECT serverId FROM account")
            })
        #expect("\(accounts)/\(serverId)/\(entries)".utf8.count > 128)
        try await waitUntil("the laptop has the entry") { try await laptop.entries().map(\.title) == ["Rent"] }
        #expect(laptop.service.status.lastError == nil, "\(String(describing: laptop.service.status.lastError))")
    }

    @Test("a change the table refuses is left out; the other changes of its snapshot apply once and its token is kept")
    func refusedChangeLeftOut() async throws {
        let server = try await TestServer()
        let writer = try await ServerConnection.connect(to: server.url, clientId: "writer")
        defer { writer.close() }
        let items = try CollectionPath("items")
        // One write, so that the three documents arrive in one snapshot; the middle one breaks
        // the device's CHECK constraint.
        _ = try await writer.write(
            [1, -1, 2].map { amount in
                .create(
                    in: items, id: try! DocumentID("item\(amount)"), fields: ["title": "t", "amount": .int(amount)],
                    idempotencyKey: .random())
            })
        let model = DeviceModel(tables: [.root("item", collection: "items")]) { db in
            try db.execute(
                sql: """
                    CREATE TABLE item (
                        id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL,
                        amount INTEGER NOT NULL CHECK (amount >= 0), isShared INTEGER NOT NULL DEFAULT 1)
                    """)
        }
        let phone = try TestDevice(name: "phone", serverURL: server.url, model: model)
        phone.service.start()
        try await waitUntil("the refusal is reported") { phone.service.status.lastError != nil }
        let lastError = try #require(phone.service.status.lastError)
        #expect(lastError.message.contains("items/item-1"), "\(lastError)")
        // The change applied before the refused one was rolled back with it and applied again:
        // once, not twice.
        let rows = try await phone.database.read { db in
            try String.fetchAll(db, sql: "SELECT serverId || ' dirty ' || isDirty FROM item ORDER BY amount")
        }
        #expect(rows == ["item1 dirty 0", "item2 dirty 0"])
        #expect(try await Self.storedToken(phone, "items") != nil)
    }

    /// Without the drop, the next snapshot stored its later token, and the document of the one
    /// that failed never came.
    @Test(
        "a snapshot the database fails to store (not one change: the whole transaction) is not skipped: the connection drops and the listener resumes from its stored token"
    )
    func failedApplyResumes() async throws {
        let connects = Atomic(0)
        let items = try await ItemsToPhone { configuration in
            configuration.hooks.beforeConnect = { connects.add(1, ordering: .relaxed) }
        }
        defer { items.writer.close() }
        let phone = items.phone
        try await phone.database.write { db in
            // While this table has a row, storing a resume token fails, as on a full disk.
            try db.execute(
                sql: """
                    CREATE TABLE failTokens (x);
                    CREATE TRIGGER failTokenInsert BEFORE INSERT ON tandem_listener
                    WHEN EXISTS (SELECT 1 FROM failTokens) BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;
                    CREATE TRIGGER failTokenUpdate BEFORE UPDATE ON tandem_listener
                    WHEN EXISTS (SELECT 1 FROM failTokens) BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END;
                    """)
        }
        try await phone.database.write { db in try db.execute(sql: "INSERT INTO failTokens VALUES (1)") }
        try await items.write("item2")
        try await waitUntil("the snapshot of item2 failed") {
            phone.service.status.lastError?.message.contains("cannot apply a snapshot of items") == true
        }
        // Each connection meets the fault again; the backoff grows (50 ms, then doubling up to
        // the test device's 500 ms): about 10 attempts in 3 s, where a backoff started afresh
        // at each connection made about 80. A loaded machine makes fewer, never more.
        let before = connects.load(ordering: .relaxed)
        try await Task.sleep(for: .seconds(3))
        let attempts = connects.load(ordering: .relaxed) - before
        #expect(attempts <= 20, "\(attempts) connections in 3 s")
        try await phone.database.write { db in try db.execute(sql: "DELETE FROM failTokens") }
        try await items.write("item3")
        try await waitUntil("the phone holds item3") { try await items.titles().contains("item3") }
        #expect(try await items.titles() == ["item1", "item2", "item3"], "the document whose snapshot failed is gone")
        await phone.service.stop()
    }

    /// Without the drop, the connection stayed up with nothing listening on it until some
    /// parent row changed.
    @Test("a failed read of the listeners drops the connection, and the next one listens")
    func unreadableListenersResume() async throws {
        let items = try await ItemsToPhone(started: false)
        defer { items.writer.close() }
        let phone = items.phone
        try await phone.database.write { db in
            try db.execute(sql: "ALTER TABLE tandem_listener RENAME TO tandem_listener_away")
        }
        phone.service.start()
        try await waitUntil("the listeners could not be read") {
            phone.service.status.lastError?.message.contains("cannot read the listeners") == true
        }
        try await phone.database.write { db in
            try db.execute(sql: "ALTER TABLE tandem_listener_away RENAME TO tandem_listener")
        }
        try await items.write("item1")
        try await waitUntil("the phone holds item1") { try await items.titles() == ["item1"] }
        await phone.service.stop()
    }

    /// Without telling the database's errors from the change's own, the change was left out
    /// as if the table refused it, and the snapshot's token stored past it.
    @Test("a change the database has no room for is not left out: the connection drops and the listener resumes")
    func fullDatabaseResumes() async throws {
        let items = try await ItemsToPhone()
        defer { items.writer.close() }
        let phone = items.phone
        // No page can be added to the file: a note of 100 KB does not fit.
        try await phone.database.write { db in
            let pages = try Int.fetchOne(db, sql: "PRAGMA page_count")!
            _ = try Int.fetchOne(db, sql: "PRAGMA max_page_count = \(pages)")
        }
        try await items.write("item2", padding: 100_000)
        try await waitUntil("the snapshot of item2 failed for want of room") {
            phone.service.status.lastError?.message.contains("full") == true
        }
        try await phone.database.write { db in _ = try Int.fetchOne(db, sql: "PRAGMA max_page_count = 4294967294") }
        try await items.write("item3")
        try await waitUntil("the phone holds item3") { try await items.titles().contains("item3") }
        #expect(try await items.titles() == ["item1", "item2", "item3"], "the change with no room is gone")
        await phone.service.stop()
    }

    @Test("an app's ValueObservation sees the rows the listener inserts and updates")
    func appObservesListenerWrites() async throws {
        let server = try await TestServer()
        let phone = try TestDevice(name: "phone", serverURL: server.url)
        let laptop = try TestDevice(name: "laptop", serverURL: server.url)
        // The laptop's app watches its accounts, as a SwiftUI list would.
        let seen = Mutex<[[String]]>([])
        let observation = ValueObservation.tracking { db in
            try String.fetchAll(db, sql: "SELECT name FROM account ORDER BY name")
        }
        let cancellable = observation.start(
            in: laptop.database, scheduling: .async(onQueue: DispatchQueue(label: "observer")),
            onError: { Issue.record($0) }, onChange: { names in seen.withLock { $0.append(names) } })
        defer { cancellable.cancel() }
        phone.service.start()
        laptop.service.start()

        let account = try await phone.addAccount("Household")
        try await waitUntil("the laptop's app saw the inserted row") {
            seen.withLock { $0.last } == ["Household"]
        }
        try await phone.database.write { db in
            try db.execute(sql: "UPDATE account SET name = 'Home' WHERE id = ?", arguments: [account.id!])
        }
        try await waitUntil("the laptop's app saw the updated row") { seen.withLock { $0.last } == ["Home"] }
    }

    /// Every app commit to a synced table reaches the push through `LocalChangeObserver`,
    /// whose stored action was wrapped in a pair of conversion thunks more at each commit (see
    /// `LocalChangeObserverTests`): the call went deeper with every commit until the writing
    /// thread's stack overflowed and the app died (SIGSEGV). Here a 128 KB stack and 4,000
    /// commits, which crashed before the last without the fix; a 512 KB stack, the size of
    /// secondary threads on Apple platforms, crashed before 15,000. A regression kills the whole
    /// test process with SIGSEGV, naming no test: `LocalChangeObserverTests` fails by name.
    @Test("an app commits 4,000 times to a synced table from a thread with a 128 KB stack")
    func manyCommitsOnSmallStack() async throws {
        // Never started: each commit still goes through the observer to the push's scheduling
        // (and asks for a read of the status's counts).
        let phone = try TestDevice(name: "phone", serverURL: "ws://127.0.0.1:9")
        let commits = 4_000
        let finished = Mutex<Result<Void, any Error>?>(nil)
        let done = DispatchSemaphore(value: 0)
        let writer = Thread {
            let result = Result {
                for index in 0..<commits {
                    try phone.database.write { db in
                        try db.execute(
                            sql: "INSERT INTO account (name, isShared) VALUES (?, 1)", arguments: ["\(index)"])
                    }
                }
            }
            finished.withLock { $0 = result }
            done.signal()
        }
        writer.stackSize = 128 << 10
        writer.start()
        let ended = try await onOwnThread { done.wait(timeout: .now() + .seconds(300)) }
        try #require(ended == .success, "the writing thread did not finish its commits within 300 s")
        try #require(finished.withLock { $0 }).get()
        #expect(try await phone.service.unsyncedRowCount() == commits)
    }

    /// Each local commit asked for a read of the status's counts on a thread of its own, which
    /// waits for the database behind the app's next write: a burst of commits queued as many
    /// reads as commits (here 101 without the fix).
    @Test("a burst of local commits queues one read of the status's counts, not one each")
    func commitBurstReadsCountsOnce() async throws {
        let held = Checkpoint()
        // Never started: each commit asks for the counts to be read.
        let phone = try TestDevice(name: "phone", serverURL: "ws://127.0.0.1:9") { configuration in
            configuration.hooks.beforeQueuedStatusRead = { held.pause() }
        }
        try await phone.addAccount("0")
        try await held.reached()
        for index in 1...100 { try await phone.addAccount("\(index)") }
        held.release()
        try await waitUntil("the status shows the 101 accounts") { phone.service.status.pendingCount == 101 }
        #expect(held.arrivals == 1)
    }
}

/// A server, a protocol client writing items under ids of its choosing, and a phone listening
/// to them that holds the first, `item1` (unless not `started`).
private struct ItemsToPhone {
    let server: TestServer
    let writer: ServerConnection
    let phone: TestDevice

    init(started: Bool = true, configure: @escaping @Sendable (inout SyncConfiguration) -> Void = { _ in })
        async throws
    {
        server = try await TestServer()
        writer = try await ServerConnection.connect(to: server.url, clientId: "writer")
        let model = DeviceModel(tables: [.root("item", collection: "items")]) { db in
            try db.execute(
                sql: """
                    CREATE TABLE item (
                        id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, note TEXT,
                        isShared INTEGER NOT NULL DEFAULT 1)
                    """)
        }
        phone = try TestDevice(name: "phone", serverURL: server.url, model: model, configure: configure)
        guard started else { return }
        phone.service.start()
        try await write("item1")
        try await waitUntil("the phone holds item1") { try await titles() == ["item1"] }
    }

    /// Creates the item `title`, with a note of `padding` bytes.
    func write(_ title: String, padding: Int = 0) async throws {
        let id = try DocumentID(title)
        let fields: JSONObject = ["title": .string(title), "note": .string(String(repeating: "x", count: padding))]
        _ = try await writer.write([
            .create(in: try CollectionPath("items"), id: id, fields: fields, idempotencyKey: .random())
        ])
    }

    func titles() async throws -> [String] {
        try await phone.database.read { db in try String.fetchAll(db, sql: "SELECT title FROM item ORDER BY title") }
    }
}
