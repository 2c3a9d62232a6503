import Foundation
import GRDB
import Synchronization
@_spi(Testing) import Tandem
import TandemTesting
import TandemWire
import Testing

/// Collects what a hook sees, for tests to wait on.
final class Seen<Value: Sendable>: Sendable {
    private let values = Mutex<[Value]>([])
    func append(_ value: Value) { values.withLock { $0.append(value) } }
    var all: [Value] { values.withLock { $0 } }
    var count: Int { values.withLock { $0.count } }
}

/// Loses acknowledgements on purpose, as a network failure after the server's commit would:
/// give ``dropsThis`` to `SyncHooks.dropAcknowledgement`.
final class AcknowledgementDropper: Sendable {
    private let remaining: Mutex<Int>

    init(dropping count: Int) { remaining = Mutex(count) }

    /// How many more acknowledgements will be lost.
    var remainingDrops: Int { remaining.withLock { $0 } }

    /// Loses the next `count` acknowledgements.
    func drop(next count: Int) { remaining.withLock { $0 = count } }

    /// Whether to lose this acknowledgement (counts it).
    @Sendable func dropsThis() -> Bool {
        remaining.withLock { remaining in
            defer { remaining = max(0, remaining - 1) }
            return remaining > 0
        }
    }
}

extension TestDevice {
    /// Waits until the service is connected and its listeners are up to date.
    func waitUntilConnected() async throws {
        try await waitUntil("\(name) is connected") { service.status.isConnected }
    }

    func accountCount() throws -> Int {
        try database.read { db in try CashFlow.Account.fetchCount(db) }
    }

    /// The titles of the rows of an `item` table (the scoped models of some tests), in row order.
    func itemTitles() async throws -> [String] {
        try await database.read { db in try String.fetchAll(db, sql: "SELECT title FROM item ORDER BY id") }
    }
}

extension ServerMessage.Snapshot {
    func contains(_ id: DocumentID) -> Bool { changes.contains { $0.document.id == id } }

    /// The last page of a listener's catch-up: it is current from here.
    func isCurrent(target: String) -> Bool { self.target == target && initial && !hasMore }

    /// A live snapshot that brings nothing but a new token (after the device's own write).
    func movesTokenAlone(target: String) -> Bool { self.target == target && !initial && changes.isEmpty }
}

/// The documents of a collection on the server.
func serverDocuments(_ server: TestServer, _ collection: String) async throws -> [Document] {
    try await server.server.documents(in: try CollectionPath(collection))
}

/// A phone and a laptop sharing an account with one entry ("Rent", -100), both synced, with a
/// chosen conflict policy and clocks.
struct DevicePair {
    let server: TestServer
    let phone: TestDevice
    let laptop: TestDevice
    let accountId: Int64

    /// - Parameter serverClock: The server's clock; give it the devices' test clock, so that
    ///   the times the devices take in from the server do not overtake the test's.
    init(
        policy: ConflictPolicy = .lastWriteWins, phoneClock: any SyncClock = SystemClock(),
        laptopClock: any SyncClock = SystemClock(),
        serverClock: (any SyncClock)? = nil, phoneHooks: SyncHooks = SyncHooks()
    ) async throws {
        server = try await TestServer { configuration in
            if let serverClock { configuration.clock = { serverClock.now() } }
        }
        phone = try TestDevice(name: "phone", serverURL: server.url) { configuration in
            configuration.conflictPolicy = policy
            configuration.clock = phoneClock
            configuration.hooks = phoneHooks
        }
        laptop = try TestDevice(name: "laptop", serverURL: server.url) { configuration in
            configuration.conflictPolicy = policy
            configuration.clock = laptopClock
        }
        phone.service.start()
        laptop.service.start()
        let account = try await phone.addAccount("Household")
        accountId = account.id!
        try await phone.addEntry("Rent", amount: -100, account: accountId)
        let report = try await Convergence.waitUntilQuiet(server: server, devices: [phone, laptop])
        guard report.isConverged else { throw TestFailure("the pair did not converge: \(report.firstDifferences)") }
    }

    func edit(_ device: TestDevice, _ assignment: String) async throws {
        try await device.database.write { db in try db.execute(sql: "UPDATE entry SET \(assignment)") }
    }

    func converge() async throws {
        let report = try await Convergence.waitUntilQuiet(server: server, devices: [phone, laptop])
        #expect(report.isConverged, "\(report.firstDifferences)")
    }

    func entries() async throws -> (phone: [CashFlow.Entry], laptop: [CashFlow.Entry]) {
        (try await phone.entries(), try await laptop.entries())
    }
}

struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
