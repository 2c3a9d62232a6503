import ArgumentParser
import Foundation
import Logging
import TandemScenarios

struct BenchCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bench",
        abstract: "Measure how fast Tandem is, against what the machine can do without it.",
        discussion: """
            Each scenario runs on loopback with a real server and real clients, each client with \
            its own SQLite file, and measures its floor in the same run: a raw libwebsockets echo, \
            raw SQLite inserts, or JSON coding. Build in release mode first \
            (swift build -c release).

            Scenarios: propagation, throughput, snapshot, fanout (1,000 listeners), fanout-10k \
            (10,000 listeners, the server in a process of its own), server (the server alone, \
            driven by plain protocol writes), apply, connections, cluster (three nodes over \
            PostgreSQL: a throwaway cluster, or --postgres URL), queries (10,000 query listeners \
            with equality filters), query-limit (a limit-20 view over 100,000 documents), or all.

            Examples:
              tandem bench all
              tandem bench propagation --quick
              tandem bench all --json > results.jsonl
            """)

    @Argument(help: "A scenario, or all.")
    var scenario: String = "all"

    @Flag(help: "Print one JSON object per scenario instead of a table.")
    var json = false

    @Flag(help: "Shrink every scenario so that the whole run takes under a minute.")
    var quick = false

    @Option(
        help: ArgumentHelp(
            "The cluster scenario's database (its tables are created there); default: a throwaway PostgreSQL cluster.",
            valueName: "url"))
    var postgres: String?

    enum Scenario: String, CaseIterable {
        case propagation, throughput, snapshot, fanout
        case wideFanout = "fanout-10k"
        case server, apply, connections, cluster, queries
        case queryLimit = "query-limit"
        case transports
    }

    func validate() throws {
        guard scenario == "all" || Scenario(rawValue: scenario) != nil else {
            throw ValidationError(
                "unknown scenario '\(scenario)'; choose one of \(Scenario.allCases.map(\.rawValue).joined(separator: ", ")) or all"
            )
        }
    }

    func run() async throws {
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = .critical
            return handler
        }
        #if DEBUG
            note("# this is a debug build: figures are far from release ones (swift build -c release)")
        #endif
        let chosen = scenario == "all" ? Scenario.allCases : [Scenario(rawValue: scenario)!]
        let progress = ProgressLine(toStandardError: json)
        var results: [BenchResult] = []
        for scenario in chosen {
            progress.show("\(scenario.rawValue): starting")
            let result: BenchResult
            switch scenario {
            case .propagation: result = try await Bench.propagation(quick: quick, progress: progress.show)
            case .throughput: result = try await Bench.throughput(quick: quick, progress: progress.show)
            case .snapshot: result = try await Bench.snapshot(quick: quick, progress: progress.show)
            case .fanout: result = try await Bench.fanout(quick: quick, progress: progress.show)
            case .wideFanout: result = try await Bench.wideFanout(quick: quick, progress: progress.show)
            case .server: result = try await Bench.serverAlone(quick: quick, progress: progress.show)
            case .apply: result = try await Bench.apply(quick: quick, progress: progress.show)
            case .connections: result = try await Bench.connections(quick: quick, progress: progress.show)
            case .cluster: result = try await Bench.cluster(quick: quick, postgres: postgres, progress: progress.show)
            case .queries: result = try await Bench.queries(quick: quick, progress: progress.show)
            case .queryLimit: result = try await Bench.queryLimit(quick: quick, progress: progress.show)
            case .transports: result = try await Bench.transports(quick: quick, progress: progress.show)
            }
            await Bench.settle()
            progress.finish()
            results.append(result)
            if json {
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
                emit(String(decoding: try encoder.encode(result), as: UTF8.self))
            }
        }
        if !json { printTable(results) }
    }

    private func printTable(_ results: [BenchResult]) {
        let header = ["scenario", "result", "goal", "met", "floor", "vs floor"]
        let rows = results.map { result in
            [
                result.scenario, "\(result.metric) \(format(result.value)) \(result.unit)", result.goal,
                result.met.map { $0 ? "yes" : "no" } ?? "–",
                result.floor.map { "\($0): \(format(result.floorValue ?? 0))" } ?? "–",
                result.floorRatio.map { String(format: "%.2f", $0) } ?? "–",
            ]
        }
        let widths = header.indices.map { column in ([header] + rows).map { $0[column].count }.max()! + 2 }
        emit("")
        emit(pad(header, widths))
        for (result, row) in zip(results, rows) {
            emit(pad(row, widths))
            let details = result.details.sorted { $0.key < $1.key }.map { "\($0.key): \(format($0.value))" }
            emit("    " + details.joined(separator: "; "))
        }
        if quick { emit("(--quick: smaller runs; goals are judged on the full run only)") }
    }

    private func format(_ value: Double) -> String {
        if value >= 1000 { return String(format: "%.0f", value) }
        if value >= 10 { return String(format: "%.1f", value) }
        return String(format: "%.3f", value)
    }

    private func pad(_ cells: [String], _ widths: [Int]) -> String {
        zip(cells, widths).map { cell, width in cell.padding(toLength: width, withPad: " ", startingAt: 0) }.joined()
    }
}
