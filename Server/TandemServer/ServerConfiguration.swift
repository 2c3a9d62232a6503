import CoreMetrics
import Foundation
import Logging
import TandemSocket
import TandemWire

/// How a ``TandemServer`` runs: where it listens, where it keeps its data, its limits.
///
/// For example, a server for a test, on any free port, with its data in a temporary folder:
///
/// ```swift
/// var configuration = ServerConfiguration(dataDirectory: temporaryFolder)
/// configuration.port = 0
/// let server = try TandemServer(configuration: configuration)
/// ```
public struct ServerConfiguration: Sendable {
    /// The address to listen on. Without access control the server is open, so it only
    /// accepts a loopback address (`127.0.0.1`, `::1`, `localhost`). Default: `127.0.0.1`.
    public var host = "127.0.0.1"
    /// Tokens and rules (see ``AccessControl``); nil for an open server, which then listens on
    /// loopback only. Default: nil.
    public var access: AccessControl?
    /// Failures to inject on purpose (see ``FaultPlan``); nil for none. Default: nil.
    public var faults: FaultPlan?
    /// The port; 0 picks a free one (see ``TandemServer/port``). Default: 7878.
    public var port = 7878
    /// Where documents are kept: a SQLite file in a folder (one server), or a PostgreSQL
    /// database (any number of server nodes).
    public var storage: Storage
    /// Message, write, listener and document limits, announced in `welcome`.
    public var limits = Limits.default
    /// How long a deleted document's tombstone is kept. A listener whose resume token is older
    /// gets a `reset`. Default: 30 days.
    public var tombstoneRetention: Duration = .seconds(30 * 24 * 3600)
    /// How long an idempotency key is remembered. Default: 30 days.
    public var idempotencyRetention: Duration = .seconds(30 * 24 * 3600)
    /// How often expired tombstones and keys are purged. Default: 1 hour.
    public var maintenanceInterval: Duration = .seconds(3600)
    /// The most documents in one page of an initial snapshot. Default: 1,000.
    public var snapshotPageSize = 1000
    /// The most bytes of document fields in one snapshot frame. Default: 512 KiB.
    public var snapshotPageBytes = 512 << 10
    /// The most bytes waiting to be sent to one connection before it is dropped (1008). A
    /// connection's live listeners stop being pushed to well before (at an eighth of it) and
    /// catch up from the feed as it drains, so this bounds what is sent besides them.
    /// Default: 16 MiB.
    public var maxQueuedBytesPerConnection = 16 << 20
    /// The largest body of `POST /admin/import` (`tandem import`), read only once the request
    /// carries the admin token. Every other request takes 64 KiB at most, or no body at all.
    /// Default: 64 MiB.
    public var maxImportBytes = 64 << 20
    /// The most bytes the bodies of all HTTP requests under way may hold together; a request
    /// whose `Content-Length` does not fit beside them is answered 503 (`Retry-After: 1`),
    /// unread. Default: 128 MiB.
    public var maxHTTPBodyBytesInFlight = 128 << 20
    /// The most accepted connections still in their HTTP request line and headers (a WebSocket
    /// upgrade or a plain request) at once; more are closed as they are accepted. Each has
    /// 10 s for its headers. Default: 1,024.
    public var maxHandshakes = 1024
    /// Seconds a connection may take none of what waits for it (its peer's TCP stack
    /// acknowledges nothing) before it is closed with 1008: its peer stopped reading. A peer
    /// that reads, however slowly, is never closed for it. Default: 30.
    public var stallTimeout: UInt16 = 30
    /// How long a new connection may take to send `hello` before it is closed (1008), so that
    /// connections that open and never speak do not hold the server's resources. Default: 10 s.
    public var helloTimeout: Duration = .seconds(10)
    /// With a PostgreSQL store: how long to wait for the database to answer a statement before
    /// counting the connection as lost (a connection attempt waits this long, 10 s at most). A
    /// cut network link is found sooner, in about 5 s, by TCP itself; this deadline is for a
    /// database that keeps the connection but stops answering. Generous, because a loaded
    /// database is slow, not gone. Default: 30 s.
    public var postgresTimeout: Duration = .seconds(30)
    /// How long a node tries to find out whether a group commit whose answer it lost (its
    /// database connection failed during `COMMIT`) took effect, before it answers the writes
    /// `outcome-unknown` (resend under the same idempotency keys). Default: 10 s.
    public var commitOutcomeTimeout: Duration = .seconds(10)
    /// Seconds of silence before the server pings a client. Default: 20.
    public var pingInterval: UInt16 = 20
    /// Seconds of silence after which a client is considered gone. Default: 45.
    public var idleTimeout: UInt16 = 45
    /// The server's clock, in milliseconds since 1970. Tests replace it to age tombstones.
    public var clock: @Sendable () -> Int64 = { Int64((Date().timeIntervalSince1970 * 1000).rounded()) }
    public var logger = Logger(label: "tandem.server")

    /// A server keeping its documents in SQLite in `dataDirectory` (`tandem.sqlite`, created
    /// if missing).
    public init(dataDirectory: URL) {
        storage = .sqlite(directory: dataDirectory)
    }

    public init(storage: Storage) {
        self.storage = storage
    }

    /// Where a server keeps its documents.
    public enum Storage: Sendable, CustomStringConvertible {
        /// `tandem.sqlite` in this folder, for one server process.
        case sqlite(directory: URL)
        /// A store another target provides: PostgreSQL's, shared by every server node given the
        /// same URL, is `.postgres(url:)` from `TandemServerPostgres`.
        case external(StoreFactory)
        /// SQLite in memory, gone when the server stops: for tests that need no files.
        /// Nothing is durable, whatever an `ack` says.
        case memory

        public var description: String {
            switch self {
            case .memory: "SQLite in memory (gone on exit)"
            case .sqlite(let directory): "SQLite in \(directory.path)"
            case .external(let factory): factory.summary
            }
        }

        /// A URL with any password replaced, for logs.
        package static func withoutPassword(_ url: String) -> String {
            guard var components = URLComponents(string: url), components.password != nil else { return url }
            components.password = "***"
            return components.string ?? url
        }
    }

    /// A name for this node in health reports and logs. Default: `HOST:PORT`.
    public var nodeName: String?

    /// Test seams: points where a test can hold the server to force an interleaving.
    public var hooks = ServerHooks()

    /// The token that opens the admin API (`/admin/…`: reset, export, import, clients,
    /// faults), sent as `Authorization: Bearer TOKEN`. Without one, the admin API answers
    /// requests from loopback addresses only. Default: nil.
    public var adminToken: String?

    /// Where the server's metrics go besides its own `/metrics` page: an app embedding the
    /// server passes its swift-metrics factory (StatsD, OpenTelemetry, …). The server never
    /// bootstraps `MetricsSystem` itself. Default: nil.
    public var metricsFactory: (any MetricsFactory)?

    /// A TLS certificate chain and private key (PEM files): the server speaks `wss://`.
    public var tls: TLSFiles?

    /// Lets a server with a token file listen on a non-loopback address without TLS (bearer
    /// tokens then cross the network in the clear), for a server behind a proxy that
    /// terminates TLS. Default: false.
    public var allowsPlaintext = false

    /// A certificate and its private key, as PEM files.
    public struct TLSFiles: Sendable {
        public var certificate: URL
        public var privateKey: URL

        public init(certificate: URL, privateKey: URL) {
            self.certificate = certificate
            self.privateKey = privateKey
        }
    }

    var socketConfiguration: WebSocketConfiguration {
        var socket = WebSocketConfiguration()
        socket.maxMessageBytes = limits.maxMessageBytes
        socket.maxQueuedBytes = maxQueuedBytesPerConnection
        socket.pingInterval = pingInterval
        socket.idleTimeout = idleTimeout
        socket.stallTimeout = stallTimeout
        socket.maxHTTPBodyBytes = maxImportBytes
        socket.maxHTTPBodyBytesInFlight = maxHTTPBodyBytesInFlight
        socket.maxHandshakes = maxHandshakes
        socket.tlsCertificate = tls?.certificate.path
        socket.tlsPrivateKey = tls?.privateKey.path
        return socket
    }

    var isLoopback: Bool {
        ["127.0.0.1", "::1", "localhost"].contains(host) || host.hasPrefix("127.")
    }
}

/// Why a ``TandemServer`` could not start.
public struct ServerError: Error, Sendable, CustomStringConvertible {
    public struct Code: RawRepresentable, Hashable, Sendable {
        public var rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }

        /// A setting is out of range or not allowed.
        public static let invalidConfiguration = Code(rawValue: "invalid-configuration")
        /// The data folder or its database could not be opened.
        public static let storage = Code(rawValue: "storage")
        /// The address could not be listened on.
        public static let listen = Code(rawValue: "listen")
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { message }
}

/// Points inside the server where a test can watch or hold it. Each runs on the server's core
/// queue: a hook that blocks holds the whole node there.
public struct ServerHooks: Sendable {
    /// Inside a group commit's transaction, after everything is written and the collections'
    /// sequence numbers are taken, before the commit: with PostgreSQL, the collections' locks
    /// are held here.
    public var beforeCommit: (@Sendable () -> Void)?
    /// In a listener's catch-up, after a frame with more to come, where the server would wait
    /// for the connection to drain: returning true holds the rest of the catch-up until the
    /// hook's argument is called (from any thread), as a drain would go on with it. Writes
    /// are applied meanwhile, so a test can put one between a query's first frame and its last.
    public var holdsCatchUp: (@Sendable (_ goOn: @escaping @Sendable () -> Void) -> Bool)?
    /// With a PostgreSQL store, asked before each group commit: where to cut the store's connection
    /// (nil: nowhere), as a network failure or a database restart would, for tests of a commit
    /// whose answer is lost.
    public var cutsStoreAtCommit: (@Sendable () -> StoreCut?)?

    public init() {}
}

/// Where ``ServerHooks/cutsStoreAtCommit`` cuts a commit's connection to PostgreSQL.
public enum StoreCut: Sendable {
    /// Before `COMMIT` is sent: nothing commits, but the node cannot tell.
    case beforeCommitSent
    /// Once `COMMIT` has gone out, before its answer is read: the transaction commits, and the
    /// node cannot tell.
    case afterCommitSent
}

extension ServerConfiguration {
    /// Refuses settings the server cannot run with, saying which and why: an open server
    /// reachable from other machines, tokens sent in the clear, unreadable TLS files, and
    /// out-of-range numbers.
    func validate() throws(ServerError) {
        try validateExposure()
        try validateLimits()
    }

    /// Who can reach the server, and what crosses the network in the clear.
    private func validateExposure() throws(ServerError) {
        guard isLoopback || access != nil else {
            throw ServerError(
                .invalidConfiguration,
                "without access control the server only listens on loopback (127.0.0.1 or ::1), not \(host)"
            )
        }
        if !isLoopback, access?.requiresToken == true, tls == nil, !allowsPlaintext {
            throw ServerError(
                .invalidConfiguration,
                "listening on \(host) with tokens but without TLS would send every bearer token "
                    + "across the network in the clear: give a certificate and key (--tls-cert, --tls-key), or "
                    + "--allow-plaintext when a proxy in front of the server terminates TLS")
        }
        if let tls {
            for file in [tls.certificate, tls.privateKey] where !FileManager.default.isReadableFile(atPath: file.path) {
                throw ServerError(.invalidConfiguration, "cannot read the TLS file \(file.path)")
            }
        }
    }

    /// Numbers in range, and settings that would open or wedge the server.
    private func validateLimits() throws(ServerError) {
        guard (0...65535).contains(port) else {
            throw ServerError(.invalidConfiguration, "port \(port) is not between 0 and 65535")
        }
        try faults?.validate()
        if adminToken?.isEmpty == true {
            throw ServerError(.invalidConfiguration, "the admin token must not be empty (it would open the admin API)")
        }
        guard maxImportBytes >= 0,
            maxHTTPBodyBytesInFlight >= maxImportBytes
        else {
            throw ServerError(
                .invalidConfiguration,
                "maxHTTPBodyBytesInFlight (\(maxHTTPBodyBytesInFlight)) must hold at least one import "
                    + "of maxImportBytes (\(maxImportBytes))")
        }
        guard maxHandshakes >= 1 else {
            throw ServerError(
                .invalidConfiguration, "maxHandshakes must be at least 1, not \(maxHandshakes)")
        }
        guard stallTimeout >= 1 else {
            throw ServerError(.invalidConfiguration, "stallTimeout must be at least 1 second, not 0")
        }
        guard commitOutcomeTimeout >= .zero else {
            throw ServerError(
                .invalidConfiguration,
                "commitOutcomeTimeout must not be negative, not \(commitOutcomeTimeout)")
        }
        guard limits.maxMessageBytes >= 1024, limits.maxOpsPerWrite >= 1, limits.maxListenersPerConnection >= 1,
            limits.maxDocumentBytes >= 2
        else {
            throw ServerError(.invalidConfiguration, "limits must be positive (messages at least 1 KiB): \(limits)")
        }
        guard snapshotPageSize >= 1, snapshotPageBytes >= 1024 else {
            throw ServerError(
                .invalidConfiguration,
                "snapshot pages must hold at least 1 document and 1 KiB: snapshotPageSize "
                    + "\(snapshotPageSize), snapshotPageBytes \(snapshotPageBytes)")
        }
    }
}
