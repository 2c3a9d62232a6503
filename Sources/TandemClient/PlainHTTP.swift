import Foundation
import TandemWire

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// One plain HTTP/1.1 exchange over a blocking socket (no TLS): for the server's own pages
/// (`/healthz`, `/metrics`, the admin API) from the command and the tests.
package enum PlainHTTP {
    package struct Response: Sendable {
        package var status: Int
        package var body: [UInt8]
        package var text: String { String(decoding: body, as: UTF8.self) }
    }

    /// Sends the request and reads the whole response, blocking the calling thread.
    ///
    /// - Throws: ``PlainSocket/Failure`` when the server cannot be reached or does not answer
    ///   in time.
    package static func exchange(
        host: String, port: Int, method: String, path: String, headers: [String: String] = [:], body: [UInt8] = [],
        timeout: Duration
    ) throws -> Response {
        let fd = try PlainSocket.connect(host: host == "localhost" ? "127.0.0.1" : host, port: port)
        defer { close(fd) }
        var head = "\(method) \(path) HTTP/1.1\r\nConnection: close\r\n"
        if headers["Host"] == nil { head += "Host: \(host):\(port)\r\n" }
        for (name, value) in headers.sorted(by: { $0.key < $1.key }) { head += "\(name): \(value)\r\n" }
        if !body.isEmpty || method == "POST" { head += "Content-Length: \(body.count)\r\n" }
        head += "\r\n"
        try PlainSocket.sendAll(fd, Array(head.utf8) + body)
        var received: [UInt8] = []
        let deadline = ContinuousClock.now + timeout
        var chunk = [UInt8](repeating: 0, count: 1 << 16)
        while PlainSocket.wait(fd, for: Int16(POLLIN), until: deadline) {
            let count = try PlainSocket.receive(fd, into: &chunk)
            if count <= 0 { break }
            received += chunk[0..<count]
            if let length = completeLength(received) { return parse(Array(received.prefix(length))) }
        }
        guard !received.isEmpty else {
            throw PlainSocket.Failure(description: "\(host):\(port) did not answer \(method) \(path) within \(timeout)")
        }
        return parse(received)
    }

    /// ``exchange(host:port:method:path:headers:body:timeout:)`` on a thread of its own, so
    /// that the blocking socket calls hold no thread of Swift concurrency's pool.
    package static func exchange(
        host: String, port: Int, method: String, path: String, headers: [String: String] = [:], body: [UInt8] = [],
        timeout: Duration
    ) async throws -> Response {
        try await withCheckedThrowingContinuation { continuation in
            Thread.detachNewThread {
                continuation.resume(
                    with: Result {
                        try exchange(
                            host: host, port: port, method: method, path: path, headers: headers, body: body,
                            timeout: timeout) as Response
                    })
            }
        }
    }

    /// The length of a complete response (headers and `Content-Length` bytes), once it is in.
    private static func completeLength(_ bytes: [UInt8]) -> Int? {
        guard let end = bytes.firstRange(of: Array("\r\n\r\n".utf8)) else { return nil }
        let head = String(decoding: bytes[..<end.lowerBound], as: UTF8.self).lowercased()
        guard let line = head.split(separator: "\r\n").first(where: { $0.hasPrefix("content-length:") }),
            let length = Int(line.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces))
        else { return nil }
        return bytes.count >= end.upperBound + length ? end.upperBound + length : nil
    }

    private static func parse(_ bytes: [UInt8]) -> Response {
        guard let end = bytes.firstRange(of: Array("\r\n\r\n".utf8)) else { return Response(status: 0, body: []) }
        let statusLine = String(decoding: bytes.prefix { $0 != UInt8(ascii: "\r") }, as: UTF8.self)
        let status = statusLine.split(separator: " ", maxSplits: 2).dropFirst().first.flatMap { Int($0) } ?? 0
        return Response(status: status, body: Array(bytes[end.upperBound...]))
    }
}
