import Synchronization
import TandemSocket
import TandemWire

/// What `GET /healthz` reports, kept up to date for the socket's service thread, which
/// answers HTTP requests without waiting for the core queue.
final class NodeHealth: Sendable {
    private let state: Mutex<State>

    struct State {
        var node: String
        var store: String
        var storeReachable = true
        var connections = 0
        var stopping = false
    }

    init(node: String, store: String) {
        state = Mutex(State(node: node, store: store))
    }

    func update(_ change: (inout State) -> Void) { state.withLock { change(&$0) } }

    var current: State { state.withLock { $0 } }
}

extension ServerCore {
    /// Answers plain HTTP requests on the server's port (service thread).
    ///
    /// - `GET /healthz`: 200 with the node's status as JSON while it can serve, 503 while its
    ///   store is unreachable or it is shutting down, so that a load balancer routes around it.
    func http(_ request: HTTPRequest, _ respond: @escaping @Sendable (HTTPResponse) -> Void) {
        switch (request.method, request.path) {
        case ("GET", "/healthz"):
            respond(Self.healthResponse(health.current))
        default:
            respond(.notFound(request.path))
        }
    }

    static func healthResponse(_ state: NodeHealth.State) -> HTTPResponse {
        let serving = state.storeReachable && !state.stopping
        var writer = JSONWriter()
        writer.beginObject()
        writer.key("status")
        writer.string(serving ? "ok" : "unavailable")
        writer.key("node")
        writer.string(state.node)
        writer.key("store")
        writer.string(state.store)
        writer.key("storeReachable")
        writer.bool(state.storeReachable)
        writer.key("connections")
        writer.int(Int64(state.connections))
        writer.endObject()
        return HTTPResponse(status: serving ? 200 : 503, body: writer.bytes + [UInt8(ascii: "\n")])
    }
}
