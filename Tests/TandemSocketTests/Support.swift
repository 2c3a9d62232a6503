import Foundation
import Synchronization
import TandemSocket
import TandemHarness
import TandemSocketTesting

/// Records every event of the connections it is delegate of.
final class Recorder: WebSocketDelegate {
    enum Event: Sendable {
        case open(UInt64)
        case message(UInt64, WebSocketMessage)
        case drained(UInt64)
        case closed(UInt64, WebSocketCloseEvent)
    }

    let events = Mutex<[Event]>([])
    /// The connections that opened, by id (server side: the accepted ones).
    let connections = Mutex<[UInt64: WebSocketConnection]>([:])
    /// When set, every text message is sent back (an echo server).
    let echo: Bool

    init(echo: Bool = false) { self.echo = echo }

    func webSocketDidOpen(_ connection: WebSocketConnection) {
        connections.withLock { $0[connection.id] = connection }
        events.withLock { $0.append(.open(connection.id)) }
    }

    func webSocket(_ connection: WebSocketConnection, didReceive message: WebSocketMessage) {
        events.withLock { $0.append(.message(connection.id, message)) }
        if echo {
            try? connection.send(
                message.kind == .text ? OutboundMessage(text: message.bytes) : OutboundMessage(binary: message.bytes))
        }
    }

    func webSocketDidDrain(_ connection: WebSocketConnection) {
        events.withLock { $0.append(.drained(connection.id)) }
    }

    func webSocket(_ connection: WebSocketConnection, didCloseWith event: WebSocketCloseEvent) {
        events.withLock { $0.append(.closed(connection.id, event)) }
    }

    var texts: [String] {
        events.withLock { events in
            events.compactMap { if case .message(_, let m) = $0, m.kind == .text { m.text } else { nil } }
        }
    }

    var opened: Int { events.withLock { $0.filter { if case .open = $0 { true } else { false } }.count } }

    var closes: [WebSocketCloseEvent] {
        events.withLock { $0.compactMap { if case .closed(_, let e) = $0 { e } else { nil } } }
    }
}

/// The names of this process's threads (Linux: /proc/self/task/*/comm).
func threadNames() -> Set<String> {
    let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/task")) ?? []
    return Set(
        tasks.compactMap { task in
            (try? String(contentsOfFile: "/proc/self/task/\(task)/comm", encoding: .utf8))?
                .trimmingCharacters(in: .whitespacesAndNewlines)
        })
}

/// Echoes text messages, except "stall", which stops the service thread (the callback's
/// thread) for `stall` before `resumed` is signalled: a process that stopped, as the loop sees it.
final class Staller: WebSocketDelegate {
    let stall: Duration
    let resumed = DispatchSemaphore(value: 0)

    init(stall: Duration) { self.stall = stall }

    func webSocketDidOpen(_ connection: WebSocketConnection) {}

    func webSocket(_ connection: WebSocketConnection, didReceive message: WebSocketMessage) {
        guard message.text == "stall" else {
            try? connection.send(text: message.text)
            return
        }
        Thread.sleep(forTimeInterval: Double(stall.components.seconds))
        resumed.signal()
    }

    func webSocket(_ connection: WebSocketConnection, didCloseWith event: WebSocketCloseEvent) {}
}

/// Stamps on the service thread, where the keepalive runs, when each connection's last message
/// arrived and when it closed; answers "feed me" with `reply` bytes.
final class Timeline: WebSocketDelegate {
    struct Entry {
        var lastMessage: ContinuousClock.Instant?
        var closed: (at: ContinuousClock.Instant, event: WebSocketCloseEvent)?
        /// From the last message to the close, once both are known.
        var silence: Duration? {
            guard let lastMessage, let closed else { return nil }
            return closed.at - lastMessage
        }
    }

    let reply: String
    let entries = Mutex<[UInt64: Entry]>([:])

    init(reply: String) { self.reply = reply }

    func webSocketDidOpen(_ connection: WebSocketConnection) {}

    func webSocket(_ connection: WebSocketConnection, didReceive message: WebSocketMessage) {
        let now = ContinuousClock.now
        entries.withLock { $0[connection.id, default: Entry()].lastMessage = now }
        if message.text == "feed me" { try? connection.send(text: reply) }
    }

    func webSocket(_ connection: WebSocketConnection, didCloseWith event: WebSocketCloseEvent) {
        let now = ContinuousClock.now
        entries.withLock { $0[connection.id, default: Entry()].closed = (now, event) }
    }
}
