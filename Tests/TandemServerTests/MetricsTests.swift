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
