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
    /// Answers plain HTTP requests on the server's port (service thread). What needs the
    /// store or the sessions hops to the core queue and answers from there.
    ///
    /// - `GET /healthz`: 200 with the node's status as JSON while it can serve, 503 while its
    ///   store is unreachable or it is shutting down, so that a load balancer routes around it.
    /// - `GET /metrics`: Prometheus's text format (``ServerMetrics``).
    /// - `GET /`, `/console.js`, `/console.css`: the live console (``ConsolePage``).
    /// - `/admin/…`: the admin API (docs/ADMIN.md), for the admin token or loopback only.
    func serveHTTP(_ request: HTTPRequest, respond: @escaping @Sendable (HTTPResponse) -> Void) {
        switch (request.method, request.path) {
        case ("GET", "/healthz"):
            respond(Self.healthResponse(health.current))
        case ("GET", "/metrics"):
            queue.async { [self] in
                metrics.refresh(metricsMoment())
                respond(HTTPResponse(status: 200, contentType: "text/plain; version=0.0.4", body: metrics.exposition()))
            }
        case ("GET", "/"), ("GET", "/console"):
            respond(HTTPResponse(status: 200, contentType: "text/html; charset=utf-8", body: ConsolePage.html))
        case ("GET", "/console.js"):
            respond(HTTPResponse(status: 200, contentType: "text/javascript; charset=utf-8", body: ConsolePage.script))
        case ("GET", "/console.css"):
            respond(HTTPResponse(status: 200, contentType: "text/css; charset=utf-8", body: ConsolePage.style))
        case (_, let path) where path == "/admin" || path.hasPrefix("/admin/"):
            // Access first: nothing about the request is looked at before this.
            if let refusal = Self.refuseAdmin(request, token: configuration.adminToken) {
                respond(refusal)
                return
            }
            queue.async { [self] in respond(admin(request)) }
        default:
            respond(.notFound(request.path))
        }
    }

    /// Judges a plain HTTP request from its request line and headers (service thread), before
    /// a byte of its body is read: the admin API's access first, then whether the path takes a
    /// body and how large. Unknown paths and pages without bodies take none, so that no peer,
    /// judged or not, can make the server hold more than a request line and its headers,
    /// except an admin's import (``ServerConfiguration/maxImportBytes``).
    func admit(_ request: HTTPRequest) -> HTTPVerdict {
        let path = request.path
        guard path == "/admin" || path.hasPrefix("/admin/") else {
            return Self.pages.contains(path) ? .accept(maxBodyBytes: 0) : .refuse(.notFound(path))
        }
        if let refusal = Self.refuseAdmin(request, token: configuration.adminToken) { return .refuse(refusal) }
        switch (request.method, path) {
        case ("POST", "/admin/import"): return .accept(maxBodyBytes: configuration.maxImportBytes)
        case ("POST", _): return .accept(maxBodyBytes: 64 << 10)
        default: return .accept(maxBodyBytes: 0)
        }
    }

    /// The paths ``http(_:_:)`` answers besides the admin API's.
    private static let pages: Set<String> = ["/healthz", "/metrics", "/", "/console", "/console.js", "/console.css"]

    /// Nil when the request may use the admin API: it carries the admin token, or, on a
    /// server without one, it comes from a loopback address and names one as its `Host`.
    ///
    /// A web page of another site can make the developer's browser send requests to
    /// 127.0.0.1 (a form's POST needs no CORS preflight), and a DNS name pointed at 127.0.0.1
    /// makes them same-origin for the browser. So a request whose `Origin` is not this server
    /// is refused, and without a token the `Host` must be a loopback address as well.
    static func refuseAdmin(_ request: HTTPRequest, token: String?) -> HTTPResponse? {
        if let origin = request.origin, origin.split(separator: "/").last.map(String.init) != request.host {
            return adminError(
                403, "forbidden", "the admin API answers its own console and other clients, not pages of \(origin)")
        }
        guard let token else {
            let loopback =
                request.peer.hasPrefix("127.") || request.peer == "::1" || request.peer.hasPrefix("::ffff:127.")
            return loopback && isLoopbackHost(request.host)
                ? nil
                : adminError(
                    403, "forbidden",
                    "this server has no admin token, so its admin API answers loopback addresses only (start it with --admin-token)"
                )
        }
        guard let authorization = request.authorization, authorization.hasPrefix("Bearer "),
            constantTimeEqual(Array(authorization.utf8.dropFirst(7)), Array(token.utf8))
        else {
            return adminError(
                401, "unauthenticated", "the admin API needs the header 'Authorization: Bearer ADMIN_TOKEN'")
        }
        return nil
    }

    /// Whether a `Host` header names a loopback address (`127.0.0.1:7878`, `localhost`, `[::1]:7878`).
    private static func isLoopbackHost(_ host: String?) -> Bool {
        guard let host else { return false }
        let name: Substring
        if host.hasPrefix("[") {
            name = host.dropFirst().prefix { $0 != "]" }
        } else {
            name = host.prefix { $0 != ":" }
        }
        return name == "localhost" || name == "::1" || name.hasPrefix("127.")
    }

    /// Compares without stopping at the first difference, so that the time taken does not
    /// tell how much of a guessed token was right.
    private static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        var difference = UInt8(a.count == b.count ? 0 : 1)
        for index in 0..<max(a.count, b.count) {
            difference |= (index < a.count ? a[index] : 0) ^ (index < b.count ? b[index] : 0)
        }
        return difference == 0
    }

    /// An admin request, on the core queue.
    private func admin(_ request: HTTPRequest) -> HTTPResponse {
        Confinement.check(queue)
        do {
            switch (request.method, request.path) {
            case ("GET", "/admin/collections"):
                return HTTPResponse(status: 200, body: try collectionsJSON())
            case ("GET", "/admin/clients"):
                return HTTPResponse(status: 200, body: clientsJSON())
            case ("POST", "/admin/reset"):
                let collection = try request.parameter("collection").map { try CollectionPath($0) }
                let removed = try reset(collection)
                var writer = JSONWriter()
                writer.beginObject()
                writer.key("reset")
                writer.string(collection?.rawValue ?? "everything")
                writer.key("documents")
                writer.int(Int64(removed))
                writer.endObject()
                return HTTPResponse(status: 200, body: writer.bytes)
            case ("GET", "/admin/export"):
                return HTTPResponse(status: 200, contentType: "application/x-ndjson", body: try export())
            case ("POST", "/admin/import"):
                let summary = try importDocuments(request.body)
                return HTTPResponse(
                    status: 200, text: #"{"imported":\#(summary.documents),"collections":\#(summary.collections)}"#)
            case ("GET", "/admin/faults"):
                return HTTPResponse(status: 200, body: FaultPlan.json(faults?.plan))
            case ("POST", "/admin/faults"):
                let plan = try FaultPlan.fromJSON(request.body)
                faults = plan.map(FaultInjector.init)
                logger.warning(
                    "faults set by the admin API", metadata: ["tandem.faults": "\(plan?.description ?? "none")"])
                return HTTPResponse(status: 200, body: FaultPlan.json(plan))
            case (_, "/admin/collections"), (_, "/admin/clients"), (_, "/admin/reset"), (_, "/admin/export"),
                (_, "/admin/import"), (_, "/admin/faults"):
                return Self.adminError(405, "method-not-allowed", "\(request.method) is not allowed on \(request.path)")
            default:
                return Self.adminError(
                    404, "not-found",
                    "no such admin endpoint: \(request.path) (there are collections, clients, reset, export, import, faults)"
                )
            }
        } catch let error as ImportError {
            return Self.adminError(
                error.reason == .exists ? 409 : 400, "import-refused", "nothing was imported: \(error)")
        } catch let error as WireError {
            return Self.adminError(400, error.code.rawValue, error.message)
        } catch let error as ServerError {
            return Self.adminError(400, error.code.rawValue, error.message)
        } catch {
            logger.error(
                "admin request failed", metadata: ["tandem.path": "\(request.path)", "tandem.error": "\(error)"])
            return Self.adminError(500, "internal", "the server could not read or write its store: \(error)")
        }
    }

    /// `{"error":"code","message":"…"}` with an HTTP status.
    static func adminError(_ status: Int, _ code: String, _ message: String) -> HTTPResponse {
        var writer = JSONWriter()
        writer.beginObject()
        writer.key("error")
        writer.string(code)
        writer.key("message")
        writer.string(message)
        writer.endObject()
        return HTTPResponse(status: status, body: writer.bytes + [UInt8(ascii: "\n")])
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
