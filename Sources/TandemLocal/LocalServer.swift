import Foundation
import Synchronization
import TandemHarness
import TandemServer
import TandemServerPostgres

/// A companion server in this process, on a free port, with its data in a temporary folder
/// (or a fresh database of a PostgreSQL cluster) that is removed afterwards: the server the
/// demo, the soak and the benchmarks run, and the one under the tests' `LocalServer`.
///
/// For example:
///
/// ```swift
/// let server = try await LocalServer(store: .sqlite)
/// defer { server.stopWithoutWaiting() }
/// let device = try LocalDevice(name: "phone", serverURL: server.url)
/// ```
///
/// ``restart()`` stops the server and starts it again on the same port and data, as a
/// server process restart would, so clients reconnect to the same URL.
public final class LocalServer: Sendable {
    /// Where a local server keeps its documents.
    public enum Store: Sendable {
        /// A SQLite file in the server's temporary folder.
        case sqlite
        /// A database of its own in this cluster, dropped when the server goes.
        case postgres(PostgresCluster)
    }

    public let directory: TemporaryDirectory
    private let running = Mutex<TandemServer?>(nil)
    /// While stopped, the port is held (bound, not listening): a device trying it is refused,
    /// and no server another test starts meanwhile can take it.
    private let held = Mutex<RefusingPort?>(nil)
    private let baseConfiguration: ServerConfiguration
    private let database: (cluster: PostgresCluster, url: String)?

    /// - Parameter configure: Adjusts the configuration (limits, retention, clock, TLS); it
    ///   may also set the storage itself, to join other nodes on one database.
    public init(store: Store, configure: (inout ServerConfiguration) -> Void = { _ in }) async throws {
        directory = try TemporaryDirectory(prefix: "tandem-server")
        var configuration = ServerConfiguration(dataDirectory: directory.url)
        var database: (cluster: PostgresCluster, url: String)?
        if case .postgres(let cluster) = store {
            let url = try await onOwnThread { try cluster.createDatabase() }
            configuration.storage = .postgres(url: url)
            database = (cluster, url)
        }
        self.database = database
        configuration.port = 0
        configuration.logger.logLevel = .warning
        configure(&configuration)
        // Starting waits for the socket's service thread and the store: not on a thread of
        // Swift concurrency's pool.
        let startConfiguration = configuration
        let server = try await onOwnThread { try TandemServer(configuration: startConfiguration) }
        configuration.port = server.port
        baseConfiguration = configuration
        running.withLock { $0 = server }
    }

    /// The running server. Calling it while the server is stopped is a test bug.
    public var server: TandemServer {
        guard let server = running.withLock({ $0 }) else { preconditionFailure("the local server is stopped") }
        return server
    }

    /// `ws://127.0.0.1:PORT` (`wss://` with TLS); stays the same across ``restart()``.
    public var url: String { "\(baseConfiguration.tls == nil ? "ws" : "wss")://127.0.0.1:\(port)" }
    public var port: Int { baseConfiguration.port }

    /// Stops the server: connections close with 1001, the database is closed. The port stays
    /// reserved for ``start()``.
    public func stop() async {
        guard let server = takeServer() else { return }
        await server.shutdown()
        held.withLock { $0 = try? RefusingPort(port: port) }
    }

    /// ``stop()`` for code on a thread of its own (a hook of the sync engine), which it blocks
    /// until the server is down.
    public func stopBlocking() {
        guard let server = takeServer() else { return }
        server.shutdown()
        held.withLock { $0 = try? RefusingPort(port: port) }
    }

    /// Stops the server from code that cannot wait (a `defer`): the shutdown runs on a thread
    /// of its own, and this returns at once.
    public func stopWithoutWaiting() {
        guard let server = takeServer() else { return }
        Thread.detachNewThread { server.shutdown() }
    }

    /// The running server, no longer running as far as this local server is concerned.
    private func takeServer() -> TandemServer? {
        running.withLock { server in
            defer { server = nil }
            return server
        }
    }

    /// Starts a stopped server again on the same port and data folder.
    public func start() async throws {
        held.withLock { $0 = nil }
        let configuration = baseConfiguration
        let server = try await onOwnThread { try TandemServer(configuration: configuration) }
        running.withLock { $0 = server }
    }

    /// Stops and starts again.
    public func restart() async throws {
        await stop()
        try await start()
    }

    public var isRunning: Bool { running.withLock { $0 != nil } }

    /// The last reference may go on any thread, one of Swift concurrency's among them: the
    /// server shuts down (and its PostgreSQL database is dropped) on a thread of its own.
    deinit {
        let server = running.withLock { $0 }
        let database = database
        let directory = directory  // removed once the server is down
        guard server != nil || database != nil else { return }
        Thread.detachNewThread {
            server?.shutdown()
            if let database { database.cluster.dropDatabase(url: database.url) }
            withExtendedLifetime(directory) {}
        }
    }
}
