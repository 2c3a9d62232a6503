import Foundation

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

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
        try await onOwnThread {
            let fd = try PlainSocket.connect(host: host, port: port)
            defer { close(fd) }
            var request = "\(method) \(path) HTTP/1.1\r\nHost: \(host):\(port)\r\nConnection: close\r\n"
            for (name, value) in headers { request += "\(name): \(value)\r\n" }
            if !body.isEmpty || method == "POST" { request += "Content-Length: \(body.count)\r\n" }
            request += "\r\n"
            try PlainSocket.sendAll(fd, Array(request.utf8) + body)
            var received: [UInt8] = []
            let deadline = ContinuousClock.now + timeout
            var chunk = [UInt8](repeating: 0, count: 65536)
            while PlainSocket.wait(fd, for: Int16(POLLIN), until: deadline) {
                let count = try PlainSocket.receive(fd, into: &chunk)
                if count <= 0 { break }
                received += chunk[0..<count]
                if let length = Self.complete(received) { return Self.parse(Array(received.prefix(length))) }
            }
            return Self.parse(received)
        }
    }

    /// The length of a complete response (headers and `Content-Length` bytes), if it is in.
    private static func complete(_ bytes: [UInt8]) -> Int? {
        guard let end = bytes.firstRange(of: Array("\r\n\r\n".utf8)) else { return nil }
        let head = String(decoding: bytes[..<end.lowerBound], as: UTF8.self).lowercased()
        guard let line = head.split(separator: "\r\n").first(where: { $0.hasPrefix("content-length:") }),
            let length = Int(line.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces))
        else { return nil }
        return bytes.count >= end.upperBound + length ? end.upperBound + length : nil
    }

    private static func parse(_ bytes: [UInt8]) -> (status: Int, body: String) {
        let text = String(decoding: bytes, as: UTF8.self)
        let status = text.split(separator: " ", maxSplits: 2).dropFirst().first.flatMap { Int($0) } ?? 0
        let body = text.range(of: "\r\n\r\n").map { String(text[$0.upperBound...]) } ?? ""
        return (status, body)
    }
}
