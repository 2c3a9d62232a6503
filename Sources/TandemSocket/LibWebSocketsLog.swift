import CLibWebSockets
import Logging
import Synchronization

/// Routes libwebsockets' own log lines to swift-log.
///
/// libwebsockets has one process-wide log sink (`lws_set_log_level`), so the logger of the
/// most recently created loop receives them. Only errors and warnings are enabled: lws's
/// notice and info levels describe every connection and would drown an application's log.
enum LibWebSocketsLog {
    private static let logger = Mutex<Logger?>(nil)

    static func route(to logger: Logger) {
        let first = self.logger.withLock { current in
            defer { current = logger }
            return current == nil
        }
        if first {
            lws_set_log_level(Int32(LLL_ERR | LLL_WARN), tandemLWSLogEmit)
        }
    }

    fileprivate static func emit(level: Int32, line: String) {
        guard let logger = logger.withLock({ $0 }) else { return }
        let text = Self.stripTimestamp(line)
        if level & Int32(LLL_ERR) != 0 {
            logger.error("\(text)", metadata: ["tandem.source": "libwebsockets"])
        } else {
            logger.warning("\(text)", metadata: ["tandem.source": "libwebsockets"])
        }
    }

    /// lws lines look like `[2026/11/21 10:00:00:1234] W: message\n`.
    private static func stripTimestamp(_ line: String) -> Substring {
        var text = Substring(line)
        if text.hasPrefix("["), let end = text.firstIndex(of: "]") {
            text = text[text.index(after: end)...]
        }
        text = text.drop(while: { $0 == " " })
        if text.hasPrefix("E: ") || text.hasPrefix("W: ") { text = text.dropFirst(3) }
        while text.last == "\n" || text.last == " " { text = text.dropLast() }
        return text
    }
}

private func tandemLWSLogEmit(_ level: Int32, _ line: UnsafePointer<CChar>?) {
    guard let line else { return }
    LibWebSocketsLog.emit(level: level, line: String(cString: line))
}
