import Foundation
import Synchronization
import TandemServer

/// A companion server for tests: in this process, on a free port, with its data in a
/// temporary folder that is removed afterwards.
///
/// For example:
///
/// ```swift
/// let server = try TestServer()
/// defer { server.stop() }
/// let device = try await TestDevice(server: server)
/// ```
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

    /// - Parameter configure: Adjusts the configuration (limits, retention, clock).
    public init(configure: (inout ServerConfiguration) -> Void = { _ in }) throws {
        directory = try TemporaryDirectory(prefix: "tandem-server")
        var configuration = ServerConfiguration(dataDirectory: directory.url)
        configuration.port = 0
        configuration.logger.logLevel = .warning
        configure(&configuration)
        let server = try TandemServer(configuration: configuration)
        configuration.port = server.port
        baseConfiguration = configuration
        running.withLock { $0 = server }
    }

    /// The running server. Calling it while the server is stopped is a test bug.
    public var server: TandemServer {
        guard let server = running.withLock({ $0 }) else { preconditionFailure("the test server is stopped") }
        return server
    }

    /// `ws://127.0.0.1:PORT`; stays the same across ``restart()``.
    public var url: String { "ws://127.0.0.1:\(port)" }
    public var port: Int { baseConfiguration.port }

    /// Stops the server: connections close with 1001, the database is closed. The port stays
    /// reserved for ``start()``.
    public func stop() {
        let server = running.withLock { server in
            defer { server = nil }
            return server
        }
        guard let server else { return }
        server.shutdown()
        held.withLock { $0 = try? RefusingPort(port: port) }
    }

    /// Starts a stopped server again on the same port and data folder.
    public func start() throws {
        held.withLock { $0 = nil }
        let server = try TandemServer(configuration: baseConfiguration)
        running.withLock { $0 = server }
    }

    /// Stops and starts again.
    public func restart() throws {
        stop()
        try start()
    }

    public var isRunning: Bool { running.withLock { $0 != nil } }

    deinit { stop() }
}
