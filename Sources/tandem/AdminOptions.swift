import ArgumentParser
import Foundation
import TandemClient

/// Options of the commands that use the admin API (`export`, `import`).
struct AdminOptions: ParsableArguments {
    @Option(help: "The server's ws:// URL (or set TANDEM_SERVER).")
    var server: String = ProcessInfo.processInfo.environment["TANDEM_SERVER"] ?? "ws://127.0.0.1:7878"

    @Option(
        name: .customLong("admin-token"),
        help: "The server's admin token (or set TANDEM_ADMIN_TOKEN); not needed on loopback when the server has none.")
    var adminTokenOption: String?

    @Option(help: "Seconds to wait for the server.")
    var timeout: Int = 300

    func validate() throws {
        guard timeout > 0 else { throw ValidationError("--timeout must be at least 1 second") }
        _ = try client()
    }

    func client() throws -> AdminClient {
        let url = server.split(separator: ",").first.map(String.init) ?? server
        do {
            return try AdminClient(
                server: url, token: adminTokenOption ?? ProcessInfo.processInfo.environment["TANDEM_ADMIN_TOKEN"],
                timeout: .seconds(timeout))
        } catch {
            throw ValidationError(error.message)
        }
    }
}
