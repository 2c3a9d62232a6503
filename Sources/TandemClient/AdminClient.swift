import Foundation
import TandemWire

/// The admin API of a Tandem server (docs/ADMIN.md): export, import, reset, clients.
///
/// It speaks plain HTTP to the server's port, so it reaches `ws://` servers only; for a
/// `wss://` server, run it on the server's machine against a loopback port, or use curl.
///
/// For example, seeding a test server from a file:
///
/// ```swift
/// let admin = try AdminClient(server: "ws://127.0.0.1:7878", token: nil)
/// let summary = try await admin.importDocuments(try [UInt8](Data(contentsOf: seedFile)))
/// ```
public struct AdminClient: Sendable {
    public let host: String
    public let port: Int
    public let token: String?
    public let timeout: Duration

    /// - Parameters:
    ///   - server: The server's `ws://HOST:PORT` URL (the one its clients use).
    ///   - token: The server's admin token; nil for a server without one (loopback only).
    /// - Throws: ``TandemError`` `.invalidArgument` for a URL that is not `ws://HOST:PORT`.
    public init(server: String, token: String?, timeout: Duration = .seconds(60)) throws(TandemError) {
        guard let components = URLComponents(string: server), let host = components.host,
            components.scheme == "ws" || components.scheme == "wss"
        else {
            throw TandemError(.invalidArgument, "'\(server)' is not a server URL like ws://127.0.0.1:7878")
        }
        guard components.scheme == "ws" else {
            throw TandemError(
                .invalidArgument,
                "the admin client speaks plain HTTP and cannot reach \(server); on the server's machine use a ws:// "
                    + "loopback URL, or curl https://…/admin/… with the admin token")
        }
        self.host = host
        self.port = components.port ?? 80
        self.token = token
        self.timeout = timeout
    }

    /// Every document, tombstones included, in the export format (NDJSON).
    public func export() async throws -> [UInt8] {
        try await call("GET", "/admin/export").body
    }

    /// Stores the documents of an export, all or none.
    ///
    /// - Returns: How many documents went into how many collections.
    public func importDocuments(_ export: [UInt8]) async throws -> (documents: Int, collections: Int) {
        let answer = try await call("POST", "/admin/import", body: export)
        guard case .object(let object) = try Wire.parse(answer.body),
            let documents = object["imported"]?.intValue, let collections = object["collections"]?.intValue
        else { throw TandemError(.server, "the server's answer to the import was not understood: \(answer.text)") }
        return (Int(documents), Int(collections))
    }

    /// Removes every document of `collection`, or everything when nil.
    ///
    /// - Returns: How many documents were removed.
    @discardableResult
    public func reset(collection: CollectionPath?) async throws -> Int {
        let query =
            collection.map {
                "?collection="
                    + ($0.rawValue.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? $0.rawValue)
            } ?? ""
        let answer = try await call("POST", "/admin/reset" + query)
        guard case .object(let object) = try Wire.parse(answer.body), let removed = object["documents"]?.intValue else {
            throw TandemError(.server, "the server's answer to the reset was not understood: \(answer.text)")
        }
        return Int(removed)
    }

    /// Sends one request on a thread of its own and turns an error answer into a
    /// ``TandemError`` carrying the server's message.
    private func call(_ method: String, _ path: String, body: [UInt8] = []) async throws -> PlainHTTP.Response {
        var headers: [String: String] = [:]
        if let token { headers["Authorization"] = "Bearer \(token)" }
        let response = try await PlainHTTP.exchange(
            host: host, port: port, method: method, path: path, headers: headers, body: body, timeout: timeout)
        guard response.status == 200 else {
            var message = response.text.trimmingCharacters(in: .whitespacesAndNewlines)
            if case .object(let object)? = try? Wire.parse(response.body), let text = object["message"]?.stringValue {
                message = text
            }
            throw TandemError(
                .server,
                "\(method) \(path) answered \(response.status): \(message)")
        }
        return response
    }
}
