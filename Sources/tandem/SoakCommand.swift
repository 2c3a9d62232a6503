import ArgumentParser
import Foundation
import Logging
import TandemHarness
import TandemLocal
import TandemScenarios

struct SoakCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "soak",
        abstract: "Run the server as a child process and devices against it, with failures, and check every promise.",
        discussion: """
            Devices write at random (the demo's cash-flow book) and lose their connections at \
            random; the server is killed with SIGKILL and started again on the same data, and \
            loses acknowledgements on purpose (it commits a write and drops the connection \
            before answering). At the end, once quiet, it checks and prints: every device \
            equals the server; no acknowledged write is lost; no document is stored twice; no \
            delete comes back; no device showed an older version of a document it had \
            written. Exit status 0 only when all hold; otherwise the seed and the first \
            divergence are printed, and the same seed replays the run's choices.

            Examples:
              tandem soak
              tandem soak --devices 5 --ops 2000 --seed 1 --server-restarts 3
              tandem soak --nodes 3 --node-restarts 3 --postgres-restarts 1
              tandem soak --nodes 3 --postgres 'postgresql://tandem@/soak?host=/tmp' --node-restarts 3
            """)

    @Option(help: "How many devices.")
    var devices = 5

    @Option(help: "How many random operations in all.")
    var ops = 2000

    @Option(help: "The random seed of the devices and of the server's faults.")
    var seed: UInt64 = 1

    @Option(help: "Per operation, the chance that each device loses its connection.")
    var disconnectRate = 0.02

    @Option(help: "How many times the server is killed with SIGKILL and restarted.")
    var serverRestarts = 3

    @Option(help: "The chance that the server commits a write and loses its acknowledgement.")
    var lostAckRate = 0.02

    @Option(help: "Seconds to wait for quiet at the end.")
    var timeout = 180

    @Option(help: "Run the server with this tandem executable (another build) instead of this one.")
    var serverExecutable: String?

    @Option(help: "How many server nodes; more than one runs them over PostgreSQL.")
    var nodes = 1

    @Option(
        help: ArgumentHelp(
            "The nodes' PostgreSQL database (default with --nodes: a throwaway cluster of the soak's own).",
            valueName: "url"))
    var postgres: String?

    @Option(help: "With several nodes: how many times a node at random is killed with SIGKILL and restarted.")
    var nodeRestarts = 0

    @Option(help: "How many times PostgreSQL is restarted at once (-m immediate).")
    var postgresRestarts = 0

    func validate() throws {
        guard (1...50).contains(devices) else { throw ValidationError("--devices must be between 1 and 50") }
        guard ops >= 1 else { throw ValidationError("--ops must be at least 1") }
        guard (0...1).contains(disconnectRate) else {
            throw ValidationError("--disconnect-rate must be between 0 and 1")
        }
        guard (0...1).contains(lostAckRate) else { throw ValidationError("--lost-ack-rate must be between 0 and 1") }
        guard serverRestarts >= 0, serverRestarts < ops else {
            throw ValidationError("--server-restarts must be between 0 and the number of operations")
        }
        guard timeout >= 1 else { throw ValidationError("--timeout must be at least 1 second") }
        guard (1...20).contains(nodes) else { throw ValidationError("--nodes must be between 1 and 20") }
        guard nodeRestarts >= 0, postgresRestarts >= 0, nodeRestarts + postgresRestarts < ops else {
            throw ValidationError(
                "--node-restarts and --postgres-restarts must be between 0 and the number of operations")
        }
        if nodeRestarts > 0 && nodes == 1 && postgres == nil {
            throw ValidationError("--node-restarts is for several nodes (--nodes N); one server uses --server-restarts")
        }
    }

    func run() async throws {
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = .critical
            return handler
        }
        var options = SoakOptions()
        options.devices = devices
        options.operations = ops
        options.seed = seed
        options.disconnectRate = disconnectRate
        options.serverRestarts = serverRestarts
        options.lostAckRate = lostAckRate
        options.quietTimeout = .seconds(timeout)
        options.nodes = nodes
        options.postgresURL = postgres
        options.nodeRestarts = nodeRestarts
        options.postgresRestarts = postgresRestarts
        if options.isCluster { options.serverRestarts = 0 }
        options.executable = Executable.current
        if let serverExecutable {
            guard FileManager.default.isExecutableFile(atPath: serverExecutable) else {
                throw ValidationError("--server-executable: '\(serverExecutable)' is not an executable file")
            }
            options.serverExecutable = URL(fileURLWithPath: serverExecutable)
        }

        if options.isCluster {
            emit(
                "Tandem soak: \(nodes) nodes over PostgreSQL (\(postgres == nil ? "a throwaway cluster" : "the given database")), "
                    + "\(devices) devices, \(ops) operations, seed \(seed), disconnect rate \(disconnectRate), "
                    + "\(nodeRestarts) node restarts (SIGKILL), \(postgresRestarts) PostgreSQL restarts, "
                    + "lost-ack rate \(lostAckRate)")
        } else {
            emit(
                "Tandem soak: \(devices) devices, \(ops) operations, seed \(seed), disconnect rate \(disconnectRate), "
                    + "\(serverRestarts) server restarts (SIGKILL), lost-ack rate \(lostAckRate)")
        }
        let progress = ProgressLine()
        let result = try await SoakScenario.run(options) { progress.show($0) }
        progress.finish()

        let counts = result.operations
        let seconds = String(format: "%.1f", result.elapsed.seconds)
        emit(
            "operations: \(counts["create", default: 0]) creates, \(counts["transfer", default: 0]) transfers, "
                + "\(counts["edit", default: 0]) edits, \(counts["delete", default: 0]) deletes; "
                + "\(counts["disconnect", default: 0]) disconnects")
        emit(
            "\(options.isCluster ? "node" : "server") restarts (SIGKILL): \(result.restarts)"
                + (options.isCluster ? "; PostgreSQL restarts: \(result.postgresRestarts)" : "")
                + "; acknowledgements lost on purpose: \(result.lostAcksInjected)")
        emit("acknowledged writes: \(result.acknowledgedWrites)")
        let converged = result.report.devices.filter(\.matchesServer).count
        emit(
            "devices equal to the server: \(converged) of \(result.report.devices.count) "
                + "(\(result.report.serverDocuments) documents)")
        emit("acknowledged writes lost: \(result.lostWrites.count)")
        emit("duplicate documents: \(result.duplicates.count)")
        emit("resurrected deletes: \(result.resurrected.count)")
        emit("read-your-writes violations: \(result.readYourWritesViolations.count)")
        if result.passed {
            emit("PASS (\(seconds) s)")
            return
        }
        emit("FAIL (\(seconds) s), seed \(seed)")
        if let first = result.firstDivergence { emit("first divergence: \(first)") }
        for line in result.report.firstDifferences.dropFirst().prefix(9) { emit("  also: \(line)") }
        for line in result.diagnosis { emit("  \(line)") }
        if let folder = result.keptFolder { emit("the devices' databases are kept in \(folder)") }
        throw ExitCode(1)
    }
}
