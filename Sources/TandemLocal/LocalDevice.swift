import Foundation
import GRDB
import Logging
import Synchronization
import Tandem
import TandemHarness
import TandemWire

/// A device in this process: its own SQLite file in a temporary folder, the app's tables,
/// and a ``SyncService`` connected to a server. The demo's devices, the benchmarks' and the
/// tests' (`LocalDevice`).
///
/// For example:
///
/// ```swift
/// let server = try await LocalServer(store: .sqlite)
/// let phone = try LocalDevice(name: "phone", serverURL: server.url)   // the cash-flow model
/// phone.service.start()
/// try await phone.database.write { db in … }
/// ```
public final class LocalDevice: Sendable {
    public let name: String
    public let folder: TemporaryDirectory
    public let database: DatabaseQueue
    public let serverURL: String
    public let model: DeviceModel
    private let current: Mutex<SyncService>
    private let configure: @Sendable (inout SyncConfiguration) -> Void

    /// - Parameters:
    ///   - model: The app's tables and what syncs; by default the cash-flow model.
    ///   - folder: Where the device's database (`NAME.sqlite`) is, or is created; a new
    ///     temporary folder by default. Give the same folder to reopen a device's database,
    ///     after its process was killed, say.
    ///   - configure: Adjusts the sync configuration (hooks, clock, delays). Pushes start
    ///     without delay unless it says otherwise.
    public init(
        name: String, serverURL: String, model: DeviceModel = .cashFlow, folder: TemporaryDirectory? = nil,
        configure: @escaping @Sendable (inout SyncConfiguration) -> Void = { _ in }
    ) throws {
        self.name = name
        self.serverURL = serverURL
        self.model = model
        self.configure = configure
        self.folder = try folder ?? TemporaryDirectory(prefix: "tandem-\(name)")
        // WAL with synchronous = NORMAL, as GRDB recommends for apps: a commit does not wait
        // for fsync, and a crash of the app (not of the machine) loses nothing committed.
        var configuration = Configuration()
        configuration.journalMode = .wal
        configuration.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
            // 8 MB of page cache, as the server's (see `SQLiteStore` for why no more).
            try db.execute(sql: "PRAGMA cache_size = -8192")
            // Statement journals in memory, as README recommends: Tandem's grouped writes need
            // one, and past 64 KiB SQLite moves it into a temporary file, written page by page.
            try db.execute(sql: "PRAGMA temp_store = MEMORY")
        }
        database = try DatabaseQueue(path: self.folder.path("\(name).sqlite"), configuration: configuration)
        try database.write(model.createTables)
        current = Mutex(try Self.makeService(name, database, serverURL, model.tables, configure))
    }

    private static func makeService(
        _ name: String, _ database: DatabaseQueue, _ serverURL: String, _ tables: [SyncTable],
        _ configure: (inout SyncConfiguration) -> Void
    ) throws -> SyncService {
        var configuration = SyncConfiguration()
        configuration.pushDelay = .zero
        configuration.reconnectDelay = .milliseconds(50)
        configuration.maxReconnectDelay = .milliseconds(500)
        configuration.logger.logLevel = .critical
        configure(&configuration)
        return try SyncService(
            database: database, serverURL: serverURL, clientId: name, tables: tables, configuration: configuration)
    }

    /// The device's sync service (a new one after ``restart(discardingQueuedWork:)``).
    public var service: SyncService { current.withLock { $0 } }

    /// Stops the service and starts a new one on the same database, as an app relaunch does.
    /// With `discardingQueuedWork`, queued pushes and the resume tokens kept to be stored
    /// are dropped too, as a crash would (queued listener changes are dropped either way).
    /// Without `starting`, the new service is left for the caller to start: a test can then
    /// look at what the relaunch found before the service syncs anything.
    public func restart(discardingQueuedWork: Bool = false, starting: Bool = true) async throws {
        await service.stop(discardingQueuedWork: discardingQueuedWork)
        let fresh = try Self.makeService(name, database, serverURL, model.tables, configure)
        current.withLock { $0 = fresh }
        if starting { fresh.start() }
    }

    // Each reads or writes the device's database asynchronously: a test calling them holds
    // no thread while the sync engine has the database.

    /// Every synced document on this device (see ``SyncService/localDocuments()``).
    public func documents() async throws -> [CollectionPath: [DocumentID: JSONObject]] {
        try await service.localDocuments()
    }

    // MARK: - Cash-flow helpers

    @discardableResult
    public func addAccount(_ name: String, shared: Bool = true) async throws -> CashFlow.Account {
        try await database.write { db in
            var account = CashFlow.Account(name: name, isShared: shared)
            try account.insert(db)
            return account
        }
    }

    @discardableResult
    public func addEntry(_ title: String, amount: Int64, account: Int64, linkedTo: Int64? = nil) async throws
        -> CashFlow.Entry
    {
        try await database.write { db in
            var entry = CashFlow.Entry(accountId: account, title: title, amount: amount, linkedEntryId: linkedTo)
            try entry.insert(db)
            return entry
        }
    }

    public func entries() async throws -> [CashFlow.Entry] {
        try await database.read { db in try CashFlow.Entry.order(Column("id")).fetchAll(db) }
    }

    public func accounts() async throws -> [CashFlow.Account] {
        try await database.read { db in try CashFlow.Account.order(Column("id")).fetchAll(db) }
    }

    /// The local row for a server id.
    public func entry(serverId: String) async throws -> CashFlow.Entry? {
        try await database.read { db in try CashFlow.Entry.filter(Column("serverId") == serverId).fetchOne(db) }
    }

    /// The server id of a local entry row.
    public func serverId(ofEntry id: Int64) async throws -> String? {
        try await database.read { db in
            try String.fetchOne(db, sql: "SELECT serverId FROM entry WHERE id = ?", arguments: [id])
        }
    }

    public func serverId(ofAccount id: Int64) async throws -> String? {
        try await database.read { db in
            try String.fetchOne(db, sql: "SELECT serverId FROM account WHERE id = ?", arguments: [id])
        }
    }

    /// Whether a row is dirty (has unpushed changes).
    public func isDirty(entry id: Int64) async throws -> Bool {
        try await database.read { db in
            try Bool.fetchOne(db, sql: "SELECT isDirty FROM entry WHERE id = ?", arguments: [id]) ?? false
        }
    }
}

/// An app's tables, as a local device creates them, and what of them syncs.
public struct DeviceModel: Sendable {
    public var tables: [SyncTable]
    public var createTables: @Sendable (Database) throws -> Void

    public init(tables: [SyncTable], createTables: @escaping @Sendable (Database) throws -> Void) {
        self.tables = tables
        self.createTables = createTables
    }

    /// The demo's cash-flow book (see ``CashFlow``).
    public static let cashFlow = DeviceModel(tables: CashFlow.tables, createTables: CashFlow.createTables)
}
