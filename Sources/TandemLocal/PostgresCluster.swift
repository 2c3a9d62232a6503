import Foundation
import Synchronization
import TandemHarness

/// A throwaway PostgreSQL cluster for tests: `initdb` in a temporary folder, the server on a
/// Unix socket in that folder and a free port, stopped by its PID when the tests end.
///
/// Most tests share one cluster (``shared``) and get a fresh database each
/// (``createDatabase()``); tests that restart or cut off PostgreSQL start their own.
///
/// PostgreSQL refuses to run as root: run as root, the cluster belongs to the `postgres` user
/// (Debian's package creates it) and its programs run as that user through `runuser`. A
/// watchdog started with the server stops it when the test process is gone, however that
/// process ends.
///
/// For example:
///
/// ```swift
/// let cluster = try await PostgresCluster.start()
/// defer { cluster.stop() }
/// let url = try cluster.createDatabase()   // postgresql://tandem@/t_…?host=…&port=…
/// ```
public final class PostgresCluster: Sendable {
    public let directory: URL
    public let port: Int
    /// Extra addresses it listens on over TCP (besides its Unix socket), trusting every client.
    public let tcpAddresses: [String]
    private let folder: TemporaryDirectory
    private let state = Mutex<State>(State())

    private struct State {
        var server: ChildProcess?
        var databases = 0
    }

    /// `postgresql://tandem@/postgres?host=…&port=…`: the cluster's maintenance database.
    public var url: String { url(database: "postgres") }

    /// The URL of a database of the cluster, over its Unix socket.
    public func url(database: String) -> String {
        "postgresql://tandem@/\(database)?host=\(directory.path)&port=\(port)"
    }

    /// The URL of a database of the cluster over TCP, at one of its ``tcpAddresses``.
    public func tcpURL(database: String, address: String) -> String {
        "postgresql://tandem@\(address):\(port)/\(database)"
    }

    /// The one cluster most tests share, started on first use (once, however many tests ask
    /// at the same time). It listens on its Unix socket and on loopback TCP
    /// (``tcpURL(database:address:)`` with `127.0.0.1`).
    public static func shared() async throws -> PostgresCluster {
        let starting = sharedCluster.withLock { task in
            if let task { return task }
            let started = Task { try await start(tcpAddresses: ["127.0.0.1"]) }
            task = started
            return started
        }
        return try await starting.value
    }

    private static let sharedCluster = Mutex<Task<PostgresCluster, any Error>?>(nil)

    /// Makes a cluster and starts its server.
    ///
    /// - Parameters:
    ///   - tcpAddresses: Addresses to listen on over TCP too (for tests across network namespaces).
    ///   - durable: Keep `fsync` on. Off by default: the tests check logic, not disks, and a
    ///     busy CI machine's disk is slow. The benchmarks turn it on.
    public static func start(tcpAddresses: [String] = [], durable: Bool = false) async throws -> PostgresCluster {
        // initdb takes a second or more: on a thread of its own.
        let cluster = try await onOwnThread { try PostgresCluster(tcpAddresses: tcpAddresses, durable: durable) }
        try await cluster.startServer()
        return cluster
    }

    private init(tcpAddresses: [String], durable: Bool) throws {
        folder = try TemporaryDirectory(prefix: "tandem-postgres")
        directory = folder.url
        self.tcpAddresses = tcpAddresses
        port = try Self.freePort()
        try Self.giveToPostgresUser(directory)
        let data = directory.appendingPathComponent("data").path
        try Self.run(
            Self.binary("initdb"),
            ["-D", data, "-U", "tandem", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"])
        var settings = [
            "listen_addresses = '\(tcpAddresses.joined(separator: ","))'",
            "unix_socket_directories = '\(directory.path)'",
            "port = \(port)",
            "max_connections = 1000",
            "shared_buffers = 32MB",
            // Every test's CREATE DATABASE copies its template through the WAL: recycle it
            // early, or a run's cluster grows by gigabytes of WAL.
            "max_wal_size = 64MB",
            "min_wal_size = 32MB",
            "log_min_messages = fatal",
            "logging_collector = off",
        ]
        if !durable { settings += ["fsync = off", "synchronous_commit = off", "full_page_writes = off"] }
        try (settings.joined(separator: "\n") + "\n").appendToFile(at: "\(data)/postgresql.conf")
        if !tcpAddresses.isEmpty {
            try "host all all 0.0.0.0/0 trust\n".appendToFile(at: "\(data)/pg_hba.conf")
        }
    }

    deinit { stop() }

    // MARK: - Server

    /// Starts (or starts again) the server and waits until it accepts connections.
    public func startServer() async throws {
        let data = directory.appendingPathComponent("data").path
        let postgres = try Self.binary("postgres")
        // The watchdog: stops the server (fast shutdown) once the test process is gone, then
        // removes the cluster's folder if the test process is gone or stopped it for good. A
        // test process never runs deinit for the shared cluster, and one that is killed runs
        // none at all: without this, every run would leave its clusters behind (hundreds of
        // megabytes each, which filled a CI machine's disk).
        let test = "/proc/\(ProcessInfo.processInfo.processIdentifier)"
        let script = """
            "\(postgres)" -D "\(data)" & pg=$!
            while [ -d \(test) ] && kill -0 $pg 2>/dev/null; do sleep 1; done
            kill -INT $pg 2>/dev/null; wait $pg
            if [ ! -d \(test) ] || [ -e "\(directory.path)/\(Self.stoppedMarker)" ]; then rm -rf "\(directory.path)"; fi
            """
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", script]
        if Self.isRoot {
            process.executableURL = URL(fileURLWithPath: "/usr/sbin/runuser")
            process.arguments = ["-u", "postgres", "--", "/bin/sh", "-c", script]
        }
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        state.withLock { $0.server = process }
        let (directory, port) = (directory, port)
        try await waitUntil("PostgreSQL accepts connections", timeout: .seconds(60)) {
            try await onOwnThread {
                (try? Self.run(
                    Self.binary("pg_isready"), ["-h", directory.path, "-p", String(port), "-U", "tandem", "-q"],
                    asPostgres: false)) != nil
            }
        }
    }

    /// The postmaster's process id, from its pid file.
    public var serverPID: Int32? {
        let file = directory.appendingPathComponent("data/postmaster.pid").path
        return (try? String(contentsOfFile: file, encoding: .utf8))?.split(separator: "\n").first.flatMap {
            Int32($0)
        }
    }

    /// Stops the server at once, as a crash would (`pg_ctl stop -m immediate`), and waits.
    public func crash() async {
        if let pid = serverPID { kill(pid, SIGQUIT) }
        await takeServer()?.exited()
    }

    /// Stops the server and removes nothing (the cluster can start again).
    public func stopServer() async {
        if let pid = serverPID { kill(pid, SIGINT) }
        await takeServer()?.exited()
    }

    /// Restarts at once (`pg_ctl restart -m immediate`) the PostgreSQL server a URL names:
    /// one on this machine, whose data folder the server tells (`SHOW data_directory`, which
    /// needs a superuser or pg_read_all_settings), run as that folder's owner when run as root.
    public static func restartImmediately(serving url: String) async throws {
        let folder = try await onOwnThread {
            try run(binary("psql"), [url, "-A", "-t", "-q", "-c", "SHOW data_directory"], asPostgres: false)
                .trimmingCharacters(in: .whitespacesAndNewlines)
        }
        guard !folder.isEmpty else {
            throw HarnessError("PostgreSQL at \(url) did not say where its data is (SHOW data_directory)")
        }
        _ = try await onOwnThread {
            try run(binary("pg_ctl"), ["-D", folder, "restart", "-m", "immediate", "-w", "-l", "/dev/null"])
        }
    }

    /// `pg_ctl restart -m immediate`: crash, then start again on the same port and data.
    public func restartImmediately() async throws {
        await crash()
        try await startServer()
    }

    private func takeServer() -> ChildProcess? {
        state.withLock { state in
            defer { state.server = nil }
            return state.server
        }
    }

    /// Stops the server for good (SIGINT, a fast shutdown) without waiting: a thread of its
    /// own reaps it, since `deinit` and `defer`, where this runs, cannot wait. That thread
    /// holds the data folder until the server has exited, then lets it go. To wait, use
    /// ``stopServer()``.
    public func stop() {
        _ = FileManager.default.createFile(
            atPath: directory.appendingPathComponent(Self.stoppedMarker).path, contents: nil)
        if let pid = serverPID { kill(pid, SIGINT) }
        let (server, folder) = (takeServer(), folder)
        Thread.detachNewThread {
            server?.waitUntilExit()
            withExtendedLifetime(folder) {}
        }
    }

    /// The file ``stop()`` leaves in the cluster's folder for the watchdog: remove the folder
    /// once the server is down, whether or not the test process is still there to do it.
    private static let stoppedMarker = "stopped"

    // MARK: - Databases

    /// Creates an empty database and returns its URL.
    public func createDatabase() throws -> String {
        let name = state.withLock { state -> String in
            state.databases += 1
            return "t\(state.databases)_\(UUID().uuidString.prefix(8).lowercased())"
        }
        try sql("CREATE DATABASE \(name)")
        return url(database: name)
    }

    /// Drops a database made by ``createDatabase()`` (its connections too), on a thread of its
    /// own without waiting: it runs in `deinit`, and nothing waits for a database to go (the
    /// cluster goes with the test process in any case).
    public func dropDatabase(url: String) {
        guard let name = Self.databaseName(of: url) else { return }
        Thread.detachNewThread { try? self.sql("DROP DATABASE IF EXISTS \(name) WITH (FORCE)") }
    }

    /// The database a URL names (`postgresql://user@host/NAME?…`).
    public static func databaseName(of url: String) -> String? {
        URLComponents(string: url).map { String($0.path.dropFirst()) }.flatMap { $0.isEmpty ? nil : $0 }
    }

    /// Runs a query with psql and returns its rows, one per line, columns separated by `|`.
    public func query(_ statement: String, database: String = "postgres") throws -> String {
        try Self.run(
            Self.binary("psql"),
            [
                "-h", directory.path, "-p", String(port), "-U", "tandem", "-d", database, "-v", "ON_ERROR_STOP=1",
                "-A", "-t", "-q", "-c", statement,
            ],
            asPostgres: false)
    }

    /// Runs SQL with psql in the maintenance database.
    public func sql(_ statement: String, database: String = "postgres") throws {
        try Self.run(
            Self.binary("psql"),
            [
                "-h", directory.path, "-p", String(port), "-U", "tandem", "-d", database, "-v", "ON_ERROR_STOP=1",
                "-q", "-c", statement,
            ],
            asPostgres: false)
    }

    // MARK: - Plumbing

    static var isRoot: Bool { getuid() == 0 }

    /// A PostgreSQL program: from `pg_config --bindir`, else Debian's folder.
    static func binary(_ name: String) throws -> String {
        let folders =
            ((try? FileManager.default.contentsOfDirectory(atPath: "/usr/lib/postgresql")) ?? [])
            .sorted { (Int($0) ?? 0) > (Int($1) ?? 0) }.map { "/usr/lib/postgresql/\($0)/bin" }
            + ["/usr/local/pgsql/bin", "/usr/bin"]
        for folder in folders where FileManager.default.isExecutableFile(atPath: "\(folder)/\(name)") {
            return "\(folder)/\(name)"
        }
        throw HarnessError(
            "PostgreSQL's \(name) is not installed: scripts/install-deps installs postgresql (Debian's package)")
    }

    /// Runs a program to its end (as the `postgres` user when run as root, unless told not to)
    /// and throws with its output when it fails.
    @discardableResult
    static func run(_ program: String, _ arguments: [String], asPostgres: Bool = true) throws -> String {
        let process = ChildProcess()
        if isRoot && asPostgres {
            process.executableURL = URL(fileURLWithPath: "/usr/sbin/runuser")
            process.arguments = ["-u", "postgres", "--", program] + arguments
        } else {
            process.executableURL = URL(fileURLWithPath: program)
            process.arguments = arguments
        }
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let text = String(decoding: data, as: UTF8.self)
        guard process.terminationStatus == 0 else {
            throw HarnessError(
                "\((program as NSString).lastPathComponent) failed (\(process.terminationStatus)): \(text.suffix(500))")
        }
        return text
    }

    /// Run as root, the folder must belong to the user the server runs as.
    private static func giveToPostgresUser(_ folder: URL) throws {
        guard isRoot else { return }
        guard let user = getpwnam("postgres") else {
            throw HarnessError(
                "run as root, the tests need the 'postgres' user to run PostgreSQL: install Debian's postgresql")
        }
        chown(folder.path, user.pointee.pw_uid, user.pointee.pw_gid)
    }

    /// A free TCP port (bound to, then released, and not in the kernel's ephemeral range, so
    /// that no client connection takes it meanwhile).
    private static func freePort() throws -> Int {
        let ephemeralStart =
            (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8))
            .flatMap { $0.split(whereSeparator: \.isWhitespace).first.flatMap { Int($0) } } ?? 32768
        for _ in 0..<50 {
            let candidate = Int.random(in: max(1024, ephemeralStart - 20_000)..<(ephemeralStart - 10_000))
            if let probe = try? RefusingPort(port: candidate) {
                _ = probe
                return candidate
            }
        }
        throw HarnessError("no free port for PostgreSQL")
    }
}

extension String {
    fileprivate func appendToFile(at path: String) throws {
        guard let handle = FileHandle(forWritingAtPath: path) else {
            throw HarnessError("cannot write \(path)")
        }
        defer { try? handle.close() }
        try handle.seekToEnd()
        try handle.write(contentsOf: Data(utf8))
    }
}
