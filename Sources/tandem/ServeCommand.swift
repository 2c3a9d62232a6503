import ArgumentParser
import Foundation
import Logging
import TandemSQLite
import TandemServer
import TandemServerPostgres
import TandemWire

struct ServeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run the companion server.",
        discussion: """
            Documents are kept in SQLite in the data folder, or, with --postgres, in a PostgreSQL \
            database that any number of server nodes share (see docs/SCALE-OUT.md). Without \
            access control the server only listens on loopback. With --tokens and/or --rules, clients present a token and \
            everything the rules do not allow is denied (file formats in the README).

            The same port serves the live console (open http://HOST:PORT/ in a browser), /healthz, \
            /metrics (Prometheus) and the admin API (/admin/…, docs/ADMIN.md), which answers the \
            admin token (--admin-token, or TANDEM_ADMIN_TOKEN) or, without one, loopback only.

            Examples:
              tandem serve
              tandem serve --port 0 --data /tmp/tandem     (any free port)
              tandem serve --memory --import seed.ndjson    (a throwaway server with seed data)
              tandem serve --host 0.0.0.0 --tokens tokens.json --rules rules.json
              tandem serve --port 7001 --postgres 'postgresql://tandem@/tandem?host=/run/postgresql'
              tandem serve --host 0.0.0.0 --tls-cert cert.pem --tls-key key.pem --tokens tokens.json --rules rules.json
            """)

    @Option(help: "The address to listen on (loopback only without access control).")
    var host = "127.0.0.1"

    @Option(help: "The port; 0 picks a free one.")
    var port = 7878

    @Option(help: "The data folder of the SQLite store, created if missing (default: ./tandem-data).")
    var data: String?

    @Flag(help: "Keep documents in memory, gone on exit (for tests; nothing is durable).")
    var memory = false

    @Option(
        name: .customLong("import"),
        help: ArgumentHelp("Seed the store with an export (NDJSON, from tandem export) at start.", valueName: "file"))
    var importFile: String?

    @Option(
        help: ArgumentHelp(
            "The token of the admin API (/admin/…); also read from TANDEM_ADMIN_TOKEN. Without one, loopback only.",
            valueName: "token"))
    var adminToken: String?

    @Option(
        help: ArgumentHelp(
            "Keep documents in this PostgreSQL database instead of SQLite: every node given the same URL serves the same data.",
            valueName: "url"))
    var postgres: String?

    @Option(
        help: ArgumentHelp(
            "With --postgres: how long the database may take to answer one statement before the connection counts as lost (default 30; a cut link is found in about 5 s regardless).",
            valueName: "seconds"))
    var postgresTimeout: Double?

    @Option(help: "A TLS certificate chain (PEM): serve wss:// instead of ws:// (with --tls-key).")
    var tlsCert: String?

    @Option(help: "The TLS certificate's private key (PEM).")
    var tlsKey: String?

    @Flag(help: "Allow a token file on a non-loopback address without TLS (for a proxy that terminates TLS).")
    var allowPlaintext = false

    @Option(help: "This node's name in /healthz and logs (default: HOST:PORT).")
    var nodeName: String?

    @Option(help: "A JSON file of bearer tokens and the user each names: {\"tokens\": {\"TOKEN\": \"USER\"}}.")
    var tokens: String?

    @Option(help: "A JSON file of access rules: who may read and write which collections.")
    var rules: String?

    @Option(
        help: """
            Verify JWTs from an identity provider with this key set: a JWKS file (read again when it changes) or \
            an https:// URL (fetched at start, cached, refetched on an unknown kid and before its max-age ends).
            """)
    var jwks: String?

    @Option(help: "The `iss` a JWT must carry (needed with --jwks or --jwt-secret-file).")
    var jwtIssuer: String?

    @Option(help: "A value the JWT's `aud` must hold (needed with --jwks or --jwt-secret-file).")
    var jwtAudience: String?

    @Option(help: "The JWT claim that names the user.")
    var jwtUserClaim: String = "sub"

    @Option(help: "Seconds a JWT's exp and nbf may be off, for clocks that differ.")
    var jwtLeeway: Int = 60

    @Option(help: "A certificate authority (PEM) to trust for the --jwks URL, for a provider inside a private network.")
    var jwksCa: String?

    @Option(help: "A file holding the raw HMAC secret for HS256 JWTs (with or without --jwks).")
    var jwtSecretFile: String?

    @Option(help: "Fault injection: seed of the injected faults, to replay a run.")
    var faultSeed: UInt64 = 1

    @Option(help: "Fault injection: drop a connection on a message with this probability.")
    var faultDropConnection: Double = 0

    @Option(help: "Fault injection: drop every connection at its Nth message.")
    var faultDropAfter: Int?

    @Option(help: "Fault injection: commit a write but lose its ack (and the connection), with this probability.")
    var faultLostAck: Double = 0

    @Option(help: "Fault injection: delay a delivery to a listener with this probability.")
    var faultDelayDeliveries: Double = 0

    @Option(help: "Fault injection: how long a delayed delivery waits, in milliseconds.")
    var faultDelayMs = 200

    @Option(help: "Fault injection: refuse a write without applying it, with this probability.")
    var faultRejectWrites: Double = 0

    @Option(help: "Fault injection: the error code of refused writes.")
    var faultRejectCode = "internal"

    @Option(help: "Fault injection: answer a listen with an internal error, not opening it, with this probability.")
    var faultFailListens: Double = 0

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel = "info"

    @Option(help: "The largest message accepted, in bytes; larger closes the connection with 1009.")
    var maxMessageBytes = Limits.default.maxMessageBytes

    @Option(help: "The most ops in one write.")
    var maxOpsPerWrite = Limits.default.maxOpsPerWrite

    @Option(help: "The most listeners one connection may hold.")
    var maxListeners = Limits.default.maxListenersPerConnection

    @Option(help: "The largest document (the JSON of its fields), in bytes.")
    var maxDocumentBytes = Limits.default.maxDocumentBytes

    @Option(
        help: """
            Days a deleted document's tombstone is kept; older resume tokens get a reset. \
            0 purges tombstones at every maintenance run (for testing resets).
            """)
    var tombstoneDays = 30

    @Option(help: "Days an idempotency key is remembered.")
    var idempotencyDays = 30

    @Option(help: "Seconds between purges of expired tombstones and idempotency keys.")
    var maintenanceSeconds = 3600

    @Option(help: "Seconds a client may take nothing of what waits for it before it is closed (1008) as stopped.")
    var stallSeconds = 30

    func validate() throws {
        if (tlsCert == nil) != (tlsKey == nil) {
            throw ValidationError("--tls-cert and --tls-key go together: give both, or neither")
        }
        if [postgres != nil, data != nil, memory].filter({ $0 }).count > 1 {
            throw ValidationError("--data, --postgres and --memory choose the store: give one of them at most")
        }
        if let importFile, !FileManager.default.isReadableFile(atPath: importFile) {
            throw ValidationError("--import: cannot read \(importFile)")
        }
        if adminToken?.isEmpty == true { throw ValidationError("--admin-token must not be empty") }
        if adminToken == nil, ProcessInfo.processInfo.environment["TANDEM_ADMIN_TOKEN"]?.isEmpty == true {
            throw ValidationError("TANDEM_ADMIN_TOKEN is set but empty: give the admin token a value, or unset it")
        }
        if let postgres,
            !(postgres.hasPrefix("postgresql://") || postgres.hasPrefix("postgres://") || postgres.contains("="))
        {
            throw ValidationError(
                "--postgres takes a PostgreSQL URL, like postgresql://tandem@/tandem?host=/run/postgresql&port=5432; got '\(postgres)'"
            )
        }
        if let postgresTimeout {
            guard postgres != nil else { throw ValidationError("--postgres-timeout applies to --postgres only") }
            guard postgresTimeout.isFinite, (0.1...3600).contains(postgresTimeout) else {
                throw ValidationError("--postgres-timeout is in seconds, between 0.1 and 3600, not \(postgresTimeout)")
            }
        }
        guard (0...65535).contains(port) else {
            throw ValidationError("--port must be between 0 and 65535, not \(port)")
        }
        guard maxMessageBytes >= 1024 else { throw ValidationError("--max-message-bytes must be at least 1024") }
        guard maxOpsPerWrite >= 1, maxListeners >= 1 else {
            throw ValidationError("--max-ops-per-write and --max-listeners must be at least 1")
        }
        guard maxDocumentBytes >= 2 else { throw ValidationError("--max-document-bytes must be at least 2") }
        guard tombstoneDays >= 0 else { throw ValidationError("--tombstone-days must be 0 or more") }
        guard idempotencyDays >= 1 else { throw ValidationError("--idempotency-days must be at least 1") }
        guard maintenanceSeconds >= 1 else { throw ValidationError("--maintenance-seconds must be at least 1") }
        guard (1...3600).contains(stallSeconds) else {
            throw ValidationError("--stall-seconds must be between 1 and 3600, not \(stallSeconds)")
        }
        for (name, rate) in [
            ("--fault-drop-connection", faultDropConnection), ("--fault-lost-ack", faultLostAck),
            ("--fault-delay-deliveries", faultDelayDeliveries), ("--fault-reject-writes", faultRejectWrites),
            ("--fault-fail-listens", faultFailListens),
        ] where !(0...1).contains(rate) {
            throw ValidationError("\(name) is a probability between 0 and 1, not \(rate)")
        }
        if let after = faultDropAfter, after < 1 { throw ValidationError("--fault-drop-after must be at least 1") }
        guard faultDelayMs >= 0 else { throw ValidationError("--fault-delay-ms must not be negative") }
        guard ErrorCode.all.contains(ErrorCode(rawValue: faultRejectCode)) else {
            throw ValidationError(
                "--fault-reject-code must be one of \(ErrorCode.all.map(\.rawValue).joined(separator: ", "))")
        }
        guard Logger.Level(rawValue: logLevel) != nil else {
            throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error, critical")
        }
        try validateJWT()
    }

    func run() async throws {
        let level = Logger.Level(rawValue: logLevel)!
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        var configuration =
            if let postgres {
                ServerConfiguration(storage: .postgres(url: postgres))
            } else if memory {
                ServerConfiguration(storage: .memory)
            } else {
                ServerConfiguration(dataDirectory: URL(fileURLWithPath: data ?? "./tandem-data").standardizedFileURL)
            }
        if let postgresTimeout {
            configuration.postgresTimeout = .milliseconds(Int64((postgresTimeout * 1000).rounded()))
        }
        configuration.host = host
        configuration.port = port
        configuration.nodeName = nodeName
        configuration.allowsPlaintext = allowPlaintext
        configuration.adminToken = adminToken ?? ProcessInfo.processInfo.environment["TANDEM_ADMIN_TOKEN"]
        if let tlsCert, let tlsKey {
            configuration.tls = .init(
                certificate: URL(fileURLWithPath: tlsCert), privateKey: URL(fileURLWithPath: tlsKey))
        }
        configuration.limits = Limits(
            maxMessageBytes: maxMessageBytes, maxOpsPerWrite: maxOpsPerWrite, maxListenersPerConnection: maxListeners,
            maxDocumentBytes: maxDocumentBytes)
        configuration.tombstoneRetention = .seconds(tombstoneDays * 24 * 3600)
        configuration.idempotencyRetention = .seconds(idempotencyDays * 24 * 3600)
        configuration.maintenanceInterval = .seconds(maintenanceSeconds)
        configuration.stallTimeout = UInt16(stallSeconds)
        configuration.logger = Logger(label: "tandem.server")
        if faultDropConnection > 0 || faultDropAfter != nil || faultLostAck > 0 || faultDelayDeliveries > 0
            || faultRejectWrites > 0 || faultFailListens > 0
        {
            configuration.faults = FaultPlan(
                seed: faultSeed, dropConnectionRate: faultDropConnection, dropConnectionAfter: faultDropAfter,
                lostAckRate: faultLostAck, delayedDeliveryRate: faultDelayDeliveries,
                deliveryDelay: .milliseconds(faultDelayMs), rejectedWriteRate: faultRejectWrites,
                rejectedWriteCode: ErrorCode(rawValue: faultRejectCode), failedListenRate: faultFailListens)
        }
        let jwt = try jwtAuthentication()
        if tokens != nil || rules != nil || jwt != nil {
            do {
                configuration.access = try AccessControl.load(
                    tokensFile: tokens.map { URL(fileURLWithPath: $0) },
                    rulesFile: rules.map { URL(fileURLWithPath: $0) }, jwt: jwt)
            } catch {
                throw CLIError(error.message)
            }
        }

        let server: TandemServer
        do {
            server = try TandemServer(configuration: configuration)
        } catch {
            throw CLIError(error.description)
        }
        emit("listening on \(server.url)")
        if case .external = configuration.storage {
            emit("store: \(configuration.storage)")
        } else {
            // Read from SQLite itself, not from what `main` asked for.
            let statistics = SQLiteProcess.keepsMemoryStatistics ? "on" : "off"
            emit("store: \(configuration.storage), SQLite memory statistics \(statistics)")
        }
        if let importFile {
            do {
                let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: importFile)))
                note("importing \(importFile) (\(bytes.count) bytes)…")
                let summary = try await server.importDocuments(bytes)
                emit(
                    "imported \(summary.documents) documents into \(summary.collections) collections from \(importFile)"
                )
            } catch {
                await server.shutdown()
                throw CLIError("--import \(importFile): \(error)")
            }
        }
        emit(
            "console: http\(configuration.tls == nil ? "" : "s")://\(server.url.dropFirst(configuration.tls == nil ? 5 : 6))/"
        )
        emit(
            "admin API: "
                + (configuration.adminToken == nil ? "loopback only (no admin token)" : "for the admin token"))
        if configuration.access == nil {
            emit("access: open, no access control, so the server accepts connections from this machine only")
        } else {
            let jwtSource = [
                jwks.map { "JWTs verified with \($0)" }, jwtSecretFile.map { "HS256 JWTs with the secret in \($0)" },
            ].compactMap { $0 }
            let files =
                [tokens.map { "tokens from \($0)" }, rules.map { "rules from \($0)" }].compactMap { $0 } + jwtSource
            emit("access: \(files.joined(separator: ", ")); everything the rules do not allow is denied")
        }

        if let faults = configuration.faults { emit("faults: \(faults)") }

        let signal = await Signals.wait(for: [SIGINT, SIGTERM])
        note("received \(signal == SIGINT ? "SIGINT" : "SIGTERM"), stopping")
        if configuration.faults != nil {
            let counts = await server.faultCounts
            note(
                "injected: \(counts.droppedConnections) dropped connections, \(counts.lostAcks) lost acks, "
                    + "\(counts.delayedDeliveries) delayed deliveries, \(counts.rejectedWrites) refused writes, "
                    + "\(counts.failedListens) failed listens")
        }
        await server.shutdown()
        emit("stopped")
    }
}

/// Waits for a process signal without the default handler killing the process.
enum Signals {
    static func wait(for signals: [Int32]) async -> Int32 {
        await withCheckedContinuation { continuation in
            let fired = Fired(continuation)
            for number in signals {
                signal(number, SIG_IGN)
                let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
                source.setEventHandler { fired.resume(number) }
                source.resume()
                fired.keep(source)
            }
        }
    }

    /// Resumes the continuation once, and keeps the sources alive meanwhile.
    private final class Fired: @unchecked Sendable {
        private let lock = NSLock()
        private var continuation: CheckedContinuation<Int32, Never>?
        private var sources: [any DispatchSourceSignal] = []

        init(_ continuation: CheckedContinuation<Int32, Never>) { self.continuation = continuation }

        func keep(_ source: any DispatchSourceSignal) {
            lock.withLock { sources.append(source) }
        }

        func resume(_ number: Int32) {
            let continuation = lock.withLock {
                defer { self.continuation = nil }
                return self.continuation
            }
            continuation?.resume(returning: number)
        }
    }
}
