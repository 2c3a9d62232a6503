import Foundation
import TandemClient
import TandemHarness

/// `tandem serve` running as a child process, for tests that must kill the server the hard
/// way (SIGKILL) and start it again on the same data.
///
/// For example:
///
/// ```swift
/// let process = try await ServerProcess(dataDirectory: folder.url)
/// // … write, get an acknowledgement …
/// await process.kill()
/// try await process.start()   // same data folder, a new port
/// ```
public final class ServerProcess: @unchecked Sendable {
    /// The command line after the executable's name.
    public let arguments: [String]
    public let executable: URL
    /// `ws://127.0.0.1:PORT` of the running process.
    public var url: String { lock.withLock { currentURL } }
    private var currentURL = ""
    private var process: ChildProcess?
    private var errorLines: [String] = []
    private var outputLines: [String] = []
    private let lock = NSLock()
    /// The most lines kept of standard error, and of standard output.
    private static let keptLines = 10_000

    /// Starts `tandem serve --port 0 --data DIR` with `options` (`--tokens FILE`, …) and
    /// waits for its `listening on` line.
    public convenience init(dataDirectory: URL, options: [String] = [], executable: URL? = nil) async throws {
        try await self.init(
            arguments: ["serve", "--port", "0", "--data", dataDirectory.path, "--log-level", "warning"] + options,
            executable: executable)
    }

    /// Starts `tandem serve` like ``init(dataDirectory:options:executable:)``, on a port below
    /// the system's ephemeral range: the kernel never hands such a port to a server asking for
    /// port 0, so none takes it while this one is down between a kill and ``restart(changing:)``.
    public static func onStablePort(
        dataDirectory: URL, options: [String] = [], executable: URL? = nil
    ) async throws -> ServerProcess {
        try await onStablePort(
            arguments: ["serve", "--data", dataDirectory.path, "--log-level", "warning"] + options,
            executable: executable)
    }

    /// Starts `tandem` with `arguments` (a `serve` command without `--port`) on a port below
    /// the ephemeral range, as ``onStablePort(dataDirectory:options:executable:)`` does.
    public static func onStablePort(arguments: [String], executable: URL? = nil) async throws -> ServerProcess {
        let ephemeralStart =
            (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8))
            .flatMap { $0.split(whereSeparator: \.isWhitespace).first.flatMap { Int($0) } } ?? 32768
        let range = max(1024, ephemeralStart - 10_000)..<ephemeralStart
        var lastError: (any Error)?
        for _ in 0..<20 {
            do {
                return try await ServerProcess(
                    arguments: arguments + ["--port", String(Int.random(in: range))], executable: executable)
            } catch {
                lastError = error  // most likely the port is taken: try another
            }
        }
        throw lastError ?? HarnessError("no free port in \(range)")
    }

    /// Starts `tandem` with these arguments, a command that prints `listening on URL` as its
    /// first line when it is ready.
    public init(arguments: [String], executable: URL? = nil) async throws {
        self.arguments = arguments
        self.executable = try executable ?? Self.findExecutable()
        try await start()
    }

    /// The `tandem` executable: `TANDEM_EXECUTABLE`, else next to the test bundle, where
    /// `swift build` puts it.
    public static func findExecutable() throws -> URL {
        if let path = ProcessInfo.processInfo.environment["TANDEM_EXECUTABLE"] {
            return URL(fileURLWithPath: path)
        }
        var folder = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        for _ in 0..<3 {
            let candidate = folder.appendingPathComponent("tandem")
            if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate }
            folder = folder.deletingLastPathComponent()
        }
        throw HarnessError(
            "cannot find the tandem executable near \(CommandLine.arguments[0]); run `swift build` or set TANDEM_EXECUTABLE"
        )
    }

    /// Starts the process (again) and waits up to 30 s for it to listen.
    ///
    /// The wait happens on a thread of its own, not on one of Swift concurrency's few threads.
    public func start() async throws {
        try await launch(arguments)
    }

    /// Kills the process with SIGKILL, then starts it again on the same port, so that clients
    /// find it at the same URL (retrying while the port is still held by the old process).
    ///
    /// - Parameter changes: Options to give other values this time (`["--fault-seed": "8"]`).
    public func restart(changing changes: [String: String] = [:]) async throws {
        await kill()
        var arguments = self.arguments
        for (option, value) in changes {
            if let index = arguments.firstIndex(of: option), index + 1 < arguments.count {
                arguments[index + 1] = value
            } else {
                arguments += [option, value]
            }
        }
        guard let port = URL(string: url)?.port, let flag = arguments.firstIndex(of: "--port"),
            flag + 1 < arguments.count
        else { return try await launch(arguments) }
        arguments[flag + 1] = String(port)
        let deadline = Date().addingTimeInterval(10)
        while true {
            do {
                return try await launch(arguments)
            } catch  where Date() < deadline {
                try await Task.sleep(for: .milliseconds(100))
            }
        }
    }

    private func launch(_ arguments: [String]) async throws {
        let process = ChildProcess()
        process.executableURL = executable
        process.arguments = arguments
        let output = Pipe()
        let errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        readLines(of: errors.fileHandleForReading) { [weak self] line in self?.keep(line, in: \.errorLines) }
        let line: String
        do {
            let handle = output.fileHandleForReading
            line = try await withCheckedThrowingContinuation { continuation in
                Thread.detachNewThread {
                    continuation.resume(with: Result { try Self.readLine(from: handle, timeout: 30) })
                }
            }
        } catch {
            process.end(with: SIGTERM)
            throw error
        }
        guard let url = line.split(separator: " ").last, line.hasPrefix("listening on ") else {
            process.end(with: SIGTERM)
            throw HarnessError("unexpected first line from tandem \(arguments.first ?? ""): \(line)")
        }
        // Keep draining stdout so the child never blocks on a full pipe.
        readLines(of: output.fileHandleForReading) { [weak self] line in self?.keep(line, in: \.outputLines) }
        lock.withLock {
            self.process = process
            self.currentURL = String(url)
        }
    }

    private func keep(_ line: String, in lines: ReferenceWritableKeyPath<ServerProcess, [String]>) {
        lock.withLock {
            self[keyPath: lines].append(line)
            let excess = self[keyPath: lines].count - Self.keptLines
            if excess > 0 { self[keyPath: lines].removeFirst(excess) }
        }
    }

    /// What the process (and the ones before it, across restarts) wrote to standard error,
    /// the last 10,000 lines.
    public var standardErrorLines: [String] { lock.withLock { errorLines } }

    /// What the process (and the ones before it) printed after its `listening on` line, the
    /// last 10,000 lines.
    public var standardOutputLines: [String] { lock.withLock { outputLines } }

    /// The running process's id (0 when it is not running).
    public var processIdentifier: Int32 { lock.withLock { process?.processIdentifier ?? 0 } }

    /// Kills the process with `signal` (SIGKILL by default: no chance to flush or clean up)
    /// and waits for it to exit (on a thread of its own).
    public func kill(_ signal: Int32 = SIGKILL) async {
        guard let process = lock.withLock({ self.process }) else { return }
        process.signal(signal)
        await process.exited()
        lock.withLock { self.process = nil }
    }

    /// Sends `signal` and does not wait: for clean-up in `defer`, which cannot. A thread of its
    /// own reaps the process, with SIGKILL if it has not exited 10 s later.
    public func send(_ signal: Int32) {
        let process = lock.withLock { () -> ChildProcess? in
            defer { self.process = nil }
            return self.process
        }
        process?.end(with: signal)
    }

    deinit { send(SIGKILL) }

    private static func readLine(from handle: FileHandle, timeout: TimeInterval) throws -> String {
        var bytes: [UInt8] = []
        let deadline = ContinuousClock.now + .milliseconds(Int(timeout * 1000))
        while PlainSocket.wait(handle.fileDescriptor, for: Int16(POLLIN), until: deadline) {
            guard let chunk = try handle.read(upToCount: 1), let byte = chunk.first else {
                throw HarnessError("tandem serve exited before listening")
            }
            if byte == UInt8(ascii: "\n") { return String(decoding: bytes, as: UTF8.self) }
            bytes.append(byte)
        }
        throw HarnessError("tandem serve did not start listening within \(Int(timeout)) s")
    }
}

/// Reads a pipe line by line on a thread of its own until end of file: a blocked read on
/// `DispatchQueue.global()` would hold one of the few threads Swift concurrency runs on (on
/// Linux they are the same), and enough of them stall every test in the process.
package func readLines(of handle: FileHandle, _ each: @escaping @Sendable (String) -> Void) {
    Thread.detachNewThread {
        var pending = Data()
        while case let chunk = handle.availableData, !chunk.isEmpty {
            pending.append(chunk)
            while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                each(String(decoding: pending[pending.startIndex..<newline], as: UTF8.self))
                pending.removeSubrange(pending.startIndex...newline)
            }
        }
    }
}
