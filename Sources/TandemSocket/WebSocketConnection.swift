import CLibWebSockets
import Dispatch
#if canImport(Glibc)
    import Glibc
#endif
import Synchronization

/// One WebSocket connection, server side or client side.
///
/// `send`, `close`, `pauseReceiving` and `notifyWhenDrained` may be called from any thread: they
/// queue the request under a lock and wake the event loop with `lws_cancel_service`, because
/// libwebsockets itself must only be called from the thread that services its context. The
/// actual `lws_write` happens on that thread, when libwebsockets reports the socket writable.
///
/// A client connection to a plain `ws://` URL reads and writes its frames itself, on a raw
/// libwebsockets socket (``ClientFraming``, ``RawClient``), unless
/// ``WebSocketConfiguration/ownClientFraming`` is false; servers and `wss://` clients use
/// libwebsockets' WebSocket role.
///
/// Outgoing messages wait in a bounded queue: a peer that stops reading is closed with 1008
/// once ``WebSocketConfiguration/maxQueuedBytes`` are waiting, instead of growing memory.
///
/// For example:
///
/// ```swift
/// let connection = try client.connect(to: "ws://127.0.0.1:7878/", delegate: self)
/// try connection.send(text: #"{"type":"hello","protocol":1,"clientId":"device-1"}"#)
/// ```
public final class WebSocketConnection: @unchecked Sendable, Hashable, CustomStringConvertible {
    /// A number unique among the connections of this process.
    public let id: UInt64
    /// The peer's address (server side) or the URL connected to (client side).
    public let peer: String

    let loop: ServiceLoop
    private let maxQueuedBytes: Int
    private let maxMessageBytes: Int
    private let idleTimeout: Duration
    private let pingInterval: Duration
    private let stallTimeout: Duration

    /// State shared between the caller's threads and the service thread.
    private let state = Mutex(SharedState())

    // The properties below are owned by the loop's service thread: they are set before the
    // connection is handed to the loop (published through the loop's lock) and afterwards read
    // and written only from libwebsockets callbacks.
    nonisolated(unsafe) var wsi: OpaquePointer?
    nonisolated(unsafe) var delegate: (any WebSocketDelegate)?
    nonisolated(unsafe) var connectTarget: ConnectTarget?
    nonisolated(unsafe) private var receiveBuffer: [UInt8] = []
    nonisolated(unsafe) private var receiveKind: WebSocketMessage.Kind = .text
    nonisolated(unsafe) private var closeCause: WebSocketCloseEvent?
    nonisolated(unsafe) private var closeDelivered = false
    /// When the peer last sent anything.
    nonisolated(unsafe) private var lastReceive = ContinuousClock.now
    /// When the keepalive last saw the peer taking a backlog from this side (see
    /// ``keepAlive(_:now:)``): it holds off the idle close, not the pings.
    nonisolated(unsafe) private var lastDrained = ContinuousClock.now
    /// When the keepalive last saw the peer take anything of a backlog waiting for it, or no
    /// backlog waiting: past ``WebSocketConfiguration/stallTimeout`` the peer stopped reading.
    nonisolated(unsafe) private var lastTaken = ContinuousClock.now
    /// A close was decided while reading: what the peer sends from now on is dropped.
    nonisolated(unsafe) private var discardingInput = false
    /// The close frame was handed to libwebsockets: nothing more may be written.
    nonisolated(unsafe) private var closeHanded = false
    /// A keepalive ping is to be written at the next writable callback.
    nonisolated(unsafe) private var pingWanted = false
    nonisolated(unsafe) private var lastPing = ContinuousClock.now
    /// The peer's TCP acknowledgements at the last keepalive tick (see ``keepAlive(_:now:)``).
    nonisolated(unsafe) private var bytesAcknowledged: UInt64 = 0
    /// A plain `ws://` client connection's own WebSocket engine (see ``ClientFraming``), on a
    /// raw libwebsockets connection; nil on libwebsockets' WebSocket role (servers, `wss://`).
    nonisolated(unsafe) var rawClient: RawClient?
    /// When the keepalive looks at this connection next: the loop's sweep
    /// (``ServiceLoop/sweepKeepAlive()``) takes every connection whose time has come.
    nonisolated(unsafe) private(set) var nextKeepAlive = ContinuousClock.now

    private struct SharedState {
        var phase: Phase = .connecting
        var outbound = FIFO<OutboundMessage>()
        var queuedBytes = 0
        var closeRequest: CloseRequest?
        var receivingPaused = false
        var appliedReceivingPaused = false
        var drainThreshold: Int?
        var awaitingAttention = false
        var userData: (any Sendable)?
    }

    enum Phase { case connecting, open, closing, closed }

    private struct CloseRequest {
        var code: WebSocketCloseCode
        var reason: String
        /// Close without waiting for a writable callback, which a peer that stopped reading
        /// never gives.
        var immediate = false
    }

    /// The state of a client connection that frames its own messages (service thread).
    struct RawClient {
        /// The upgrade request (after the headroom ``OutboundMessage/headroom``), until it is
        /// written.
        var request: [UInt8]?
        let key: String
        /// The server's answer to the upgrade so far, until it is whole.
        var answer: [UInt8] = []
        var open = false
        var reader: ServerFrameReader
        /// The pong owed to the server's latest ping, written before anything else (RFC 6455
        /// §5.5.3 allows answering the latest only, which keeps this bounded).
        var pong: [UInt8]?
        /// Once the close frame is written the connection ends at once, instead of waiting
        /// for the server's answer: it answers the server's close, or what the server sent
        /// broke the protocol and cannot be read further.
        var endsAfterClose = false
        /// Why the upgrade failed, for the report.
        var failure: String?

        init(target: ConnectTarget, maxMessageBytes: Int) {
            key = ClientFraming.newKey()
            request =
                [UInt8](repeating: 0, count: OutboundMessage.headroom)
                + ClientFraming.upgradeRequest(path: target.path, host: "\(target.host):\(target.port)", key: key)
            reader = ServerFrameReader(maxMessageBytes: maxMessageBytes)
        }
    }

    /// Where a client connection goes, kept alive until libwebsockets has copied it.
    struct ConnectTarget {
        var host: String
        var port: Int
        var path: String
        var useTLS: Bool
    }

    private static let nextID = Atomic<UInt64>(1)

    init(
        loop: ServiceLoop, peer: String, delegate: any WebSocketDelegate, configuration: WebSocketConfiguration
    ) {
        self.id = Self.nextID.wrappingAdd(1, ordering: .relaxed).oldValue
        self.loop = loop
        self.peer = peer
        self.delegate = delegate
        self.maxQueuedBytes = configuration.maxQueuedBytes
        self.maxMessageBytes = configuration.maxMessageBytes
        self.idleTimeout = .seconds(Int(max(configuration.idleTimeout, configuration.pingInterval + 1)))
        self.pingInterval = .seconds(Int(configuration.pingInterval))
        self.stallTimeout = .seconds(Int(max(configuration.stallTimeout, 1)))
    }

    public static func == (lhs: WebSocketConnection, rhs: WebSocketConnection) -> Bool { lhs === rhs }
    public func hash(into hasher: inout Hasher) { hasher.combine(ObjectIdentifier(self)) }
    public var description: String { "WebSocketConnection(\(id), \(peer))" }

    // MARK: - Public API, any thread

    /// Whatever the owner wants to find again in a delegate callback (the server keeps its
    /// session for the connection here).
    public var userData: (any Sendable)? {
        get { state.withLock { $0.userData } }
        set { state.withLock { $0.userData = newValue } }
    }

    /// True once the handshake completed and until a close began.
    public var isOpen: Bool { state.withLock { $0.phase == .open } }

    /// Bytes waiting in the send queue.
    public var queuedBytes: Int { state.withLock { $0.queuedBytes } }

    /// Queues a message for sending.
    ///
    /// Messages sent while the client handshake is still running are sent once it completes.
    ///
    /// - Throws: ``WebSocketError`` `.notOpen` once the connection is closing or closed;
    ///   `.sendQueueOverflow` when the queue was full, in which case the connection is being
    ///   closed with 1008 and everything queued is dropped.
    public func send(_ message: OutboundMessage) throws(WebSocketError) {
        let (wake, overflowed): (Bool, Bool) = try state.withLock { (s) throws(WebSocketError) in
            guard s.phase == .open || s.phase == .connecting else {
                throw WebSocketError(.notOpen, "the connection to \(peer) is closed")
            }
            if s.queuedBytes > 0 && s.queuedBytes + message.count > maxQueuedBytes {
                s.outbound.removeAll()
                s.queuedBytes = 0
                s.phase = .closing
                s.closeRequest = CloseRequest(
                    code: .policyViolation,
                    reason: "send queue overflow: the peer reads too slowly; reconnect and resume", immediate: true)
                return (Self.claimAttention(&s), true)
            }
            s.outbound.append(message)
            s.queuedBytes += message.count
            return (Self.claimAttention(&s), false)
        }
        if wake { loop.needsAttention(self) }
        if overflowed {
            throw WebSocketError(.sendQueueOverflow, "the send queue to \(peer) overflowed; the connection was closed")
        }
    }

    /// Queues a text message.
    public func send(text: String) throws(WebSocketError) {
        try send(OutboundMessage(text: text))
    }

    /// Sends what is queued, then closes with `code` and `reason`.
    ///
    /// The reason is cut to 123 bytes, the most a close frame can carry.
    public func close(code: WebSocketCloseCode = .normal, reason: String = "") {
        let wake = state.withLock { s -> Bool in
            guard s.phase == .open || s.phase == .connecting else { return false }
            s.phase = .closing
            s.closeRequest = CloseRequest(code: code, reason: reason)
            return Self.claimAttention(&s)
        }
        if wake { loop.needsAttention(self) }
    }

    /// Drops what is queued and closes at once with `code` and `reason`.
    public func abort(code: WebSocketCloseCode, reason: String) {
        let wake = state.withLock { s -> Bool in
            guard s.phase == .open || s.phase == .connecting else { return false }
            s.outbound.removeAll()
            s.queuedBytes = 0
            s.phase = .closing
            s.closeRequest = CloseRequest(code: code, reason: reason, immediate: true)
            return Self.claimAttention(&s)
        }
        if wake { loop.needsAttention(self) }
    }

    /// Stops reading from the socket (`lws_rx_flow_control`), so that a peer sending faster
    /// than its messages are handled is slowed down by TCP instead of filling memory.
    public func pauseReceiving() { setReceivingPaused(true) }

    /// Resumes reading after ``pauseReceiving()``.
    public func resumeReceiving() { setReceivingPaused(false) }

    /// Asks for one ``WebSocketDelegate/webSocketDidDrain(_:)`` call once the send queue holds
    /// at most `threshold` bytes.
    ///
    /// - Returns: false when the queue is already that small (no call will come), true when
    ///   the call is scheduled.
    public func notifyWhenDrained(below threshold: Int) -> Bool {
        state.withLock { s in
            guard s.phase == .open, s.queuedBytes > threshold else { return false }
            s.drainThreshold = threshold
            return true
        }
    }

    private func setReceivingPaused(_ paused: Bool) {
        let wake = state.withLock { s -> Bool in
            guard s.receivingPaused != paused else { return false }
            s.receivingPaused = paused
            return Self.claimAttention(&s)
        }
        if wake { loop.needsAttention(self) }
    }

    /// Marks the connection as waiting in the loop's attention list; true if it was not yet.
    private static func claimAttention(_ s: inout SharedState) -> Bool {
        if s.awaitingAttention { return false }
        s.awaitingAttention = true
        return true
    }

    // MARK: - Service thread

    /// Applies what callers asked for since the last wake-up.
    ///
    /// The attention flag is cleared even before the handshake completes: what was asked for
    /// then is applied by ``didOpen(_:)``, and a later request must be able to wake the loop.
    func attend() {
        loop.assertServiceThread()
        let wsi = self.wsi
        let (flow, wantsWrite, immediateClose) = state.withLock { s -> (Bool?, Bool, CloseRequest?) in
            s.awaitingAttention = false
            guard wsi != nil else { return (nil, false, nil) }
            let immediate = s.closeRequest.flatMap { $0.immediate ? $0 : nil }
            return (Self.takeFlowChange(&s), !s.outbound.isEmpty || s.closeRequest != nil, immediate)
        }
        guard let wsi else { return }
        if let immediateClose, !closeHanded {
            closeCause = WebSocketCloseEvent(code: immediateClose.code, reason: immediateClose.reason)
            closeAtOnce(wsi, immediateClose)
            return
        }
        if let flow { lws_rx_flow_control(wsi, flow ? 1 : 0) }
        if wantsWrite { lws_callback_on_writable(wsi) }
    }

    /// Closes without waiting for the peer to read: a peer that stopped reading (a send queue
    /// overflow) never lets the socket become writable, and a close that waits for it never
    /// comes.
    ///
    /// The close frame is written straight into the socket's buffer (`lws_write` with
    /// `LWS_WRITE_CLOSE`, whose value 4 libwebsockets 4.1 keeps private; a raw client's own
    /// frame) when libwebsockets holds no part of an earlier message; the kernel delivers it after what is queued, and a
    /// peer that reads late still finds the status. What the peer sent and nobody read is
    /// drained first, so that the close ends in FIN, not RST (an RST can make the peer discard
    /// what it has not read yet). Then libwebsockets drops the connection. When it does hold
    /// part of a message, the close goes out from the next writable callback if the peer reads
    /// within 3 seconds; otherwise the connection is dropped without it.
    private func closeAtOnce(_ wsi: OpaquePointer, _ request: CloseRequest) {
        closeHanded = true
        guard lws_partial_buffered(wsi) == 0 else {
            // The close frame cannot cut into the message under way: it follows it if the peer
            // reads within a few seconds; otherwise the connection is dropped without it.
            closeHanded = false
            lws_callback_on_writable(wsi)
            lws_set_timeout(wsi, PENDING_TIMEOUT_USER_OK, 3)
            return
        }
        writeCloseFrame(wsi, request.code, request.reason)
        // Then the connection lingers for two seconds, reading and dropping what the peer still
        // sends, so that it gets the close and a FIN rather than a reset (which would also
        // throw away what it has not read yet): on plain TCP the write side is shut now, so
        // that a peer reading finds the end after the close frame; reading goes on whatever
        // paused it. A peer that goes on sending past that gets its reset.
        discardingInput = true
        if lws_is_ssl(wsi) == 0 { shutdown(lws_get_socket_fd(wsi), Int32(SHUT_WR)) }
        lws_rx_flow_control(wsi, 1 | Int32(LWS_RXFLOW_REASON_FLAG_PROCESS_NOW))
        lws_set_timeout(wsi, PENDING_TIMEOUT_CLOSE_ACK, 2)
    }

    /// Writes a close frame now: libwebsockets' own (`lws_write` with `LWS_WRITE_CLOSE`, whose
    /// value 4 libwebsockets 4.1 keeps private), or a raw client's.
    private func writeCloseFrame(_ wsi: OpaquePointer, _ code: WebSocketCloseCode, _ reason: String) {
        var frame = [UInt8](repeating: 0, count: OutboundMessage.headroom)
        frame += [UInt8(code.rawValue >> 8), UInt8(code.rawValue & 0xFF)]
        frame += Array(reason.utf8.prefix(123))
        if rawClient != nil {
            _ = writeRaw(wsi, &frame, opcode: ClientFraming.close)
            return
        }
        let count = frame.count - OutboundMessage.headroom
        _ = frame.withUnsafeMutableBufferPointer { buffer in
            lws_write(wsi, buffer.baseAddress! + OutboundMessage.headroom, count, lws_write_protocol(rawValue: 4))
        }
    }

    /// Frames the payload of `storage` (after its headroom) as a client frame and writes it on
    /// the raw connection: false when the write failed. What the socket does not take,
    /// libwebsockets keeps, in order behind what it already keeps, and sends first; behind such
    /// a backlog it answers with the count of the older bytes it sent, not this frame's, so
    /// only a negative answer is a failure. `LWS_WRITE_HTTP` is what the C header's
    /// `LWS_WRITE_RAW`, a macro Swift does not import, stands for.
    private func writeRaw(_ wsi: OpaquePointer, _ storage: inout [UInt8], opcode: UInt8) -> Bool {
        let start = ClientFraming.frame(&storage, headroom: OutboundMessage.headroom, opcode: opcode)
        let count = storage.count - start
        let written = storage.withUnsafeMutableBufferPointer { buffer in
            lws_write(wsi, buffer.baseAddress! + start, count, LWS_WRITE_HTTP)
        }
        return written >= 0
    }

    /// Has the close frame with `code` and `reason` sent with the close that follows (the
    /// caller returns -1): libwebsockets sends it; a raw client writes it now.
    private func setCloseReason(_ wsi: OpaquePointer, _ code: WebSocketCloseCode, _ reason: String) {
        if rawClient != nil {
            // Only when libwebsockets holds no unsent bytes: a raw connection is closed without
            // flushing them, and a frame behind them would go too.
            if lws_partial_buffered(wsi) == 0 { writeCloseFrame(wsi, code, reason) }
            return
        }
        var bytes = Array(reason.utf8.prefix(123))
        bytes.withUnsafeMutableBufferPointer { buffer in
            lws_close_reason(wsi, lws_close_status(rawValue: UInt32(code.rawValue)), buffer.baseAddress, buffer.count)
        }
    }

    func didOpen(_ wsi: OpaquePointer) {
        self.wsi = wsi
        lastReceive = ContinuousClock.now
        bytesAcknowledged = UInt64(tandem_tcp_bytes_acked(lws_get_socket_fd(wsi)))
        nextKeepAlive = lastReceive + pingInterval
        loop.keepAliveDue(at: nextKeepAlive)
        let (flow, wantsWrite) = state.withLock { s -> (Bool?, Bool) in
            if s.phase == .connecting { s.phase = .open }
            return (Self.takeFlowChange(&s), !s.outbound.isEmpty || s.closeRequest != nil)
        }
        if let flow { lws_rx_flow_control(wsi, flow ? 1 : 0) }
        delegate?.webSocketDidOpen(self)
        if wantsWrite { lws_callback_on_writable(wsi) }
    }

    /// The receive flow-control state to apply, if it changed since it was last applied.
    private static func takeFlowChange(_ s: inout SharedState) -> Bool? {
        guard s.receivingPaused != s.appliedReceivingPaused else { return nil }
        s.appliedReceivingPaused = s.receivingPaused
        return !s.receivingPaused
    }

    /// Writes queued messages while the socket takes them. Returns -1 to have libwebsockets
    /// close the connection (after a requested close frame was set up); a raw client's close
    /// returns 0 and waits for the server's answer (``closeRaw(_:_:)``).
    func writable() -> Int32 {
        loop.assertServiceThread()
        guard let wsi else { return -1 }
        // Waiting for the peer's answer to our close: libwebsockets still calls, nothing may go.
        if closeHanded { return 0 }
        if let pong = rawClient?.pong {
            rawClient?.pong = nil
            var frame = [UInt8](repeating: 0, count: OutboundMessage.headroom) + pong
            if !writeRaw(wsi, &frame, opcode: ClientFraming.pong) { return -1 }
            if lws_send_pipe_choked(wsi) != 0 {
                lws_callback_on_writable(wsi)
                return 0
            }
        }
        if pingWanted {
            // A payload, so that the pong reaches LWS_CALLBACK_RECEIVE_PONG (libwebsockets does
            // not report empty pongs); ASCII, because a libwebsockets peer that validates UTF-8
            // checks control frames too, and closes with 1007 on binary bytes.
            pingWanted = false
            var frame = [UInt8](repeating: 0, count: OutboundMessage.headroom)
            frame += Array("keepaliv".utf8)
            if rawClient != nil {
                if !writeRaw(wsi, &frame, opcode: ClientFraming.ping) { return -1 }
            } else {
                let written = frame.withUnsafeMutableBufferPointer { buffer in
                    lws_write(wsi, buffer.baseAddress! + OutboundMessage.headroom, 8, LWS_WRITE_PING)
                }
                if written < 8 { return -1 }
            }
            if lws_send_pipe_choked(wsi) != 0 {
                lws_callback_on_writable(wsi)
                return 0
            }
        }
        var written = 0
        var drained = false
        while true {
            // Whether the socket takes more is asked only when more waits (a message, or a
            // close, which goes out once what came before it has): libwebsockets answers with a
            // `poll()` of the socket, a system call that, in a fan-out of one message per
            // connection, came once per send and took half as long as the send.
            if written > 0 && state.withLock({ !$0.outbound.isEmpty || $0.closeRequest != nil })
                && lws_send_pipe_choked(wsi) != 0
            {
                lws_callback_on_writable(wsi)
                break
            }
            enum Next { case message(OutboundMessage), close(CloseRequest), idle }
            let next = state.withLock { s -> Next in
                if let message = s.outbound.popFirst() {
                    s.queuedBytes -= message.count
                    if let threshold = s.drainThreshold, s.queuedBytes <= threshold {
                        s.drainThreshold = nil
                        drained = true
                    }
                    return .message(message)
                }
                if let request = s.closeRequest { return .close(request) }
                return .idle
            }
            switch next {
            case .message(var message):
                let complete: Bool
                if rawClient != nil {
                    complete = writeRaw(
                        wsi, &message.storage, opcode: message.isBinary ? ClientFraming.binary : ClientFraming.text)
                } else {
                    let protocolKind = message.isBinary ? LWS_WRITE_BINARY : LWS_WRITE_TEXT
                    let count = message.count
                    complete =
                        message.storage.withUnsafeMutableBufferPointer { buffer in
                            lws_write(wsi, buffer.baseAddress! + OutboundMessage.headroom, count, protocolKind)
                        } >= count
                }
                if !complete {
                    closeCause = WebSocketCloseEvent(code: .abnormal, reason: "write to \(peer) failed")
                    return -1
                }
                written += 1
            case .close(let request):
                if rawClient != nil {
                    // The server's close (or the failure that made this one) stays the cause.
                    if closeCause == nil {
                        closeCause = WebSocketCloseEvent(code: request.code, reason: request.reason)
                    }
                    return closeRaw(wsi, request)
                }
                closeCause = WebSocketCloseEvent(code: request.code, reason: request.reason)
                setCloseReason(wsi, request.code, request.reason)
                closeHanded = true
                // libwebsockets reads (and drops) what the peer sends until its answer to the close
                // comes, for up to 5 s, but only when reading is on: a connection paused for having
                // too much unhandled input would leave it unread, and the kernel would answer the
                // close with a reset. PROCESS_NOW applies it though the callback returns -1.
                lws_rx_flow_control(wsi, 1 | Int32(LWS_RXFLOW_REASON_FLAG_PROCESS_NOW))
                return -1
            case .idle:
                if drained { delegate?.webSocketDidDrain(self) }
                return 0
            }
            if written == 64 {
                lws_callback_on_writable(wsi)
                break
            }
        }
        if drained { delegate?.webSocketDidDrain(self) }
        return 0
    }

    /// Adds a received fragment; delivers the message once it is complete.
    ///
    /// Anything received counts as a sign of life for the idle timeout (see ``keepAlive(_:now:)``).
    ///
    /// A message over the limit is closed with 1009 as soon as a frame *announces* more than
    /// the limit, not once that much arrived. The close is never decided by returning -1 here:
    /// libwebsockets would drop the rest of its read buffer, lose its place in the stream and
    /// end the connection without the close frame. Instead the connection stops reading what
    /// follows and closes from its next writable callback.
    func received(_ wsi: OpaquePointer, _ input: UnsafeMutableRawPointer?, _ length: Int) -> Int32 {
        lastReceive = ContinuousClock.now
        if discardingInput { return 0 }
        if lws_is_first_fragment(wsi) != 0 {
            receiveBuffer.removeAll(keepingCapacity: receiveBuffer.capacity <= 64 << 10)
            receiveKind = lws_frame_is_binary(wsi) != 0 ? .binary : .text
        }
        if receiveBuffer.count + length + Int(lws_remaining_packet_payload(wsi)) > maxMessageBytes {
            receiveBuffer = []
            let reason = "message larger than \(maxMessageBytes) bytes"
            closeCause = WebSocketCloseEvent(code: .messageTooBig, reason: reason)
            closeFromReading(wsi, .messageTooBig, reason)
            return 0
        }
        if let input, length > 0 {
            // Room for the rest of the frame at once: a large message arrives in pieces of a few
            // kilobytes, and growing by doubling copied it into fresh pages several times.
            let needed = receiveBuffer.count + length + Int(lws_remaining_packet_payload(wsi))
            if needed > receiveBuffer.capacity {
                receiveBuffer.reserveCapacity(max(needed, receiveBuffer.capacity * 2))
            }
            receiveBuffer.append(contentsOf: UnsafeRawBufferPointer(start: input, count: length))
        }
        guard lws_is_final_fragment(wsi) != 0, lws_remaining_packet_payload(wsi) == 0 else { return 0 }
        let message = WebSocketMessage(kind: receiveKind, bytes: receiveBuffer)
        if receiveBuffer.capacity > 64 << 10 {
            receiveBuffer = []
        } else {
            receiveBuffer.removeAll(keepingCapacity: true)
        }
        delegate?.webSocket(self, didReceive: message)
        return 0
    }

    /// Records the close frame the peer sent: a 2-byte status, then the reason. A body of one
    /// byte breaks RFC 6455 (§5.5.1: none, or a status of two bytes): that is answered with
    /// 1002, not echoed.
    func peerInitiatedClose(_ wsi: OpaquePointer, _ input: UnsafeMutableRawPointer?, _ length: Int) -> Int32 {
        // The peer's answer to a close of ours: the cause stays ours.
        if closeHanded && closeCause != nil { return 0 }
        if length == 1 {
            let reason = "protocol error: a close frame's body is a 2-byte status and a reason, not 1 byte"
            closeCause = WebSocketCloseEvent(code: .protocolError, reason: reason)
            setCloseReason(wsi, .protocolError, reason)
            return -1
        }
        guard let input, length >= 2 else {
            closeCause = WebSocketCloseEvent(code: .noStatus, reason: "")
            return 0
        }
        let bytes = UnsafeRawBufferPointer(start: input, count: length)
        let code = UInt16(bytes[0]) << 8 | UInt16(bytes[1])
        closeCause = WebSocketCloseEvent(
            code: WebSocketCloseCode(rawValue: code), reason: String(decoding: bytes[2...], as: UTF8.self))
        return 0
    }

    /// A sign of life from the peer that reaches no other callback (a pong).
    func heardFrom() {
        lastReceive = ContinuousClock.now
    }

    /// The service thread stood still for `stall` (see ``ServiceLoop/sweepKeepAlive()``): the
    /// peer's silence in that time is not counted against it.
    func excuse(_ stall: Duration, now: ContinuousClock.Instant) {
        lastReceive = min(lastReceive + stall, now)
        lastDrained = min(lastDrained + stall, now)
        lastTaken = min(lastTaken + stall, now)
    }

    /// The keepalive's look at the connection (service thread, from the loop's sweep).
    ///
    /// After ``WebSocketConfiguration/pingInterval`` without hearing from the peer, a ping;
    /// after ``WebSocketConfiguration/idleTimeout``, a close with 1001. Anything received
    /// counts (libwebsockets' own keepalive counts only pongs, so a client that sends data
    /// and never answers a ping was dropped). A peer whose data is waiting unread in the
    /// socket is alive, whatever the clock says: on a starved machine this thread may come
    /// back to the socket late, and must not hang up on a peer it has not read yet. A peer
    /// still taking a backlog from this side (its TCP stack acknowledged more than a few pings'
    /// worth since the last look, and 16 KB or more still waits for it) is not closed either, though
    /// past the idle timeout: a phone reading a large snapshot on a slow link may see our ping
    /// only behind megabytes of it, and answer it late. Acknowledgements only hold off the
    /// close; the pings go by the peer's frames alone, so a client that went silent after the
    /// welcome and its snapshot is pinged and closed on time, as PROTOCOL.md says. A peer that
    /// stopped reading takes nothing once its window is full; that one is a slow consumer,
    /// closed with 1008.
    ///
    /// - Returns: Whether the connection must close (its idle timeout passed). libwebsockets
    ///   closes a connection only from one of its callbacks, so the loop then fires the
    ///   connection's timer, and ``closeIdle(_:)`` closes it there.
    func keepAlive(_ wsi: OpaquePointer, now: ContinuousClock.Instant) -> Bool {
        loop.assertServiceThread()
        guard !closeHanded else {
            nextKeepAlive = now + pingInterval
            return false
        }
        let socket = lws_get_socket_fd(wsi)
        let acknowledged = UInt64(tandem_tcp_bytes_acked(socket))
        // A backlog (not a message or two in flight) waits for the peer.
        let backlogged =
            Int(tandem_tcp_bytes_unacknowledged(socket)) >= Self.backlog
            || state.withLock { $0.queuedBytes } >= Self.backlog
        // Still taking a backlog from this side: more than a few pings' worth acknowledged since
        // the last look.
        let draining = acknowledged > bytesAcknowledged + 256 && backlogged
        if acknowledged > bytesAcknowledged || !backlogged { lastTaken = now }
        bytesAcknowledged = acknowledged
        if draining { lastDrained = now }
        // (Once: a close that waits for libwebsockets to flush part of a message must not be
        // asked for again, which would put off its timeout each time.)
        if now - lastTaken >= stallTimeout, state.withLock({ $0.phase == .open }) {
            closeStalled(wsi)
            return false
        }
        let silence = now - lastReceive
        let idle = now - max(lastReceive, lastDrained)
        if idle >= idleTimeout && !Self.hasUnreadData(wsi) { return true }
        var next = pingInterval
        if backlogged { next = min(next, max(.milliseconds(100), stallTimeout - (now - lastTaken))) }
        if silence >= pingInterval {
            if now - lastPing >= pingInterval {
                lastPing = now
                pingWanted = true
                lws_callback_on_writable(wsi)
            }
            next = min(next, max(.milliseconds(100), idleTimeout - idle))
        } else {
            next = min(next, pingInterval - silence)
        }
        nextKeepAlive = now + next
        return false
    }

    /// Whether the frame being read announces more than a message may hold (service thread,
    /// from the loop's sweep): libwebsockets calls no one at a frame's header, only once a
    /// payload byte arrives, so a header alone would otherwise wait for the idle timeout.
    func announcesTooMuch(_ wsi: OpaquePointer) -> Bool {
        guard rawClient == nil, !discardingInput, !closeHanded, state.withLock({ $0.phase == .open }) else {
            return false
        }
        return receiveBuffer.count + Int(lws_remaining_packet_payload(wsi)) > maxMessageBytes
    }

    /// Closes with 1009 a connection whose frame announced too much (``announcesTooMuch(_:)``).
    func closeTooBig(_ wsi: OpaquePointer) {
        receiveBuffer = []
        let reason = "message larger than \(maxMessageBytes) bytes"
        closeCause = WebSocketCloseEvent(code: .messageTooBig, reason: reason)
        closeFromReading(wsi, .messageTooBig, reason)
    }

    /// Closes (1008) a connection whose peer took nothing of the backlog waiting for it for
    /// ``WebSocketConfiguration/stallTimeout``: it stopped reading. Everything queued goes; the
    /// peer resumes from its token on a new connection.
    private func closeStalled(_ wsi: OpaquePointer) {
        let request = CloseRequest(
            code: .policyViolation,
            reason: "the peer stopped reading for \(stallTimeout.components.seconds) s; reconnect and resume",
            immediate: true)
        state.withLock { s in
            s.outbound.removeAll()
            s.queuedBytes = 0
            s.phase = .closing
            s.closeRequest = request
        }
        closeCause = WebSocketCloseEvent(code: request.code, reason: request.reason)
        closeAtOnce(wsi, request)
    }

    /// The connection's timer (service thread), which the loop fires once ``keepAlive(_:now:)``
    /// found the idle timeout passed: the close with 1001, unless the peer spoke meanwhile.
    ///
    /// - Returns: -1 to close.
    func closeIdle(_ wsi: OpaquePointer) -> Int32 {
        guard !closeHanded else { return 0 }
        let now = ContinuousClock.now
        guard isIdle(at: now) && !Self.hasUnreadData(wsi) else {
            nextKeepAlive = now
            loop.keepAliveDue(at: now)
            return 0
        }
        let reason = "idle timeout: nothing received for \(idleTimeout.components.seconds) s"
        closeCause = WebSocketCloseEvent(code: .goingAway, reason: reason)
        setCloseReason(wsi, .goingAway, reason)
        closeHanded = true
        return -1
    }

    /// What counts as a backlog still waiting for the peer: more than a few small messages in
    /// flight, which a peer that went silent after them may not have acknowledged yet.
    private static let backlog = 16 << 10

    /// Nothing from the peer, and no backlog taken, for the idle timeout.
    private func isIdle(at now: ContinuousClock.Instant) -> Bool {
        now - max(lastReceive, lastDrained) >= idleTimeout
    }

    private static func hasUnreadData(_ wsi: OpaquePointer) -> Bool {
        var byte: UInt8 = 0
        return recv(lws_get_socket_fd(wsi), &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT)) > 0
    }

    /// libwebsockets is closing the connection on its own, before it decides whether to send
    /// a close frame: it sends one only when a status was set. It closes on its own for a
    /// frame that broke RFC 6455 (a control frame over 125 bytes, a length with its top bit
    /// set), which deserves 1002. A peer that closed the TCP connection, or a close this side
    /// or the peer started, is left as it is.
    func dropping(_ wsi: OpaquePointer) {
        guard closeCause == nil, lws_get_close_length(wsi) == 0 else { return }
        var byte: UInt8 = 0
        let peeked = recv(lws_get_socket_fd(wsi), &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT))
        guard peeked > 0 || (peeked < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) else { return }
        let reason = "protocol error: a frame broke RFC 6455"
        closeCause = WebSocketCloseEvent(code: .protocolError, reason: reason)
        setCloseReason(wsi, .protocolError, reason)
    }

    // MARK: - Raw client connections (plain ws://, see ClientFraming)

    /// Makes this client connection frame its own messages on a raw connection.
    func useRawClient(_ target: ConnectTarget) {
        rawClient = RawClient(target: target, maxMessageBytes: maxMessageBytes)
    }

    /// The TCP connection is up: the upgrade request goes out at the first writable callback,
    /// and the server has 10 s to answer it, as libwebsockets' client gives it.
    func rawConnected(_ wsi: OpaquePointer) {
        lws_set_timeout(wsi, PENDING_TIMEOUT_AWAITING_SERVER_RESPONSE, 10)
        lws_callback_on_writable(wsi)
    }

    /// A raw client's writable callback: the upgrade request, then what ``writable()`` writes.
    func rawWritable(_ wsi: OpaquePointer) -> Int32 {
        guard let raw = rawClient else { return -1 }
        if var request = raw.request {
            rawClient?.request = nil
            let count = request.count - OutboundMessage.headroom
            let written = request.withUnsafeMutableBufferPointer { buffer in
                lws_write(wsi, buffer.baseAddress! + OutboundMessage.headroom, count, LWS_WRITE_HTTP)
            }
            if written < count {
                rawClient?.failure = "could not send the WebSocket upgrade to \(peer)"
                return -1
            }
            return 0
        }
        return raw.open ? writable() : 0
    }

    /// Why a raw client that never opened ended: what was wrong with the upgrade, or that the
    /// server closed or did not answer. Nil once it opened.
    var rawUpgradeFailure: String? {
        guard let rawClient, !rawClient.open else { return nil }
        return rawClient.failure ?? "the server closed the connection, or did not answer, during the WebSocket upgrade"
    }

    /// Bytes from the server: the answer to the upgrade, then frames.
    func rawReceived(_ wsi: OpaquePointer, _ input: UnsafeMutableRawPointer?, _ length: Int) -> Int32 {
        guard let input, length > 0, let raw = rawClient else { return 0 }
        lastReceive = ContinuousClock.now
        let bytes = UnsafeRawBufferPointer(start: input, count: length)
        guard !raw.open else { return readFrames(wsi, bytes, raw.reader) }
        rawClient?.answer.append(contentsOf: bytes)
        let answer = rawClient?.answer ?? []
        guard let end = Self.endOfHead(answer) else {
            if answer.count > 16 << 10 {
                rawClient?.failure = "the server's answer to the WebSocket upgrade is over 16 KB"
                return -1
            }
            return 0
        }
        if let problem = ClientFraming.problem(
            withAnswer: String(decoding: answer[..<end], as: UTF8.self), key: raw.key)
        {
            rawClient?.failure = problem
            return -1
        }
        rawClient?.answer = []
        rawClient?.open = true
        lws_set_timeout(wsi, NO_PENDING_TIMEOUT, 0)
        loop.clientOpened(self, wsi)
        // The server may send frames right behind its answer, in the same read.
        let rest = answer[(end + 4)...]
        guard !rest.isEmpty, self.wsi != nil else { return 0 }
        return Array(rest).withUnsafeBytes { readFrames(wsi, $0, raw.reader) }
    }

    /// Where the blank line that ends an HTTP head begins.
    private static func endOfHead(_ bytes: [UInt8]) -> Int? {
        guard bytes.count >= 4 else { return nil }
        for index in 0...(bytes.count - 4)
        where bytes[index] == 13 && bytes[index + 1] == 10 && bytes[index + 2] == 13 && bytes[index + 3] == 10 {
            return index
        }
        return nil
    }

    /// Turns the server's frames into deliveries, pongs and closes.
    private func readFrames(_ wsi: OpaquePointer, _ bytes: UnsafeRawBufferPointer, _ reader: ServerFrameReader) -> Int32
    {
        if discardingInput { return 0 }
        reader.consume(bytes) { event in
            switch event {
            case .message(let message):
                // After this side's close, what still comes is dropped (RFC 6455 §5.5.1).
                if !closeHanded { delegate?.webSocket(self, didReceive: message) }
                return !discardingInput
            case .ping(let payload):
                if !closeHanded {
                    rawClient?.pong = payload
                    lws_callback_on_writable(wsi)
                }
                return true
            case .pong:
                return true
            case .close(let code, let reason):
                if closeHanded {
                    // The server's answer to this side's close: the connection ends.
                    lws_set_timeout(wsi, PENDING_TIMEOUT_CLOSE_SEND, LWS_TO_KILL_ASYNC)
                    return false
                }
                closeCause = WebSocketCloseEvent(
                    code: code.map { WebSocketCloseCode(rawValue: $0) } ?? .noStatus, reason: reason)
                // Answered with the same status (RFC 6455 §5.5.1), then the connection ends.
                closeFromReading(wsi, code.map { WebSocketCloseCode(rawValue: $0) } ?? .normal, "")
                return false
            case .failure(let code, let reason):
                if closeHanded {
                    // After this side's close: its own code stays the cause; nothing more can
                    // be read, so the connection ends without waiting for an answer.
                    lws_set_timeout(wsi, PENDING_TIMEOUT_CLOSE_SEND, LWS_TO_KILL_ASYNC)
                    return false
                }
                closeCause = WebSocketCloseEvent(code: code, reason: reason)
                closeFromReading(wsi, code, reason)
                return false
            }
        }
        return 0
    }

    /// A close decided while reading (a message over the limit; on a raw client also the
    /// server's close, or a frame that broke the protocol): nothing more is read or sent but
    /// the close frame, from the next writable callback, and the connection ends once it is
    /// written.
    private func closeFromReading(_ wsi: OpaquePointer, _ code: WebSocketCloseCode, _ reason: String) {
        discardingInput = true
        rawClient?.endsAfterClose = true
        state.withLock { s in
            s.outbound.removeAll()
            s.queuedBytes = 0
            s.phase = .closing
            s.closeRequest = CloseRequest(code: code, reason: reason)
        }
        lws_callback_on_writable(wsi)
    }

    /// A raw client's close from its writable callback: the close frame goes out; then the
    /// connection ends at once (``RawClient/endsAfterClose``), or waits up to 5 s for the
    /// server's answer, as libwebsockets' client does.
    private func closeRaw(_ wsi: OpaquePointer, _ request: CloseRequest) -> Int32 {
        writeCloseFrame(wsi, request.code, request.reason)
        closeHanded = true
        if rawClient?.endsAfterClose == true {
            lws_set_timeout(wsi, PENDING_TIMEOUT_CLOSE_SEND, LWS_TO_KILL_ASYNC)
        } else {
            lws_set_timeout(wsi, PENDING_TIMEOUT_CLOSE_ACK, 5)
        }
        return 0
    }

    /// Reports the end of the connection to the delegate, once.
    func didClose(failure: String? = nil) {
        wsi = nil
        receiveBuffer = []
        rawClient = nil
        state.withLock { s in
            s.phase = .closed
            s.outbound.removeAll()
            s.queuedBytes = 0
            s.closeRequest = nil
        }
        guard !closeDelivered else { return }
        closeDelivered = true
        let event: WebSocketCloseEvent
        if let failure {
            event = WebSocketCloseEvent(code: .abnormal, reason: failure, failedToConnect: true)
        } else {
            event = closeCause ?? WebSocketCloseEvent(code: .abnormal, reason: "connection lost")
        }
        let delegate = self.delegate
        self.delegate = nil
        delegate?.webSocket(self, didCloseWith: event)
    }
}
