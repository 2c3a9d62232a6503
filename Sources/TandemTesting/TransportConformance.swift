import Foundation
import Synchronization
import TandemClient
import TandemSocket

/// The checks any ``WebSocketTransport`` must pass before a `ServerConnection` runs over it:
/// connecting (and failing to), ordering, whole messages however the network splits them,
/// close codes both ways, backpressure, and connecting again.
///
/// Each check runs against a real WebSocket server on loopback (libwebsockets, on port 0).
/// Tandem runs them against ``LibWebSocketsTransport``; an app that brings its own transport
/// (over `URLSessionWebSocketTask`, say) runs them against it in its own tests:
///
/// ```swift
/// @Test(arguments: TransportConformance.checks)
/// func conformance(_ check: TransportConformance.Check) async throws {
///     try await check.run(on: MyURLSessionTransport())
/// }
/// ```
public enum TransportConformance {
    /// One named check.
    public struct Check: Sendable, CustomStringConvertible {
        public let name: String
        fileprivate let body: @Sendable (any WebSocketTransport, Peer) async throws -> Void

        public var description: String { name }

        /// Runs the check against `transport`, with a server of its own: over `wss://` with
        /// `tls` (the transport must trust `tls.authority`), else `ws://`.
        ///
        /// - Throws: ``TransportConformanceFailure`` saying what the transport did wrong.
        public func run(on transport: any WebSocketTransport, tls: TestCertificates? = nil) async throws {
            let peer = try Peer(tls: tls)
            do {
                try await body(transport, peer)
            } catch {
                await peer.stop()
                throw error
            }
            await peer.stop()
        }
    }

    public static let checks: [Check] = [
        Check(name: "a refused port is one closed event with failedToConnect, and a bad URL throws invalid-url") {
            transport, peer in
            let refused = try RefusingPort()
            let events = Events()
            _ = try transport.connect(to: "\(peer.scheme)://127.0.0.1:\(refused.port)", handler: events.handler)
            let close = try await events.closed()
            try expect(close.failedToConnect, "a refused connection reports failedToConnect, got \(close)")
            do {
                _ = try transport.connect(to: "http//nowhere", handler: Events().handler)
                throw TransportConformanceFailure("connecting to 'http//nowhere' did not throw")
            } catch let error as TransportError {
                try expect(error.code == .invalidURL, "a bad URL throws invalid-url, got \(error.code.rawValue)")
            }
            try await events.expectNothingAfterClose()
        },
        Check(name: "messages sent before and after the open arrive in order, and come back in order") {
            transport, peer in
            let events = Events()
            let connection = try transport.connect(to: peer.url, handler: events.handler)
            let count = 2_000
            for index in 0..<count { try connection.send(text: Array("echo \(index)".utf8)) }
            try await events.waitForTexts(count)
            let texts = events.texts.map { String(decoding: $0, as: UTF8.self) }
            try expect(texts == (0..<count).map { "echo \($0)" }, "echoes out of order: \(texts.prefix(5))…")
            try expect(peer.received == (0..<count).map { "echo \($0)" }, "the server received them out of order")
            connection.close(code: 1000, reason: "done")
            _ = try await events.closed()
        },
        Check(name: "a message larger than the network's pieces arrives whole") { transport, peer in
            let events = Events()
            let connection = try transport.connect(to: peer.url, handler: events.handler)
            let size = 600_000
            try connection.send(text: Array("big \(size)".utf8))
            try await events.waitForTexts(1)
            let message = events.texts[0]
            try expect(
                message.count == size && message.allSatisfy { $0 == UInt8(ascii: "x") }, "got \(message.count) bytes")
            let sent = String(repeating: "y", count: size)
            try connection.send(text: Array(("echo " + sent).utf8))
            try await events.waitForTexts(2)
            try expect(
                events.texts[1].count == size + 5, "the echo of \(size + 5) bytes came back as \(events.texts[1].count)"
            )
            connection.close(code: 1000, reason: "done")
            _ = try await events.closed()
        },
        Check(name: "the server's close code and reason reach the handler, once") { transport, peer in
            let events = Events()
            let connection = try transport.connect(to: peer.url, handler: events.handler)
            try connection.send(text: Array("close 4001 going to lunch".utf8))
            let close = try await events.closed()
            try expect(close.code == 4001 && close.reason == "going to lunch" && !close.failedToConnect, "got \(close)")
            try expect(!connection.isOpen, "isOpen is still true after the closed event")
            try await events.expectNothingAfterClose()
        },
        Check(name: "closing sends the code and reason to the server; aborting ends the connection at once") {
            transport, peer in
            let events = Events()
            let connection = try transport.connect(to: peer.url, handler: events.handler)
            try connection.send(text: Array("echo hi".utf8))
            try await events.waitForTexts(1)
            try expect(connection.isOpen, "isOpen is false on a connection that just echoed")
            connection.close(code: 4002, reason: "bye")
            try expect(!connection.isOpen, "isOpen is still true right after close()")
            _ = try await events.closed()
            try await waitUntil("the server saw the close", timeout: .seconds(30)) { peer.closes.count == 1 }
            try expect(
                peer.closes[0].code.rawValue == 4002 && peer.closes[0].reason == "bye",
                "the server saw \(peer.closes[0])")
            do {
                try connection.send(text: Array("echo late".utf8))
                throw TransportConformanceFailure("send on a closed connection did not throw")
            } catch let error as TransportError {
                try expect(error.code == .notOpen, "send after close throws not-open, got \(error.code.rawValue)")
            }

            let dropped = Events()
            let second = try transport.connect(to: peer.url, handler: dropped.handler)
            try second.send(text: Array("echo hi".utf8))
            try await dropped.waitForTexts(1)
            second.abort()
            _ = try await dropped.closed()
            try await waitUntil("the server saw the drop", timeout: .seconds(30)) { peer.closes.count == 2 }
            // Not a normal close: the server must be able to tell a drop from a goodbye.
            try expect(
                ![1000, 4002].contains(peer.closes[1].code.rawValue),
                "an abort looked like a normal close to the server: \(peer.closes[1])")
            try await events.expectNothingAfterClose()
            try await dropped.expectNothingAfterClose()
        },
        Check(name: "a server that stops reading makes send throw or the connection close; send never blocks") {
            transport, peer in
            let events = Events()
            let connection = try transport.connect(to: peer.url, handler: events.handler)
            try connection.send(text: Array("stop-reading".utf8))
            try await events.waitForTexts(1)  // the server's "stopped"
            // On a thread of its own: a send that blocks holds that thread, not the test's, and
            // the check fails at its deadline instead of hanging.
            let flood = OwnThread { () -> TransportError? in
                let chunk = [UInt8](repeating: UInt8(ascii: "z"), count: 64 << 10)
                var sent = 0
                // 1 GiB at most: a transport that buffers all of it has no bound.
                while sent < 1 << 30 && events.closeEvent == nil {
                    do throws(TransportError) {
                        try connection.send(text: chunk)
                        sent += chunk.count
                    } catch {
                        return error
                    }
                    if sent % (4 << 20) == 0 { usleep(1000) }
                }
                return nil
            }
            try await waitUntil("send returned each time (a send that blocks never does)", timeout: .seconds(120)) {
                flood.isFinished
            }
            let refusal = try await flood.value
            if let refusal {
                try expect(
                    refusal.code == .backpressure || refusal.code == .notOpen,
                    "a full queue throws backpressure, got \(refusal.code.rawValue)")
            } else {
                try expect(events.closeEvent != nil, "1 GiB was queued for a peer that does not read")
            }
            connection.abort()
            _ = try await events.closed()
        },
        Check(name: "the same transport connects again after connections end") { transport, peer in
            for round in 0..<5 {
                let events = Events()
                let connection = try transport.connect(to: peer.url, handler: events.handler)
                try connection.send(text: Array("echo round \(round)".utf8))
                try await events.waitForTexts(1)
                try expect(events.texts == [Array("echo round \(round)".utf8)], "round \(round) got \(events.texts)")
                try expect(connection.isOpen, "round \(round): isOpen is false on an open connection")
                if round.isMultiple(of: 2) { connection.close(code: 1000, reason: "") } else { connection.abort() }
                _ = try await events.closed()
            }
        },
    ]

    /// What a `wss://` transport must refuse, run with the certificates it trusts (`tls`): a
    /// server whose certificate another authority signed, and one whose certificate names
    /// another host. A transport that checks nothing passes every other check.
    public static let tlsChecks: [Check] = [
        Check(name: "a server certificate from an authority it does not trust is refused") { transport, _ in
            let stranger = try await onOwnThread { try TestCertificates() }
            let close = try await firstClose(of: transport, at: try Peer(tls: stranger))
            try expect(close.failedToConnect, "a server of an untrusted authority was not refused: \(close)")
        },
        Check(name: "a server certificate for another name is refused") { transport, peer in
            let trusted = try require_(peer.certificates, "run the TLS checks with certificates")
            let elsewhere = try await onOwnThread {
                try TestCertificates(names: "DNS:elsewhere.example", signedBy: trusted)
            }
            let impostor = try Peer(tls: elsewhere)
            let close = try await firstClose(of: transport, at: impostor)
            try expect(close.failedToConnect, "a certificate for elsewhere.example was taken for 127.0.0.1: \(close)")
        },
    ]

    /// Connects to `peer`, sends a message, and returns how the connection ended (the peer is
    /// stopped then).
    private static func firstClose(of transport: any WebSocketTransport, at peer: Peer) async throws
        -> TransportClose
    {
        let events = Events()
        do {
            let connection = try transport.connect(to: peer.url, handler: events.handler)
            try? connection.send(text: Array("echo secret".utf8))
            try await waitUntil("the connection ended or carried a message", timeout: .seconds(60)) {
                events.closeEvent != nil || !events.texts.isEmpty || !peer.received.isEmpty
            }
            try expect(events.texts.isEmpty && peer.received.isEmpty, "messages crossed a connection it should refuse")
            connection.abort()
            let close = try await events.closed()
            await peer.stop()
            return close
        } catch {
            await peer.stop()
            throw error
        }
    }

    // MARK: - The server the checks talk to

    /// A WebSocket server with a small command language: `echo TEXT` answers `echo TEXT`,
    /// `big N` answers N bytes of `x`, `close CODE REASON` closes, `stop-reading` answers
    /// `stopped` and reads no more.
    fileprivate final class Peer: Sendable {
        private let server: WebSocketServer
        private let commands = Commands()

        let certificates: TestCertificates?

        init(tls: TestCertificates? = nil) throws {
            var configuration = WebSocketConfiguration()
            configuration.maxMessageBytes = 4 << 20
            configuration.tlsCertificate = tls?.certificate.path
            configuration.tlsPrivateKey = tls?.privateKey.path
            certificates = tls
            server = try WebSocketServer(port: 0, configuration: configuration, delegate: commands)
        }

        var scheme: String { certificates == nil ? "ws" : "wss" }
        var url: String { "\(scheme)://127.0.0.1:\(server.port)" }
        var received: [String] { commands.state.withLock { $0.received } }
        var closes: [WebSocketCloseEvent] { commands.state.withLock { $0.closes } }

        func stop() async { await server.shutdown() }
    }

    private final class Commands: WebSocketDelegate {
        struct State {
            var received: [String] = []
            var closes: [WebSocketCloseEvent] = []
        }

        let state = Mutex(State())

        func webSocketDidOpen(_ connection: WebSocketConnection) {}

        func webSocket(_ connection: WebSocketConnection, didReceive message: WebSocketMessage) {
            let text = message.text
            let (command, rest) =
                text.firstIndex(of: " ").map { (String(text[..<$0]), String(text[text.index(after: $0)...])) }
                ?? (text, "")
            switch command {
            case "echo":
                if rest.count < 100 { state.withLock { $0.received.append(text) } }
                try? connection.send(text: text)
            case "big":
                try? connection.send(
                    OutboundMessage(text: [UInt8](repeating: UInt8(ascii: "x"), count: Int(rest) ?? 0)))
            case "close":
                let parts = rest.split(separator: " ", maxSplits: 1)
                connection.close(
                    code: WebSocketCloseCode(rawValue: UInt16(parts.first ?? "") ?? 1000),
                    reason: parts.count > 1 ? String(parts[1]) : "")
            case "stop-reading":
                try? connection.send(text: "stopped")
                connection.pauseReceiving()
            default:
                connection.close(code: .policyViolation, reason: "unknown command \(command)")
            }
        }

        func webSocket(_ connection: WebSocketConnection, didCloseWith event: WebSocketCloseEvent) {
            state.withLock { $0.closes.append(event) }
        }
    }

    // MARK: - What the transport reported

    private final class Events: Sendable {
        private struct State {
            var texts: [[UInt8]] = []
            var closes: [TransportClose] = []
            var afterClose = 0
        }

        private let state = Mutex(State())

        var handler: @Sendable (TransportEvent) -> Void {
            { [self] event in
                state.withLock { state in
                    if !state.closes.isEmpty { state.afterClose += 1 }
                    switch event {
                    case .text(let bytes): state.texts.append(bytes)
                    case .closed(let close): state.closes.append(close)
                    }
                }
            }
        }

        var texts: [[UInt8]] { state.withLock { $0.texts } }
        var closeEvent: TransportClose? { state.withLock { $0.closes.first } }

        func waitForTexts(_ count: Int) async throws {
            try await waitUntil("\(count) messages arrived", timeout: .seconds(60)) {
                let (have, closed) = state.withLock { ($0.texts.count, $0.closes.first) }
                if let closed, have < count {
                    throw TransportConformanceFailure("closed (\(closed)) after \(have) of \(count) messages")
                }
                return have >= count
            }
        }

        func closed() async throws -> TransportClose {
            try await waitUntil("the connection reported its end", timeout: .seconds(60)) { closeEvent != nil }
            return closeEvent!
        }

        /// Exactly one `.closed`, nothing after it (checked after a short while).
        func expectNothingAfterClose() async throws {
            try await Task.sleep(for: .milliseconds(100))
            let (closes, after) = state.withLock { ($0.closes.count, $0.afterClose) }
            try expect(closes == 1 && after == 0, "\(closes) closed events and \(after) events after the first")
        }
    }
}

/// What a transport did that the conformance suite does not allow.
public struct TransportConformanceFailure: Error, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}

private func expect(_ condition: Bool, _ message: @autoclosure () -> String) throws {
    if !condition { throw TransportConformanceFailure(message()) }
}

private func require_<T>(_ value: T?, _ message: @autoclosure () -> String) throws -> T {
    guard let value else { throw TransportConformanceFailure(message()) }
    return value
}
