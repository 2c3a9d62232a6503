import ArgumentParser
import Foundation
import Logging
import TandemServer

struct ServeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run the companion server.",
        discussion: """
            Documents are kept in SQLite in the data folder. Without access control the server \
            only listens on loopback.

            Examples:
              tandem serve
              tandem serve --port 0 --data /tmp/tandem     (any free port)
            """)

    @Option(help: "The address to listen on (loopback only without access control).")
    var host = "127.0.0.1"

    @Option(help: "The port; 0 picks a free one.")
    var port = 7878

    @Option(help: "The data folder, created if missing.")
    var data = "./tandem-data"

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel = "info"

    func validate() throws {
        guard (0...65535).contains(port) else { throw ValidationError("--port must be between 0 and 65535, not \(port)") }
        guard Logger.Level(rawValue: logLevel) != nil else {
            throw ValidationError("--log-level must be one of trace, debug, info, notice, warning, error, critical")
        }
    }

    func run() async throws {
        let level = Logger.Level(rawValue: logLevel)!
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        var configuration = ServerConfiguration(dataDirectory: URL(fileURLWithPath: data).standardizedFileURL)
        configuration.host = host
        configuration.port = port
        configuration.logger = Logger(label: "tandem.server")

        let server: TandemServer
        do {
            server = try TandemServer(configuration: configuration)
        } catch {
            throw CLIError(error.description)
        }
        emit("listening on \(server.url)")
        emit("data in \(configuration.dataDirectory.path)")
        emit("access: open, no access control, so the server accepts connections from this machine only")

        let signal = await Signals.wait(for: [SIGINT, SIGTERM])
        note("received \(signal == SIGINT ? "SIGINT" : "SIGTERM"), stopping")
        server.shutdown()
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
