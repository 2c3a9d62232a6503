import ArgumentParser
import Foundation
import TandemScenarios
import TandemSocket

/// A raw libwebsockets echo server, for the benchmarks' floors: what a server of this
/// transport costs before Tandem adds anything. Not listed in `tandem --help`.
struct EchoServerCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "echo-server",
        abstract: "A raw WebSocket echo server over libwebsockets (the benchmarks' floor).",
        shouldDisplay: false)

    @Option(help: "The port; 0 picks a free one.")
    var port = 0

    func validate() throws {
        guard (0...65535).contains(port) else {
            throw ValidationError("--port must be between 0 and 65535, not \(port)")
        }
    }

    func run() async throws {
        let server = try WebSocketServer(port: port, delegate: Floors.Echo())
        emit("listening on ws://127.0.0.1:\(server.port)")
        _ = await Signals.wait(for: [SIGINT, SIGTERM])
        await server.shutdown()
    }
}
