import Foundation
import TandemClient

/// A plain HTTP/1.1 request, for tests of the server's pages (`/healthz`, `/metrics`): the
/// status and the body. It blocks its own thread, not the caller's task.
///
/// For example:
///
/// ```swift
/// let (status, body) = try await HTTPGet.fetch(host: "127.0.0.1", port: server.port, path: "/healthz")
/// ```
public enum HTTPGet {
    public static func fetch(
        host: String = "127.0.0.1", port: Int, path: String, method: String = "GET", body: [UInt8] = [],
        headers: [String: String] = [:], timeout: Duration = .seconds(10)
    ) async throws -> (status: Int, body: String) {
        let response = try await PlainHTTP.exchange(
            host: host, port: port, method: method, path: path, headers: headers, body: body, timeout: timeout)
        return (response.status, response.text)
    }
}
