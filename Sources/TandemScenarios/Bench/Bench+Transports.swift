import Foundation
import TandemClient
import TandemHarness
import TandemLocal

extension Bench {
    /// The client's two transports side by side, in one run: propagation (one document at a
    /// time, device to device), throughput (100,000 documents) and fan-out (one write to 1,000
    /// listener connections), each with libwebsockets and with SwiftNIO, in two alternated rounds,
    /// so that what the machine does meanwhile falls on both. The headline is SwiftNIO's
    /// throughput over libwebsockets'; every figure is in the details.
    public static func transports(quick: Bool, progress: @escaping Progress) async throws -> BenchResult {
        #if canImport(TandemSocket)
            let libwebsockets: (any WebSocketTransport)? = try LibWebSocketsTransport()
        #else
            let libwebsockets: (any WebSocketTransport)? = nil
        #endif
        let candidates: [(name: String, transport: (any WebSocketTransport)?)] = [
            ("libwebsockets", libwebsockets), ("SwiftNIO", try NIOWebSocketTransport()),
        ]
        let documents = quick ? 200 : 1000
        let rows = quick ? 10_000 : 100_000
        let listeners = quick ? 100 : 1000
        raiseOpenFilesLimit()
        var details: [String: Double] = [:]
        var throughputs: [String: [Double]] = [:]
        for round in 1...2 {
            for (name, transport) in candidates where transport != nil {
                let label = "\(name), round \(round)"
                let server = try await benchServer()
                let propagation = try await propagationLatencies(
                    from: server, to: server, count: documents, transport: transport,
                    progress: { progress("transports, \(label): \($0)") })
                let fanout = try await fanoutLatencies(
                    url: server.url, listeners: listeners, writes: quick ? 20 : 100, scenario: "transports, \(label)",
                    transport: transport, progress: progress)
                await server.stop()
                await settle()
                let throughput = try await throughputRun(
                    count: rows, transport: transport, progress: { progress("transports, \(label): \($0)") })
                await settle()
                throughputs[name, default: []].append(throughput.rate)
                details["\(label): propagation p50 ms"] = propagation.total.milliseconds(at: 50)
                details["\(label): propagation p99 ms"] = propagation.total.milliseconds(at: 99)
                details["\(label): throughput docs/s"] = throughput.rate
                details["\(label): throughput CPU µs per document"] = throughput.cpuPerDocument * 1e6
                details["\(label): fanout to \(listeners) p99 ms"] = fanout.milliseconds(at: 99)
            }
        }
        let mean = { (name: String) in
            (throughputs[name] ?? []).reduce(0, +) / Double(max(1, throughputs[name]?.count ?? 0))
        }
        let ratio = libwebsockets == nil ? 1 : mean("SwiftNIO") / mean("libwebsockets")
        return BenchResult(
            scenario: "transports", metric: "SwiftNIO ÷ libwebsockets, throughput", value: ratio, unit: "",
            goal: "as fast within the noise (≥ 0.95) to be Linux's default too", met: quick ? nil : ratio >= 0.95,
            details: details, floor: "libwebsockets' throughput, docs/s",
            floorValue: libwebsockets == nil ? nil : mean("libwebsockets"), floorRatio: ratio)
    }
}
