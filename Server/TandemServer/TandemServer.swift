import Foundation
import Synchronization
import Logging
import TandemSocket
import TandemWire

/// The companion server: a realtime JSON document server over WebSocket.
///
/// Documents live in SQLite in the configured data folder. Clients write with `write`
/// messages and listen to collections with `listen`; every commit is fanned out to the
/// collection's listeners in commit order. The same type backs `tandem serve` and the tests,
/// which start it on port 0:
///
/// ```swift
/// var configuration = ServerConfiguration(dataDirectory: folder)
/// configuration.port = 0
/// let server = try TandemServer(configuration: configuration)
/// defer { server.shutdown() }
/// let client = try await ServerConnection.connect(to: server.url, clientId: "device-1")
/// ```
///
/// The protocol is described in docs/PROTOCOL.md.
public final class TandemServer: Sendable {
    public let configuration: ServerConfiguration
    /// The port listened on (the one the system picked when configured with 0).
    public let port: Int

    let core: ServerCore
    private let socket: WebSocketServer

    /// Opens the data folder and starts listening.
    ///
    /// - Throws: ``ServerError``: `.invalidConfiguration` for a non-loopback host without
    ///   access control (an open server must not be reachable from other machines) or
    ///   out-of-range settings; `.storage` when the data folder or database cannot be opened;
    ///   `.listen` when the address is taken.
    public init(configuration: ServerConfiguration) throws(ServerError) {
        try configuration.validate()
        self.configuration = configuration
        // The store calls back before the core exists; the box hands its news on once it does.
        let relay = StoreRelay()
        let store = try Self.openStore(configuration, relay)
        let core = ServerCore(configuration: configuration, store: store)
        relay.attach(core)
        do {
            socket = try WebSocketServer(
                host: configuration.host, port: configuration.port, configuration: configuration.socketConfiguration,
                delegate: core, httpHandler: { [core] request, respond in core.serveHTTP(request, respond: respond) },
                httpAdmission: { [core] request in core.admit(request) },
                logger: configuration.logger)
        } catch {
            core.queue.sync { core.stop() }
            throw ServerError(.listen, error.message)
        }
        self.core = core
        port = socket.port
        if configuration.nodeName == nil {
            let port = socket.port
            core.health.update { $0.node = "\(configuration.host):\(port)" }
        }
        core.startMaintenance()
        configuration.logger.info(
            "listening",
            metadata: [
                "tandem.url": "\(url)", "tandem.store": "\(configuration.storage)",
                "tandem.access": "\(configuration.access == nil ? "open (loopback only)" : "tokens and rules")",
            ])
    }

    /// Opens the store the configuration names; its news and reachability reach the core
    /// through `relay`.
    private static func openStore(_ configuration: ServerConfiguration, _ relay: StoreRelay) throws(ServerError)
        -> any DocumentStore
    {
        do {
            switch configuration.storage {
            case .sqlite(let directory):
                return try SQLiteStore(directory: directory, logger: configuration.logger)
            case .memory:
                return try SQLiteStore(inMemoryWith: configuration.logger)
            case .external(let factory):
                return try factory.open(
                    StoreContext(
                        logger: configuration.logger, timeout: configuration.postgresTimeout,
                        onNews: { relay.news($0) }, onReachability: { relay.reachability($0) }))
            }
        } catch {
            throw ServerError(.storage, "cannot open the store (\(configuration.storage)): \(error)")
        }
    }

    /// `ws://HOST:PORT` (`wss://` with TLS), for clients.
    public var url: String {
        let host = configuration.host.contains(":") ? "[\(configuration.host)]" : configuration.host
        return "\(configuration.tls == nil ? "ws" : "wss")://\(host):\(port)"
    }

    /// Closes every connection with 1001, stops listening, and closes the database.
    /// Safe to call more than once. It waits for the connections' close handshakes (half a
    /// second at most) and the store: from async code, `await` the async variant, which waits
    /// on a thread of its own.
    public func shutdown() {
        BlockingCheck.willBlock("TandemServer.shutdown()")
        socket.shutdown()
        core.queue.sync { core.stop() }
    }

    public func shutdown() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            Thread.detachNewThread { [self] in
                shutdown()
                continuation.resume()
            }
        }
    }

    // The accessors below run on the core's queue, behind the messages it is handling; they
    // wait for it without holding a thread.

    /// Connections, listeners and live listeners right now.
    public var stats: ServerStats {
        get async { await onCore { $0.stats } }
    }

    /// Purges tombstones and idempotency keys older than their retention, now rather than at
    /// the next maintenance run.
    @discardableResult
    public func purgeExpired() async -> (tombstones: Int, keys: Int) {
        await onCore { $0.runMaintenance() }
    }

    /// The document, or nil when it does not exist (a tombstone is returned with `deleted`).
    public func document(in collection: CollectionPath, id: DocumentID) async throws -> Document? {
        try await onCore { try $0.store.document(in: collection, id: id)?.document }
    }

    /// A setting of the store's connection as it is in force now, for tests of what the
    /// documents promise: `storeSetting("synchronous")` is SQLite's `PRAGMA synchronous`
    /// (`2` is FULL).
    public func storeSetting(_ name: String) async throws -> String? {
        try await onCore { try $0.store.setting(name) }
    }

    /// Holds every delivery to listeners (with the rest of each connection's outgoing messages,
    /// to keep their order) until ``releaseDeliveries()``: a test's way to make a device hear
    /// of changes late.
    public func holdDeliveries() async {
        await onCore { $0.holdDeliveries() }
    }

    public func releaseDeliveries() async {
        await onCore { $0.releaseDeliveries() }
    }

    /// Replaces the injected faults (nil: none from now on). Counts start again from zero.
    public func setFaults(_ plan: FaultPlan?) async throws(ServerError) {
        try plan?.validate()
        await onCore { $0.faults = plan.map(FaultInjector.init) }
    }

    /// How many faults were injected so far (zero without a ``FaultPlan``).
    public var faultCounts: FaultCounts {
        get async { await onCore { $0.faults?.counts ?? FaultCounts() } }
    }

    /// Every collection holding at least one live document.
    public func collections() async throws -> [CollectionPath] {
        try await onCore { try $0.store.collections().map(\.path) }
    }

    /// Every document, tombstones included, with its collection: for checks and exports.
    public func everyDocument() async throws -> [(collection: CollectionPath, document: Document)] {
        try await onCore { core in
            var all: [(CollectionPath, Document)] = []
            try core.store.forEachDocument { stored in all.append((stored.collection, try stored.document)) }
            return all
        }
    }

    /// Removes every document of `collection`, or everything when nil (the admin API's
    /// `POST /admin/reset`). Listeners of what was removed get a `reset` and the empty snapshot.
    ///
    /// - Returns: How many documents (tombstones included) were removed.
    @discardableResult
    public func reset(collection: CollectionPath?) async throws -> Int {
        try await onCore { try $0.reset(collection) }
    }

    /// Every document, tombstones included, in the export format (NDJSON, docs/ADMIN.md):
    /// what `GET /admin/export` and `tandem export` give.
    public func exportDocuments() async throws -> [UInt8] {
        try await onCore { try $0.export() }
    }

    /// Stores the documents of an export, all or none (`POST /admin/import`, `tandem import`,
    /// `tandem serve --import`).
    ///
    /// - Throws: ``ImportError`` for a malformed line (naming it) or a document that exists
    ///   already; nothing is stored then.
    @discardableResult
    public func importDocuments(_ export: [UInt8]) async throws -> ImportSummary {
        try await onCore { try $0.importDocuments(export) }
    }

    /// Where a document stands in its collection's change feed, with the rows around it: what
    /// a check needs to tell why a listener missed it. Nil when the document does not exist.
    public func feedExcerpt(of collection: CollectionPath, id: DocumentID, around rows: Int = 3) async throws
        -> FeedExcerpt?
    {
        try await onCore { core in
            guard let stored = try core.store.document(in: collection, id: id) else { return nil }
            let bounds = try core.store.feedBounds(of: collection)
            let page = try core.store.page(
                of: collection, after: max(0, stored.sequence - Int64(rows) - 1), limit: 2 * rows + 1, maxBytes: .max)
            return FeedExcerpt(
                collection: collection, id: id, version: stored.version, deleted: stored.deleted,
                sequence: stored.sequence, createSequence: stored.createSequence, createClient: stored.createClient,
                lastSequence: bounds.last, horizon: bounds.horizon,
                neighbours: page.rows.map { ($0.sequence, $0.id, $0.version, $0.deleted) })
        }
    }

    /// Every live document of the collection, in the order of their last write.
    public func documents(in collection: CollectionPath) async throws -> [Document] {
        try await onCore { try $0.store.documents(in: collection) }
    }

    private func onCore<T: Sendable>(_ body: @escaping @Sendable (ServerCore) throws -> T) async throws -> T {
        let core = self.core
        return try await withCheckedThrowingContinuation { continuation in
            core.queue.async { continuation.resume(with: Result { try body(core) }) }
        }
    }

    private func onCore<T: Sendable>(_ body: @escaping @Sendable (ServerCore) -> T) async -> T {
        let core = self.core
        return await withCheckedContinuation { continuation in
            core.queue.async { continuation.resume(returning: body(core)) }
        }
    }
}

/// Hands the store's news (another node's commits, the database's reachability), which come on
/// the store's own thread, to the core's queue.
private final class StoreRelay: Sendable {
    private let core = Mutex<ServerCore?>(nil)

    func attach(_ core: ServerCore) { self.core.withLock { $0 = core } }

    func news(_ collections: Set<CollectionPath>?) {
        guard let core = core.withLock({ $0 }) else { return }
        core.queue.async { core.storeNews(collections) }
    }

    func reachability(_ reachable: Bool) {
        guard let core = core.withLock({ $0 }) else { return }
        core.queue.async { core.storeReachability(reachable) }
    }
}

/// A document's place in its collection's change feed (``TandemServer/feedExcerpt(of:id:around:)``).
public struct FeedExcerpt: Sendable, CustomStringConvertible {
    public var collection: CollectionPath
    public var id: DocumentID
    public var version: Int64
    public var deleted: Bool
    /// The sequence of its latest write, and of its create.
    public var sequence: Int64
    public var createSequence: Int64
    public var createClient: String?
    /// The collection's last sequence and purge horizon.
    public var lastSequence: Int64
    public var horizon: Int64
    /// The rows around it in the feed, by sequence.
    public var neighbours: [(sequence: Int64, id: DocumentID, version: Int64, deleted: Bool)]

    public init(
        collection: CollectionPath, id: DocumentID, version: Int64, deleted: Bool, sequence: Int64,
        createSequence: Int64, createClient: String?, lastSequence: Int64, horizon: Int64,
        neighbours: [(sequence: Int64, id: DocumentID, version: Int64, deleted: Bool)]
    ) {
        self.collection = collection
        self.id = id
        self.version = version
        self.deleted = deleted
        self.sequence = sequence
        self.createSequence = createSequence
        self.createClient = createClient
        self.lastSequence = lastSequence
        self.horizon = horizon
        self.neighbours = neighbours
    }

    public var description: String {
        let around = neighbours.map { "\($0.sequence): \($0.id) v\($0.version)\($0.deleted ? " deleted" : "")" }
        return "\(collection)/\(id) v\(version)\(deleted ? " deleted" : "") at sequence \(sequence) (created at "
            + "\(createSequence) by \(createClient ?? "?")); the feed's last sequence \(lastSequence), horizon "
            + "\(horizon); around it: \(around.joined(separator: ", "))"
    }
}
