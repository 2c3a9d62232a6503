import Foundation
import Synchronization
import TandemClient
import TandemServer
import TandemTesting
import TandemWire
import Testing

/// A plain HTTP request sent the way a hostile or impatient client sends it: the headers, then
/// as much of the body as the server takes, reading whatever the server answers meanwhile.
struct EagerPost {
    var status: Int?
    var response: String
    /// Bytes of the body the server took before it answered (or closed).
    var bodySent: Int
    /// The server's answer was lost to a reset.
    var reset: Bool

    /// - Parameters:
    ///   - declared: The `Content-Length` sent.
    ///   - sending: How much of the body to send at most (it may be less than declared).
    static func send(
        port: Int, path: String, headers: [String] = [], declared: Int, sending: Int, method: String = "POST",
        timeout: Duration = .seconds(60)
    ) async throws -> EagerPost {
        try await onOwnThread {
            let fd = try PlainSocket.connect(host: "127.0.0.1", port: port)
            defer { close(fd) }
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            var head = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nContent-Length: \(declared)\r\n"
            for header in headers { head += header + "\r\n" }
            var pending = Array((head + "\r\n").utf8)
            let chunk = [UInt8](repeating: UInt8(ascii: "x"), count: 64 << 10)
            var bodySent = 0
            var received: [UInt8] = []
            var reset = false
            var writing = true
            let deadline = ContinuousClock.now + timeout
            while ContinuousClock.now < deadline {
                var descriptor = pollfd(fd: fd, events: Int16(POLLIN) | (writing ? Int16(POLLOUT) : 0), revents: 0)
                guard poll(&descriptor, 1, 100) >= 0 else { break }
                if descriptor.revents & Int16(POLLIN | POLLHUP | POLLERR) != 0 {
                    var buffer = [UInt8](repeating: 0, count: 64 << 10)
                    let count = recv(fd, &buffer, buffer.count, 0)
                    if count > 0 {
                        received += buffer[0..<count]
                        continue
                    }
                    if count < 0 && errno == EAGAIN { continue }
                    if count < 0 && errno == ECONNRESET { reset = true }
                    break
                }
                if writing && descriptor.revents & Int16(POLLOUT) != 0 {
                    if pending.isEmpty {
                        guard bodySent < sending else {
                            writing = false
                            continue
                        }
                        pending = Array(chunk.prefix(sending - bodySent))
                    }
                    let count = pending.withUnsafeBytes {
                        Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
                    }
                    if count > 0 {
                        if head.isEmpty { bodySent += count } else { head = "" }
                        pending.removeFirst(count)
                    } else if count < 0 && errno != EAGAIN {
                        writing = false
                    }
                }
            }
            let text = String(decoding: received, as: UTF8.self)
            let status = text.split(separator: " ", maxSplits: 2).dropFirst().first.flatMap { Int($0) }
            return EagerPost(status: status, response: text, bodySent: bodySent, reset: reset)
        }
    }
}

/// A plain HTTP request is judged from its request line and headers before a byte of its body
/// is held: access, the path, and the body's declared length against the path's limit and
/// the server's budget for bodies in flight.
@Suite("HTTP requests judged before their bodies", .serialized)
struct HTTPAdmissionTests {
    /// An export of one document (docs/ADMIN.md's format).
    static func export(id: String) -> [UInt8] {
        Array(
            """
            {"format":"tandem-export","version":1}
            {"collection":"notes","id":"\(id)","version":1,"fields":{"t":"x"}}

            """.utf8)
    }

    @Test("an unauthenticated POST of 63 MiB is answered 401 from its headers, and its connection closes with a FIN")
    func unauthenticatedRefusedUnread() async throws {
        let server = try await TestServer { $0.adminToken = "secret" }
        // Headers only: the answer comes without a byte of the body.
        let refused = try await EagerPost.send(
            port: server.port, path: "/admin/import", declared: 63 << 20, sending: 0, timeout: .seconds(30))
        #expect(refused.status == 401, "\(refused.response.prefix(200))")
        #expect(refused.response.lowercased().contains("connection: close"))
        #expect(!refused.reset)
        // A client that keeps sending its body gets the answer too, not a reset.
        let eager = try await EagerPost.send(
            port: server.port, path: "/admin/import", declared: 63 << 20, sending: 8 << 20, timeout: .seconds(30))
        #expect(eager.status == 401, "\(eager.response.prefix(200))")
        #expect(!eager.reset, "sent \(eager.bodySent) bytes")
    }

    @Test(
        "bodies beyond their path's limit are refused unread: 413 for an import over its size, 404 off the map, 411 chunked"
    )
    func limitsPerPath() async throws {
        let server = try await TestServer { configuration in
            configuration.adminToken = "secret"
            configuration.maxImportBytes = 1 << 20
        }
        let admin = "Authorization: Bearer secret"
        let tooLarge = try await EagerPost.send(
            port: server.port, path: "/admin/import", headers: [admin], declared: 2 << 20, sending: 0)
        #expect(tooLarge.status == 413, "\(tooLarge.response.prefix(300))")
        #expect(tooLarge.response.contains("takes at most 1048576"))
        let healthz = try await EagerPost.send(port: server.port, path: "/healthz", declared: 100, sending: 0)
        #expect(healthz.status == 413, "a GET page takes no body: \(healthz.response.prefix(200))")
        let nowhere = try await EagerPost.send(port: server.port, path: "/upload", declared: 1 << 20, sending: 0)
        #expect(nowhere.status == 404, "\(nowhere.response.prefix(200))")
        let chunked = try await EagerPost.send(
            port: server.port, path: "/admin/import", headers: [admin, "Transfer-Encoding: chunked"], declared: 0,
            sending: 0)
        #expect(chunked.status == 411, "\(chunked.response.prefix(200))")
        // An import within the limit is read and stored.
        let imported = try await HTTPGet.fetch(
            port: server.port, path: "/admin/import", method: "POST", body: Self.export(id: "a"),
            headers: ["Authorization": "Bearer secret"])
        #expect(imported.status == 200, "\(imported.body)")
    }

    @Test(
        "a body that does not fit beside those in flight is answered 503 with Retry-After, unread; it fits once they are done"
    )
    func budgetInFlight() async throws {
        let server = try await TestServer { configuration in
            configuration.adminToken = "secret"
            configuration.maxImportBytes = 1 << 20
            configuration.maxHTTPBodyBytesInFlight = 1 << 20
        }
        let admin = "Authorization: Bearer secret"
        // The first holds its reservation: its body is slow to come (it never does, here).
        async let first = EagerPost.send(
            port: server.port, path: "/admin/import", headers: [admin], declared: 800 << 10, sending: 1 << 10,
            timeout: .seconds(3))
        try await Task.sleep(for: .milliseconds(500))
        let second = try await EagerPost.send(
            port: server.port, path: "/admin/import", headers: [admin], declared: 800 << 10, sending: 0)
        #expect(second.status == 503, "\(second.response.prefix(300))")
        #expect(second.response.lowercased().contains("retry-after: 1"))
        _ = try await first
        // Once the first connection is gone, its reservation is back.
        try await waitUntil("the budget is free again") {
            let again = try await HTTPGet.fetch(
                port: server.port, path: "/admin/import", method: "POST", body: Self.export(id: "b"),
                headers: ["Authorization": "Bearer secret"])
            return again.status == 200
        }
    }

    @Test("connections past the bound on those still in their handshake are closed as they come; the others are served")
    func handshakeBound() async throws {
        let server = try await TestServer { $0.maxHandshakes = 4 }
        let established = try await connect(server)
        // Four connections that send half a request line and nothing more.
        var slow: [Int32] = []
        for _ in 0..<4 {
            let fd = try PlainSocket.connect(host: "127.0.0.1", port: server.port)
            try PlainSocket.sendAll(fd, Array("GET / HT".utf8))
            slow.append(fd)
        }
        defer { for fd in slow { close(fd) } }
        try await waitUntil("the fifth is refused") {
            (try? await HTTPGet.fetch(port: server.port, path: "/healthz", timeout: .seconds(2))) == nil
        }
        // A connection made before is served meanwhile.
        _ = try await established.create("notes", ["t": "still here"])
        // Once the slow ones are gone, new connections are served again.
        for fd in slow { close(fd) }
        slow = []
        try await waitUntil("a new connection is served") {
            (try? await HTTPGet.fetch(port: server.port, path: "/healthz", timeout: .seconds(2)))?.status == 200
        }
    }
}

/// Hostile HTTP at scale, against `tandem serve` in a process of its own, whose memory is its
/// own: a hundred oversized unauthenticated POSTs at once.
@Suite("A flood of unauthenticated uploads", .serialized)
struct HTTPFloodTests {
    /// The process's resident memory, in KiB.
    static func resident(_ pid: Int32) throws -> Int {
        let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
        let line = try #require(status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") })
        return try #require(Int(line.split(separator: " ").dropFirst().first ?? ""))
    }

    @Test(
        "a hundred 63 MiB POSTs with a wrong token at once: each is answered 401, the server's memory grows by less than 32 MiB, and other clients are served meanwhile"
    )
    func hundredOversizedPosts() async throws {
        let server = try await ServerProcess(
            arguments: ["serve", "--port", "0", "--memory", "--admin-token", "secret", "--log-level", "error"])
        defer { server.send(SIGTERM) }
        let port = try #require(URL(string: server.url)?.port)
        let pid = server.processIdentifier
        // A client at work the whole time: it writes and its listener hears each write.
        let client = try await ServerConnection.connect(to: server.url, clientId: "bystander", timeout: .seconds(60))
        let feed = Feed()
        client.listen(to: try path("notes"), handler: feed.handler)
        try await waitUntil("the bystander listens") { feed.isCurrent }
        let before = try Self.resident(pid)

        let peak = PeakMemory()
        let sampler = Task {
            while !Task.isCancelled {
                if let now = try? Self.resident(pid) { peak.note(now) }
                try? await Task.sleep(for: .milliseconds(20))
            }
        }
        let answers = try await withThrowingTaskGroup(of: EagerPost.self) { group in
            for _ in 0..<100 {
                group.addTask {
                    try await EagerPost.send(
                        port: port, path: "/admin/import", headers: ["Authorization: Bearer wrong"],
                        declared: 63 << 20, sending: 8 << 20, timeout: .seconds(60))
                }
            }
            // Meanwhile the bystander is served.
            for n in 0..<20 { _ = try await client.create("notes", ["n": .int(Int64(n))]) }
            var all: [EagerPost] = []
            for try await answer in group { all.append(answer) }
            return all
        }
        try await waitUntil("the bystander heard its writes") { feed.changes.count == 20 }
        #expect(try await HTTPGet.fetch(port: port, path: "/healthz").status == 200)
        sampler.cancel()
        _ = await sampler.result
        peak.note(try Self.resident(pid))

        #expect(answers.allSatisfy { $0.status == 401 }, "\(answers.map { $0.status.map(String.init) ?? "none" })")
        let grew = peak.highest - before
        #expect(grew < 32 << 10, "the server's memory grew by \(grew / 1024) MiB (from \(before / 1024) MiB)")
    }
}

/// The highest of the values noted.
final class PeakMemory: Sendable {
    private let value = Mutex(0)
    func note(_ kilobytes: Int) { value.withLock { $0 = max($0, kilobytes) } }
    var highest: Int { value.withLock { $0 } }
}
