import Foundation
import Synchronization
import TandemHarness

/// `tandem device` running as a child process: a device that a test can kill with SIGKILL at
/// a point it chose (`--hold-at push|apply`), then reopen in-process from the same folder
/// with ``LocalDevice/init(name:serverURL:model:folder:configure:)``.
///
/// For example:
///
/// ```swift
/// let phone = try DeviceProcess(["--server", server.url, "--folder", folder.url.path,
///                                "--name", "phone", "--entries", "20", "--hold-at", "push"])
/// _ = try await phone.waitForLine(prefix: "held:")
/// await phone.kill()
/// ```
public final class DeviceProcess: Sendable {
    private let process: ChildProcess
    private let output = Mutex<(lines: [String], errors: [String])>(([], []))

    /// Starts `tandem device` with these options.
    public init(_ options: [String], executable: URL? = nil) throws {
        process = ChildProcess()
        process.executableURL = try executable ?? ServerProcess.findExecutable()
        process.arguments = ["device"] + options
        let standardOutput = Pipe()
        let standardError = Pipe()
        process.standardOutput = standardOutput
        process.standardError = standardError
        try process.run()
        readLines(of: standardOutput.fileHandleForReading) { [weak self] line in
            self?.output.withLock { $0.lines.append(line) }
        }
        readLines(of: standardError.fileHandleForReading) { [weak self] line in
            self?.output.withLock { $0.errors.append(line) }
        }
    }

    /// The lines the device printed so far.
    public var lines: [String] { output.withLock { $0.lines } }

    /// Waits for a line starting with `prefix` and returns it.
    ///
    /// - Throws: ``HarnessError`` when it does not come within `timeout` or the process
    ///   ends first, with what the device printed to standard error.
    public func waitForLine(prefix: String, timeout: Duration = .seconds(30)) async throws -> String {
        let deadline = ContinuousClock.now + timeout
        while true {
            if let line = lines.first(where: { $0.hasPrefix(prefix) }) { return line }
            let errors = output.withLock { $0.errors.suffix(5).joined(separator: " | ") }
            guard process.isRunning || lines.contains(where: { $0.hasPrefix(prefix) }) else {
                throw HarnessError("tandem device exited before printing '\(prefix)…'; it said: \(errors)")
            }
            guard ContinuousClock.now < deadline else {
                throw HarnessError(
                    "tandem device did not print '\(prefix)…' within \(timeout); it said: \(errors)")
            }
            try await Task.sleep(for: .milliseconds(10))
        }
    }

    /// Kills the process (SIGKILL by default: no chance to flush or clean up) and waits for it
    /// (on a thread of its own).
    public func kill(_ signal: Int32 = SIGKILL) async {
        process.signal(signal)
        await process.exited()
    }

    deinit { process.end(with: SIGKILL) }
}
