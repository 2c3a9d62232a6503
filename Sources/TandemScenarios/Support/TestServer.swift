import Foundation
import Synchronization
import TandemServer

/// A companion server for tests: in this process, on a free port, with its data in a
/// temporary folder (or a fresh PostgreSQL database) that is removed afterwards.
///
/// For example:
///
/// ```swift
/// let server = try await TestServer()
/// defer { server.stop() }
/// let device = try TestDevice(name: "phone", serverURL: server.url)
/// ```
///
/// The store comes from the environment, so that the same tests run against both:
/// `TANDEM_TEST_STORE=postgres` puts each test server's documents in a database of its own in
/// the shared throwaway PostgreSQL cluster (``PostgresCluster/shared()``); otherwise SQLite.
///
/// ``restart()`` stops the server and starts it again on the same port and data, as a
/// server process restart would, so clients reconnect to the same URL.
public final class TestServer: Sendable {
    public let directory: TemporaryDirectory
    private let running = Mutex<TandemServer?>(nil)
    /// While stopped, the port is held (bound, not listening): a device trying it is refused,
    /// and no server another test starts meanwhile can take it.
    private let held = Mutex<RefusingPort?>(nil)
    private let baseConfiguration: ServerConfiguration
    private let database: (cluster: PostgresCluster, url: String)?

    /// Which store test servers use: `TANDEM_TEST_STORE` (`sqlite`, the default, or `postgres`).
    public static var storeKind: String {
        ProcessInfo.processInfo.environment["TANDEM_TEST_STORE"] ?? "sqlite"
    }

    /// `TANDEM_TEST_TLS_DIR`: a folder with `server.pem` and `server.key` (for 127.0.0.1 and
    /// localhost, signed by a test authority the run trusts through `SSL_CERT_FILE`): test
    /// servers then speak `wss://` only. scripts/test runs the protocol suites this way.
    public static var tlsFolder: URL? {
        ProcessInfo.processInfo.environment["TANDEM_TEST_TLS_DIR"].map(URL.init(fileURLWithPath:))
    }

    /// True when test servers speak TLS (tests of raw frames over plain TCP do not run then).
    public static var usesTLS: Bool { tlsFolder != nil }

    /// - Parameter configure: Adjusts the configuration (limits, retention, clock, storage).
    public init(configure: (inout ServerConfiguration) -> Void = { _ in }) async throws {
        directory = try TemporaryDirectory(prefix: "tandem-server")
        var configuration = ServerConfiguration(dataDirectory: directory.url)
        var database: (cluster: PostgresCluster, url: String)?
        if Self.storeKind == "postgres" {
            let cluster = try await PostgresCluster.shared()
            let url = try await onOwnThread { try cluster.createDatabase() }
            configuration.storage = .postgres(url: url)
            database = (cluster, url)
        }
        self.database = database
        configuration.port = 0
        configuration.logger.logLevel = .warning
        // A bound on progress, not speed: on a loaded machine a test's client can take more than
        // the production 10 s between its handshake and its hello (a CI run closed one with
        // 1008 this way). Tests of the deadline set their own.
        configuration.helloTimeout = .seconds(120)
        if let folder = Self.tlsFolder {
            configuration.tls = .init(
                certificate: folder.appendingPathComponent("server.pem"),
                privateKey: folder.appendingPathComponent("server.key"))
        }
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
        guard let server = running.withLock({ $0 }) else { preconditionFailure("the test server is stopped") }
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

    /// The running server, no longer running as far as this test server is concerned.
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
