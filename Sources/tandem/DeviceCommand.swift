import ArgumentParser
import Foundation
import Logging
import TandemHarness
import TandemLocal
@_spi(Testing) import Tandem
import TandemScenarios

/// One device of the cash-flow model in a process of its own, so that a test can kill it with
/// SIGKILL at a chosen point and reopen its database.
struct DeviceCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "device",
        abstract: "Run one cash-flow device until killed (for durability tests).",
        discussion: """
            Prints `started` once syncing, and `held: …` when it stops at --hold-at, where it \
            stays until killed.
            """,
        shouldDisplay: false)

    enum HoldPoint: String, ExpressibleByArgument, CaseIterable {
        /// After the server acknowledged a push, before the answer is written back.
        case push
        /// Inside the transaction applying a snapshot with changes, before it commits.
        case apply
    }

    @Option(help: "The server's URL.")
    var server: String

    @Option(help: "The folder of the device's database (NAME.sqlite), created when missing.")
    var folder: String

    @Option(help: "The device's name and client id.")
    var name: String

    @Option(help: "Entries to write, offline, before syncing starts: into the first shared account, or a new one.")
    var entries = 0

    @Option(help: "Where to stop and wait to be killed: \(HoldPoint.allCases.map(\.rawValue).joined(separator: ", ")).")
    var holdAt: HoldPoint?

    func validate() throws {
        guard entries >= 0 else { throw ValidationError("--entries must be 0 or more, not \(entries)") }
    }

    func run() async throws {
        let holdAt = self.holdAt
        let device = try LocalDevice(
            name: name, serverURL: server, folder: try TemporaryDirectory(borrowing: URL(fileURLWithPath: folder))
        ) { configuration in
            configuration.logger.logLevel = .warning
            switch holdAt {
            case .push:
                configuration.hooks.afterAck = { results in
                    Self.hold("the acknowledgement of \(results.count) ops")
                }
            case .apply:
                configuration.hooks.beforeApplyCommit = { snapshots in
                    let changes = snapshots.map(\.changes.count).reduce(0, +)
                    if changes > 0 { Self.hold("applying \(changes) changes") }
                }
            case nil: break
            }
        }
        if entries > 0 {
            var accountId = try await device.accounts().first(where: \.isShared)?.id
            if accountId == nil { accountId = try await device.addAccount("\(name)'s account").id }
            for index in 0..<entries {
                try await device.addEntry(
                    "\(name) entry \(index + 1)", amount: Int64(-(index + 1)), account: accountId!)
            }
        }
        device.service.start()
        emit("started")
        while true { try await Task.sleep(for: .seconds(3600)) }
    }

    /// Stops the calling engine thread for good: the process waits there to be killed.
    private static func hold(_ what: String) -> Never {
        emit("held: \(what)")
        while true { sleep(3600) }
    }
}
