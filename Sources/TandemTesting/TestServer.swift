import Foundation
import TandemLocal
import TandemServer

/// A local server for tests, configured by the run: the same tests run against both stores
/// and over TLS.
///
/// - `TANDEM_TEST_STORE=postgres` puts each test server's documents in a database of its own
///   in the shared throwaway PostgreSQL cluster (``PostgresCluster/shared()``); otherwise
///   SQLite.
/// - `TANDEM_TEST_TLS_DIR` names a folder with `server.pem` and `server.key` (for 127.0.0.1
///   and localhost, signed by a test authority the run trusts through `SSL_CERT_FILE`): test
///   servers then speak `wss://` only. scripts/test runs the protocol suites this way.
///
/// For example:
///
/// ```swift
/// let server = try await TestServer()
/// defer { server.stopWithoutWaiting() }
/// let device = try TestDevice(name: "phone", serverURL: server.url)
/// ```
public typealias TestServer = LocalServer

/// A local device for tests (``LocalDevice``).
public typealias TestDevice = LocalDevice

extension LocalServer {
    /// Which store test servers use: `TANDEM_TEST_STORE` (`sqlite`, the default, or `postgres`).
    public static var storeKind: String {
        ProcessInfo.processInfo.environment["TANDEM_TEST_STORE"] ?? "sqlite"
    }

    /// `TANDEM_TEST_TLS_DIR`, the folder of the test servers' certificate and key.
    public static var tlsFolder: URL? {
        ProcessInfo.processInfo.environment["TANDEM_TEST_TLS_DIR"].map(URL.init(fileURLWithPath:))
    }

    /// True when test servers speak TLS (tests of raw frames over plain TCP do not run then).
    public static var usesTLS: Bool { tlsFolder != nil }

    /// A server for a test: the store and TLS the run asks for.
    ///
    /// - Parameter configure: Adjusts the configuration (limits, retention, clock, storage).
    public convenience init(configure: (inout ServerConfiguration) -> Void = { _ in }) async throws {
        let store: Store = Self.storeKind == "postgres" ? .postgres(try await PostgresCluster.shared()) : .sqlite
        let folder = Self.tlsFolder
        try await self.init(store: store) { configuration in
            // A bound on progress, not speed: on a loaded machine a test's client can take more
            // than the production 10 s between its handshake and its hello (a CI run closed one
            // with 1008 this way). Tests of the deadline set their own.
            configuration.helloTimeout = .seconds(120)
            if let folder {
                configuration.tls = .init(
                    certificate: folder.appendingPathComponent("server.pem"),
                    privateKey: folder.appendingPathComponent("server.key"))
            }
            configure(&configuration)
        }
    }
}
