import ArgumentParser
import Foundation
import Logging
@_spi(Testing) import Tandem
@_spi(Testing) import TandemScenarios

struct DemoCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo",
        abstract: "Run an embedded server and several devices sharing a cash-flow book until they converge.",
        discussion: """
            Each device has its own SQLite file and sync service, over real WebSocket \
            connections. Devices create, edit and delete entries at random (seeded), link \
            transfers, go offline and come back; then all sync until quiet and are compared \
            with the server. Exit status 0 when they converged, 1 when not.

            Examples:
              tandem demo
              tandem demo --devices 5 --ops 1000 --seed 42
              tandem demo --serialization none --ack-delay 20     (shows the duplicate-creation race)
              tandem demo --shared-accounts                       (each user's devices sync only their accounts)

            With --shared-accounts, the devices belong to alice, bob and carol in turn, the server \
            has read rules that look at each account's members, and each device syncs only the \
            accounts that list its user (SyncTable.where("members", arrayContains: .currentUser)) \
            with their entries; members are added and removed between rounds. Converged means \
            every device holds exactly what its user may read.
            """)

    @Flag(help: "Devices of three users, each syncing only the accounts it shares (row-level read rules).")
    var sharedAccounts = false

    @Option(help: "How many devices.")
    var devices = 3

    @Option(help: "How many random operations in all.")
    var ops = 300

    @Option(help: "The random seed; the same seed makes the same choices.")
    var seed: UInt64 = 1

    @Option(help: "The share of devices offline at any time, from 0 to 1.")
    var offlineFraction = 0.3

    @Option(help: "barrier (Tandem's design) or none (listener changes do not wait for pushes).")
    var serialization: Serialization = .barrier

    @Option(help: "Milliseconds between a push's acknowledgement and its write-back (widens the race window).")
    var ackDelay = 0

    @Option(help: "Seconds to wait for the devices to become quiet.")
    var timeout = 120

    @Option(help: "How conflicts are settled: lww (last write wins), field (field-level merge) or manual.")
    var policy: PolicyName = .lww

    @Option(help: "Each device's clock is off by a random amount within plus or minus this many seconds.")
    var clockSkew = 0

    func validate() throws {
        guard (1...50).contains(devices) else { throw ValidationError("--devices must be between 1 and 50") }
        guard ops >= 1 else { throw ValidationError("--ops must be at least 1") }
        guard (0...1).contains(offlineFraction) else {
            throw ValidationError("--offline-fraction must be between 0 and 1")
        }
        guard (0...10_000).contains(ackDelay) else {
            throw ValidationError("--ack-delay must be between 0 and 10000 ms")
        }
        guard timeout >= 1 else { throw ValidationError("--timeout must be at least 1 second") }
        guard (0...(30 * 24 * 3600)).contains(clockSkew) else {
            throw ValidationError("--clock-skew must be between 0 and 2592000 seconds")
        }
    }

    func run() async throws {
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = .error
            return handler
        }
        var options = DemoOptions()
        options.devices = devices
        options.operations = ops
        options.seed = seed
        options.offlineFraction = offlineFraction
        options.serialization = serialization
        options.ackDelay = .milliseconds(ackDelay)
        options.quietTimeout = .seconds(timeout)
        options.policy = policy.policy
        options.clockSkew = .seconds(clockSkew)

        emit(
            "Tandem demo\(sharedAccounts ? " (shared accounts: alice, bob, carol)" : ""): \(devices) devices, "
                + "\(ops) operations, seed \(seed), "
                + "\(Int((offlineFraction * 100).rounded()))% offline, serialization \(serialization.rawValue)"
                + (ackDelay > 0 ? ", \(ackDelay) ms between ack and write-back" : "")
                + ", policy \(policy.rawValue)" + (clockSkew > 0 ? ", clocks off by up to ±\(clockSkew) s" : ""))
        let progress = ProgressLine()
        let result =
            sharedAccounts
            ? try await SharedAccountsDemo.run(options) { progress.show($0.description) }
            : try await DemoScenario.run(options) { progress.show($0.description) }
        progress.finish()

        emit("")
        emit(row(["device", "rows", "dirty", "failed", "duplicates", "missing", "extra", "different"]))
        for (index, device) in result.report.devices.enumerated() {
            emit(
                row([
                    device.name, "\(device.documents + device.duplicates)", "\(device.pending)", "\(device.failed)",
                    "\(result.deviceDuplicates[index])", "\(device.missing.count)", "\(device.extra.count)",
                    "\(device.different.count)",
                ]))
        }
        emit(row(["server", "\(result.report.serverDocuments)", "", "", "\(result.serverDuplicates)", "", "", ""]))
        let counts = result.operations
        emit("")
        emit(
            "operations: \(counts["create", default: 0]) creates, \(counts["transfer", default: 0]) transfers, "
                + "\(counts["edit", default: 0]) edits, \(counts["delete", default: 0]) deletes; "
                + "devices went offline \(counts["offline", default: 0]) times"
                + (sharedAccounts
                    ? "; members added \(counts["added", default: 0]) times, removed \(counts["removed", default: 0])"
                    : ""))
        let seconds = String(
            format: "%.1f",
            result.elapsed.seconds)
        let conflicts =
            "conflicts: \(result.resolvedConflicts) resolved"
            + (policy == .manual ? " (\(result.resolvedByHand) by hand)" : "")
            + ", \(result.openConflicts) open"
        emit(conflicts)
        if result.isConverged {
            emit("converged: \(devices) devices, \(result.entries) entries, 0 duplicates, 0 lost (\(seconds) s)")
            return
        }
        emit(
            "NOT converged: \(devices) devices, \(result.entries) entries, \(result.duplicates) duplicates, "
                + "\(result.lost) lost (\(seconds) s)")
        for line in result.report.firstDifferences.prefix(10) { emit("  \(line)") }
        if serialization == .unserialized && result.duplicates > 0 {
            emit(
                "With --serialization none the listener applied the server's echo of a create before the pusher had "
                    + "stored its server id, and inserted it again: the duplicates above are the race Tandem's barrier prevents."
            )
        }
        throw ExitCode(1)
    }

    private func row(_ cells: [String]) -> String {
        cells.enumerated().map { index, cell in
            index == 0
                ? cell.padding(toLength: 10, withPad: " ", startingAt: 0)
                : String(repeating: " ", count: max(0, 11 - cell.count)) + cell
        }.joined()
    }
}

extension Serialization: ExpressibleByArgument {}

/// One progress line: rewritten in place on a terminal, printed every few seconds otherwise.
final class ProgressLine: @unchecked Sendable {
    private let lock = NSLock()
    private let output: FileHandle
    private let isTerminal: Bool
    private var lastPrinted = Date.distantPast
    private var lastText = ""

    /// - Parameter toStandardError: Progress goes to standard error (when standard output
    ///   carries results).
    init(toStandardError: Bool = false) {
        output = toStandardError ? FileHandle.standardError : FileHandle.standardOutput
        isTerminal = isatty(toStandardError ? STDERR_FILENO : STDOUT_FILENO) != 0
    }

    func show(_ text: String) {
        lock.withLock {
            lastText = text
            if isTerminal {
                output.write(Data("\r\u{1B}[K\(text)".utf8))
            } else if Date().timeIntervalSince(lastPrinted) >= 2 {
                lastPrinted = Date()
                output.write(Data((text + "\n").utf8))
            }
        }
    }

    func finish() {
        lock.withLock {
            if isTerminal {
                output.write(Data("\n".utf8))
            } else if !lastText.isEmpty {
                output.write(Data((lastText + "\n").utf8))
            }
            lastText = ""
        }
    }
}

/// The `--policy` names.
enum PolicyName: String, ExpressibleByArgument, CaseIterable {
    case lww, field, manual

    var policy: ConflictPolicy {
        switch self {
        case .lww: .lastWriteWins
        case .field: .fieldLevel
        case .manual: .manual
        }
    }
}
