import Foundation
import MetricsTestKit
import TandemClient
import TandemServer
import TandemTesting
import TandemWire
import Testing

@Suite("GET /metrics")
struct MetricsTests {
    @Test("counts writes, acks, conflicts, refusals by code, listeners and deliveries, in Prometheus's text format")
    func counts() async throws {
        let server = try await TestServer()
        let reader = try await connect(server)
        let feed = Feed()
        reader.listen(to: try path("accounts/A1/transactions"), handler: feed.handler)
        reader.listen(to: try path("accounts/A2/transactions"), handler: Feed().handler)
        try await waitUntil("current") { feed.isCurrent }

        let writer = try await connect(server)
        let a = try await writer.create("accounts/A1/transactions", ["amount": 1])
        _ = try await writer.create("accounts/A1/transactions", ["amount": 2])
        let stale = try await writer.update("accounts/A1/transactions", a.id, ["amount": 3], base: 7)
        guard case .conflict = stale else { throw TestFailure("expected a conflict: \(stale)") }
        await #expect(throws: TandemError.self) {
            _ = try await writer.update("accounts/A1/transactions", try DocumentID("missing"), ["a": 1], base: 1)
        }
        try await waitUntil("both creates reach the listener") { feed.changes.count == 2 }

        let (status, text) = try await HTTPGet.fetch(port: server.port, path: "/metrics")
        #expect(status == 200)
        let lines = Set(text.split(separator: "\n").map(String.init))
        for expected in [
            "tandem_writes_total 4", "tandem_acks_total 2", "tandem_conflicts_total 1",
            #"tandem_write_ops_total{op="create"} 2"#, #"tandem_refused_ops_total{code="not-found"} 1"#,
            #"tandem_listeners{collection="accounts/*/transactions"} 2.0"#, "tandem_connections 2.0",
            "tandem_slow_consumers_closed_total 0",
        ] {
            #expect(lines.contains(expected), "missing '\(expected)' in:\n\(text)")
        }
        let deliveries = try #require(lines.first { $0.hasPrefix("tandem_delivery_latency_seconds_count ") })
        #expect(deliveries == "tandem_delivery_latency_seconds_count 2")
        #expect(lines.contains { $0.hasPrefix("tandem_store_bytes ") })

        // Every metric has its help line right before its type line, as Prometheus asks.
        let all = text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        for (index, line) in all.enumerated() where line.hasPrefix("# TYPE ") {
            let name = line.split(separator: " ")[2]
            #expect(index > 0 && all[index - 1].hasPrefix("# HELP \(name) "), "no help line for \(name)")
        }
    }

    @Test("Prometheus's own parser (the Python client's) reads /metrics: every family typed, with help and samples")
    func prometheusParser() async throws {
        let server = try await TestServer()
        let reader = try await connect(server)
        let feed = Feed()
        reader.listen(to: try path("notes"), handler: feed.handler)
        try await waitUntil("current") { feed.isCurrent }
        let writer = try await connect(server)
        let a = try await writer.create("notes", ["a": 1])
        _ = try await writer.update("notes", a.id, ["a": 2], base: 9)
        try await waitUntil("the create reaches the listener") { feed.changes.count == 1 }
        let text = try await HTTPGet.fetch(port: server.port, path: "/metrics").body

        let parsed = try await Self.parseWithPrometheusClient(text)
        let families = try #require(parsed.objectValue)
        func family(_ name: String) -> JSONObject? { families[name]?.objectValue }
        #expect(family("tandem_acks")?["type"] == "counter")
        #expect(family("tandem_acks")?["samples"] == [["tandem_acks_total", [:], 1.0]])
        #expect(family("tandem_conflicts")?["samples"] == [["tandem_conflicts_total", [:], 1.0]])
        #expect(family("tandem_listeners")?["samples"] == [["tandem_listeners", ["collection": "notes"], 1.0]])
        #expect(family("tandem_delivery_latency_seconds")?["type"] == "histogram")
        let buckets = family("tandem_delivery_latency_seconds")?["samples"]
        #expect(buckets.map { "\($0)".contains("tandem_delivery_latency_seconds_count") } == true)
        for (name, value) in families {
            #expect(value.objectValue?["help"]?.stringValue?.isEmpty == false, "\(name) has no help text")
            #expect(name.hasPrefix("tandem_"), "\(name)")
        }
        // Every family of docs/ADMIN.md's table; refusals appear once there is one.
        let names = Set(families.keys)
        #expect(names.isSubset(of: ServerMetricsNames.expected), "\(names.sorted())")
        #expect(
            Set(ServerMetricsNames.expected).subtracting(names) == ["tandem_refused_ops", "tandem_tokens_refused"],
            "\(names.sorted())")
    }

    /// What Prometheus's Python client (`prometheus_client.parser`, Debian's
    /// python3-prometheus-client) reads in `text`: `{family: {type, help, samples}}`.
    static func parseWithPrometheusClient(_ text: String) async throws -> JSONValue {
        let script = """
            import json, sys
            from prometheus_client.parser import text_string_to_metric_families
            out = {}
            for f in text_string_to_metric_families(sys.stdin.read()):
                out[f.name] = {"type": f.type, "help": f.documentation,
                               "samples": [[s.name, s.labels, s.value] for s in f.samples]}
            print(json.dumps(out))
            """
        let process = ChildProcess()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = ["-c", script]
        let input = Pipe(), output = Pipe(), error = Pipe()
        process.standardInput = input
        process.standardOutput = output
        process.standardError = error
        try process.run()
        return try await onOwnThread {
            input.fileHandleForWriting.write(Data(text.utf8))
            try input.fileHandleForWriting.close()
            let out = output.fileHandleForReading.readDataToEndOfFile()
            let err = error.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            guard process.terminationStatus == 0 else {
                throw TestFailure("the Prometheus parser refused /metrics: \(String(decoding: err, as: UTF8.self))")
            }
            return try Wire.parse(Array(out))
        }
    }

    @Test("an app's own metrics factory receives the same counts")
    func appFactory() async throws {
        let recorded = TestMetrics()
        let server = try await TestServer { $0.metricsFactory = recorded }
        let writer = try await connect(server)
        _ = try await writer.create("notes", ["a": 1])
        #expect(recorded.counterTotal(label: "tandem_acks_total") == 1)
        #expect(recorded.counterTotal(label: "tandem_write_ops_total", dimensions: [("op", "create")]) == 1)
        // And /metrics still shows them.
        let text = try await HTTPGet.fetch(port: server.port, path: "/metrics").body
        #expect(text.contains("\ntandem_acks_total 1\n"), "\(text)")
    }
}

/// The metric families /metrics shows (docs/ADMIN.md's table).
enum ServerMetricsNames {
    static let expected = [
        "tandem_connections", "tandem_listeners", "tandem_writes", "tandem_acks", "tandem_write_ops",
        "tandem_conflicts", "tandem_refused_ops", "tandem_delivery_latency_seconds", "tandem_send_queue_bytes",
        "tandem_send_queue_max_bytes", "tandem_slow_consumers_closed", "tandem_store_bytes", "tandem_commits_in_doubt",
        "tandem_listeners_fell_behind", "tandem_tokens_refused", "tandem_jwks_keys", "tandem_jwks_stale",
        "tandem_jwks_failures",
    ]
}
