import CoreMetrics
import Prometheus
import Synchronization
import TandemWire

/// What the server counts, recorded through swift-metrics and exposed at `GET /metrics` in
/// Prometheus's text format by swift-prometheus.
///
/// Every metric is made with an explicit factory rather than through `MetricsSystem`'s
/// process-wide bootstrap: a library must not bootstrap metrics for the app that embeds it,
/// and a test process runs many servers, each with its own counts. The factory records into
/// the server's own Prometheus registry and, when ``ServerConfiguration/metricsFactory`` is
/// set, into the app's factory too (swift-metrics' `MultiplexMetricsHandler`), so an app can
/// send the same figures to StatsD, OpenTelemetry or its own Prometheus registry.
///
/// Gauges of the moment (connections, listeners, send queues, store size) are set when
/// `/metrics` is read (``refresh(_:)``); counters and the delivery histogram as things happen.
/// Listener gauges are labelled by collection *group* (`accounts/*/transactions`): one series
/// per shape of path, not one per account, so that their number stays bounded.
///
/// For example, from a shell while the server runs:
///
/// ```sh
/// curl -s localhost:7878/metrics | grep tandem_write
/// ```
final class ServerMetrics: Sendable {
    let registry = PrometheusCollectorRegistry()
    private let factory: any MetricsFactory

    private let writes: CoreMetrics.Counter
    private let acks: CoreMetrics.Counter
    private let conflicts: CoreMetrics.Counter
    private let opsByKind: [WriteOp.Kind: CoreMetrics.Counter]
    private let refusedByCode: Mutex<[ErrorCode: CoreMetrics.Counter]>
    private let slowConsumers: CoreMetrics.Counter
    private let listenersFellBehind: CoreMetrics.Counter
    private let commitsInDoubt: [CommitFinding: CoreMetrics.Counter]
    private let deliveryLatency: CoreMetrics.Timer
    private let connections: CoreMetrics.Gauge
    private let sendQueueBytes: CoreMetrics.Gauge
    private let sendQueueMaxBytes: CoreMetrics.Gauge
    private let storeBytes: CoreMetrics.Gauge
    private let listenerGauges = Mutex<[String: CoreMetrics.Gauge]>([:])
    private let refusedTokens: Mutex<[String: CoreMetrics.Counter]>
    private let keySetKeys: CoreMetrics.Gauge
    private let keySetStale: CoreMetrics.Gauge
    private let keySetFailures: CoreMetrics.Counter
    private let keySetFailuresSeen = Mutex(0)

    /// The help line of each metric, added to the exposition (swift-metrics has no place for
    /// help texts; swift-prometheus prints one only for metrics made on its registry directly).
    static let help: [String: String] = [
        "tandem_connections": "Open WebSocket connections.",
        "tandem_listeners": "Listeners, by collection group (document ids replaced with *).",
        "tandem_writes_total": "Write messages handled (acknowledged, conflicting or refused).",
        "tandem_write_ops_total": "Ops acknowledged, by kind (create, update, delete).",
        "tandem_acks_total": "Write messages acknowledged.",
        "tandem_conflicts_total": "Write messages answered with conflict.",
        "tandem_refused_ops_total": "Ops refused (with the whole write message that carried them), by error code.",
        "tandem_delivery_latency_seconds":
            "From a commit to its change being queued for a live listener, one observation per listener and commit.",
        "tandem_send_queue_bytes": "Bytes waiting in the send queues of all connections.",
        "tandem_send_queue_max_bytes": "Bytes waiting in the fullest send queue.",
        "tandem_slow_consumers_closed_total":
            "Connections closed (1008) because their peer stopped reading or their send queue overflowed.",
        "tandem_listeners_fell_behind_total":
            "Times a live listener's connection held so much to send that it caught up from the feed instead.",
        "tandem_store_bytes": "Size of the store (the SQLite file and its WAL, or the PostgreSQL tables).",
        "tandem_tokens_refused_total":
            "Tokens refused in hello or auth, by reason (expired, bad_signature, unknown_key, wrong_issuer, wrong_audience, malformed, algorithm, not_yet_valid, no_user; missing and not_valid for the token file).",
        "tandem_jwks_keys": "Keys in the JWT key set in use.",
        "tandem_jwks_stale":
            "1 when the last fetch or read of the JWT key set failed and the last good set is in use, else 0.",
        "tandem_jwks_failures_total": "Fetches or reads of the JWT key set that failed.",
        "tandem_commits_in_doubt_total":
            "Group commits whose answer the store lost, by what the node found: committed, not-committed (applied again), or unknown (answered outcome-unknown).",
    ]

    /// What a node found out about a commit whose answer the store lost.
    enum CommitFinding: String, CaseIterable {
        case committed
        case notCommitted = "not-committed"
        case unknown
    }

    init(extra: (any MetricsFactory)?) {
        var prometheus = PrometheusMetricsFactory(registry: registry)
        prometheus.durationHistogramBuckets["tandem_delivery_latency_seconds"] = [
            .milliseconds(1), .milliseconds(2), .milliseconds(5), .milliseconds(10), .milliseconds(25),
            .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500), .seconds(1),
            .milliseconds(2500), .seconds(5),
        ]
        let factory: any MetricsFactory =
            extra.map { MultiplexMetricsHandler(factories: [prometheus, $0]) } ?? prometheus
        self.factory = factory
        writes = CoreMetrics.Counter(label: "tandem_writes_total", factory: factory)
        acks = CoreMetrics.Counter(label: "tandem_acks_total", factory: factory)
        conflicts = CoreMetrics.Counter(label: "tandem_conflicts_total", factory: factory)
        opsByKind = Dictionary(
            uniqueKeysWithValues: [WriteOp.Kind.create, .update, .delete].map { kind in
                (
                    kind,
                    CoreMetrics.Counter(
                        label: "tandem_write_ops_total", dimensions: [("op", kind.rawValue)], factory: factory)
                )
            })
        refusedByCode = Mutex([:])
        slowConsumers = CoreMetrics.Counter(label: "tandem_slow_consumers_closed_total", factory: factory)
        listenersFellBehind = CoreMetrics.Counter(label: "tandem_listeners_fell_behind_total", factory: factory)
        commitsInDoubt = Dictionary(
            uniqueKeysWithValues: CommitFinding.allCases.map { finding in
                (
                    finding,
                    CoreMetrics.Counter(
                        label: "tandem_commits_in_doubt_total", dimensions: [("found", finding.rawValue)],
                        factory: factory)
                )
            })
        deliveryLatency = CoreMetrics.Timer(label: "tandem_delivery_latency_seconds", factory: factory)
        connections = CoreMetrics.Gauge(label: "tandem_connections", factory: factory)
        sendQueueBytes = CoreMetrics.Gauge(label: "tandem_send_queue_bytes", factory: factory)
        sendQueueMaxBytes = CoreMetrics.Gauge(label: "tandem_send_queue_max_bytes", factory: factory)
        storeBytes = CoreMetrics.Gauge(label: "tandem_store_bytes", factory: factory)
        refusedTokens = Mutex([:])
        keySetKeys = CoreMetrics.Gauge(label: "tandem_jwks_keys", factory: factory)
        keySetStale = CoreMetrics.Gauge(label: "tandem_jwks_stale", factory: factory)
        keySetFailures = CoreMetrics.Counter(label: "tandem_jwks_failures_total", factory: factory)
    }

    /// A `hello` or `auth` token was refused, for `reason`.
    func tokenRefused(_ reason: String) {
        refusedTokens.withLock { counters in
            let counter =
                counters[reason]
                ?? CoreMetrics.Counter(
                    label: "tandem_tokens_refused_total", dimensions: [("reason", reason)], factory: factory)
            counters[reason] = counter
            return counter
        }.increment()
    }

    // MARK: - As things happen

    /// A write message was answered with `answer`.
    func answered(_ write: ClientMessage.Write, with answer: ServerMessage) {
        writes.increment()
        switch answer {
        case .ack:
            acks.increment()
            for op in write.ops { opsByKind[op.kind]?.increment() }
        case .conflict:
            conflicts.increment()
        case .error(let error):
            refused(error.code).increment(by: Int64(write.ops.count))
        default:
            break
        }
    }

    /// A live listener fell behind and catches up from the feed.
    func listenerFellBehind() {
        listenersFellBehind.increment()
    }

    /// A commit whose answer was lost was found out, or given up on.
    func commitInDoubt(found finding: CommitFinding) {
        commitsInDoubt[finding]?.increment()
    }

    private func refused(_ code: ErrorCode) -> CoreMetrics.Counter {
        refusedByCode.withLock { counters in
            if let counter = counters[code] { return counter }
            let counter = CoreMetrics.Counter(
                label: "tandem_refused_ops_total", dimensions: [("code", code.rawValue)], factory: factory)
            counters[code] = counter
            return counter
        }
    }

    /// A commit's change was queued for a live listener `milliseconds` after the commit.
    func delivered(afterMilliseconds milliseconds: Int64) {
        deliveryLatency.recordMilliseconds(max(0, milliseconds))
    }

    /// A connection was closed because its send queue overflowed.
    func closedSlowConsumer() { slowConsumers.increment() }

    // MARK: - When read

    /// What the gauges show, taken on the core queue when `/metrics` is read.
    struct Moment {
        var connections = 0
        /// Listeners by collection group.
        var listeners: [String: Int] = [:]
        var queuedBytes: [Int] = []
        var storeBytes: Int64?
        /// The JWT key set's, when the server verifies JWTs with one.
        var keySet: KeySetSource.Health?
    }

    func refresh(_ moment: Moment) {
        connections.record(moment.connections)
        sendQueueBytes.record(moment.queuedBytes.reduce(0, +))
        sendQueueMaxBytes.record(moment.queuedBytes.max() ?? 0)
        if let bytes = moment.storeBytes { storeBytes.record(bytes) }
        if let keySet = moment.keySet {
            keySetKeys.record(keySet.keys)
            keySetStale.record(keySet.stale ? 1 : 0)
            let new = keySetFailuresSeen.withLock { seen in
                defer { seen = keySet.failures }
                return keySet.failures - seen
            }
            if new > 0 { keySetFailures.increment(by: Int64(new)) }
        }
        listenerGauges.withLock { gauges in
            // Groups no longer listened to read 0, rather than keep their last count.
            for (group, gauge) in gauges where moment.listeners[group] == nil { gauge.record(0) }
            for (group, count) in moment.listeners {
                let gauge =
                    gauges[group]
                    ?? CoreMetrics.Gauge(
                        label: "tandem_listeners", dimensions: [("collection", group)], factory: factory)
                gauges[group] = gauge
                gauge.record(count)
            }
        }
    }

    /// The exposition: swift-prometheus's text, with a help line before each metric's type line.
    func exposition() -> [UInt8] {
        Self.addingHelp(to: registry.emitToBuffer())
    }

    static func addingHelp(to text: [UInt8]) -> [UInt8] {
        var output: [UInt8] = []
        output.reserveCapacity(text.count + help.count * 80)
        for line in text.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
            if line.starts(with: "# TYPE ".utf8) {
                let name = line.dropFirst(7).prefix { $0 != UInt8(ascii: " ") }
                if let help = help[String(decoding: name, as: UTF8.self)] {
                    output += Array("# HELP ".utf8) + name + Array(" \(help)\n".utf8)
                }
            }
            output += line
            output.append(UInt8(ascii: "\n"))
        }
        if output.last == UInt8(ascii: "\n"), text.last == UInt8(ascii: "\n") { output.removeLast() }
        return output
    }
}

extension CollectionPath {
    /// The collection's group: its path with the document ids replaced by `*`
    /// (`accounts/*/transactions`), for metrics whose labels must stay few.
    var group: String {
        rawValue.split(separator: "/").enumerated().map { $0.offset % 2 == 1 ? "*" : String($0.element) }
            .joined(separator: "/")
    }
}
