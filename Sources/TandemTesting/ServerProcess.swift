import Foundation

/// `tandem serve` running as a child process, for tests that must kill the server the hard
/// way (SIGKILL) and start it again on the same data.
///
/// For example:
///
/// ```swift
/// let process = try ServerProcess(dataDirectory: folder.url)
/// // … write, get an acknowledgement …
/// process.kill()
/// try process.start()   // same data folder, a new port
/// ```
public final class ServerProcess: @unchecked Sendable {
    /// The command line after the executable's name.
    public let arguments: [String]
    public let executable: URL
    /// `ws://127.0.0.1:PORT` of the running process.
    public private(set) var url = ""
    private var process: Process?
    private let lock = NSLock()

    /// Starts `tandem serve --port 0 --data DIR` with `options` (`--tokens FILE`, …) and
    /// waits for its `listening on` line.
    public convenience init(dataDirectory: URL, options: [String] = [], executable: URL? = nil) throws {
        try self.init(
            arguments: ["serve", "--port", "0", "--data", dataDirectory.path, "--log-level", "warning"] + options,
            executable: executable)
    }

    /// Starts `tandem` with these arguments, a command that prints `listening on URL` as its
    /// first line when it is ready.
    public init(arguments: [String], executable: URL? = nil) throws {
        self.arguments = arguments
        self.executable = try executable ?? Self.findExecutable()
        try start()
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
        throw ServerProcessError(
            "cannot find the tandem executable near \(CommandLine.arguments[0]); run `swift build` or set TANDEM_EXECUTABLE"
        )
    }

    /// Starts the process (again) and waits up to 30 s for it to listen.
    public func start() throws {
        let process = Process()
        process.executableURL = executable
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let line = try Self.readLine(from: output.fileHandleForReading, timeout: 30)
        guard let url = line.split(separator: " ").last, line.hasPrefix("listening on ") else {
            process.terminate()
            throw ServerProcessError("unexpected first line from tandem \(arguments.first ?? ""): \(line)")
        }
        // Keep draining stdout so the child never blocks on a full pipe.
        let handle = output.fileHandleForReading
        DispatchQueue.global().async { _ = try? handle.readToEnd() }
        lock.withLock {
            self.process = process
            self.url = String(url)
        }
    }

    /// The running process's id (0 when it is not running).
    public var processIdentifier: Int32 { lock.withLock { process?.processIdentifier ?? 0 } }

    /// Kills the process with `signal` (SIGKILL by default: no chance to flush or clean up)
    /// and waits for it to exit.
    public func kill(_ signal: Int32 = SIGKILL) {
        guard let process = lock.withLock({ self.process }) else { return }
        Foundation.kill(process.processIdentifier, signal)
        process.waitUntilExit()
        lock.withLock { self.process = nil }
    }

    deinit { kill() }

    private static func readLine(from handle: FileHandle, timeout: TimeInterval) throws -> String {
        var bytes: [UInt8] = []
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            guard let chunk = try handle.read(upToCount: 1), let byte = chunk.first else {
                throw ServerProcessError("tandem serve exited before listening")
            }
            if byte == UInt8(ascii: "\n") { return String(decoding: bytes, as: UTF8.self) }
            bytes.append(byte)
        }
        throw ServerProcessError("tandem serve did not start listening within \(Int(timeout)) s")
    }
}

public struct ServerProcessError: Error, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}
