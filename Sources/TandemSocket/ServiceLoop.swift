import CLibWebSockets
import Dispatch
import Foundation
import Logging
import Synchronization
import TandemWire

/// One libwebsockets context and the thread that services it.
///
/// libwebsockets is single-threaded: every call on a context and its connections must come from
/// the thread inside `lws_service`, with one exception, `lws_cancel_service`, which wakes that
/// thread from anywhere. So other threads never touch libwebsockets: they put a connection in
/// the attention list and wake the loop, and the service thread, in
/// `LWS_CALLBACK_EVENT_WAIT_CANCELLED`, asks libwebsockets for a writable callback, starts a
/// pending client connection, or changes receive flow control.
///
/// Thread ownership: `registry` and every connection's `wsi` belong to the service thread;
/// `pending` is shared and guarded by its mutex.
final class ServiceLoop: @unchecked Sendable {
    let configuration: WebSocketConfiguration
    let logger: Logger
    let name: String
    /// The delegate of connections accepted by a server loop; nil on a client loop.
    let acceptDelegate: (any WebSocketDelegate)?
    /// Answers plain HTTP requests on a server loop's port; nil answers 404.
    let httpHandler: HTTPHandler?
    /// Judges plain HTTP requests from their headers; nil takes every one, with a body up to
    /// ``WebSocketConfiguration/maxHTTPBodyBytes``.
    let httpAdmission: HTTPAdmission?
    /// Service thread only: the bytes reserved for the bodies of the HTTP requests under way.
    private var bodyBytesInFlight = 0
    /// Service thread only: accepted connections that have not finished their request's headers.
    private var handshaking: Set<OpaquePointer> = []
    /// The port the server loop listens on; 0 on a client loop.
    private(set) var listenPort = 0

    private let protocols: UnsafeMutablePointer<lws_protocols>
    private let protocolName: UnsafeMutablePointer<CChar>
    private let idlePolicy: UnsafeMutablePointer<lws_retry_bo_t>

    /// Service thread only: every connection libwebsockets knows, kept alive until `WSI_DESTROY`.
    private var registry: [ObjectIdentifier: WebSocketConnection] = [:]
    /// The keepalive's one timer for all the loop's connections (see ``sweepKeepAlive()``):
    /// libwebsockets' timer entry, followed by this loop's address, which its callback reads.
    private let sweepTimer: UnsafeMutableRawPointer
    private var sweepEntry: UnsafeMutablePointer<lws_sorted_usec_list_t> {
        sweepTimer.assumingMemoryBound(to: lws_sorted_usec_list_t.self)
    }
    /// When the sweep is due, if it is scheduled (service thread).
    private var sweepAt: ContinuousClock.Instant?
    /// The context, for the sweep's scheduling (service thread, while it services).
    private var serviceContext: OpaquePointer?
    /// Service thread only: HTTP requests under way, by their `wsi`.
    private var exchanges: [OpaquePointer: HTTPExchange] = [:]

    private let pending = Mutex(Pending())
    private let finished = DispatchSemaphore(value: 0)
    private let openConnections = Atomic<Int>(0)

    private struct Pending {
        var attention: [WebSocketConnection] = []
        /// HTTP exchanges whose answer is ready to be written.
        var answered: [HTTPExchange] = []
        var stopping = false
        /// The context, until the service thread destroys it. Kept under the lock because
        /// `lws_cancel_service` is called from other threads and must not race the destroy.
        var context: ContextPointer?
        var serviceThread: pthread_t?
    }

    /// Creates the context (listening when `listen` is given) and starts its service thread.
    init(
        name: String, listen: (host: String, port: Int)?, acceptDelegate: (any WebSocketDelegate)?,
        httpHandler: HTTPHandler? = nil, httpAdmission: HTTPAdmission? = nil, configuration: WebSocketConfiguration,
        logger: Logger
    ) throws(WebSocketError) {
        self.name = name
        self.configuration = configuration
        self.logger = logger
        self.acceptDelegate = acceptDelegate
        self.httpHandler = httpHandler
        self.httpAdmission = httpAdmission
        LibWebSocketsLog.route(to: logger)

        protocolName = strdup("tandem")!
        protocols = .allocate(capacity: 2)
        protocols.initialize(repeating: lws_protocols(), count: 2)
        protocols[0].name = UnsafePointer(protocolName)
        protocols[0].callback = tandemServiceCallback
        protocols[0].rx_buffer_size = 64 << 10
        // Unused storage, but libwebsockets calls LWS_CALLBACK_WS_SERVER_DROP_PROTOCOL (where a
        // close it makes on its own gets a status, see WebSocketConnection.dropping) only for
        // protocols that have some.
        protocols[0].per_session_data_size = 8

        // No keepalive from libwebsockets: each connection keeps its own (see
        // WebSocketConnection.keepAlive), which counts anything received as a sign of life and
        // does not hang up on a peer whose data is waiting unread.
        idlePolicy = .allocate(capacity: 1)
        idlePolicy.initialize(to: lws_retry_bo_t())
        idlePolicy.pointee.secs_since_valid_ping = 0
        idlePolicy.pointee.secs_since_valid_hangup = 0
        let timerSize = MemoryLayout<lws_sorted_usec_list_t>.stride
        sweepTimer = .allocate(byteCount: timerSize + MemoryLayout<UnsafeRawPointer>.size, alignment: 16)
        sweepTimer.bindMemory(to: lws_sorted_usec_list_t.self, capacity: 1).initialize(to: lws_sorted_usec_list_t())

        var info = lws_context_creation_info()
        info.protocols = UnsafePointer(protocols)
        info.user = Unmanaged.passUnretained(self).toOpaque()
        info.options = UInt64(LWS_SERVER_OPTION_VALIDATE_UTF8)
        info.retry_and_idle_policy = UnsafePointer(idlePolicy)
        info.timeout_secs = 10
        // A connection gets 10 s for its request line and headers, however it trickles them
        // (a fixed deadline, not one that each byte renews).
        info.timeout_secs_ah_idle = 10
        info.connect_timeout_secs = 10
        info.pt_serv_buf_size = 64 << 10

        var interface: UnsafeMutablePointer<CChar>?
        defer { free(interface) }
        // TLS through libwebsockets' OpenSSL: the files are read while the context is made.
        //
        // Only contexts that use TLS ask libwebsockets for its OpenSSL set-up: libwebsockets 4.1
        // keeps the index under which it finds a connection from its OpenSSL session in a
        // process-wide variable that each such set-up replaces, so a handshake under way in
        // another context when one is made fails ("can't get wsi from ssl privdata"). A
        // process makes few of them (a server's one, a client loop per set of trusted
        // authorities), once, at the start.
        var tlsFiles: [UnsafeMutablePointer<CChar>?] = []
        defer { tlsFiles.forEach { free($0) } }
        func keep(_ path: String?) -> UnsafePointer<CChar>? {
            guard let path else { return nil }
            let copy = strdup(path)
            tlsFiles.append(copy)
            return UnsafePointer(copy)
        }
        let serverTLS = listen != nil && (configuration.tlsCertificate != nil || configuration.tlsPrivateKey != nil)
        if listen == nil || serverTLS { info.options |= UInt64(LWS_SERVER_OPTION_DO_SSL_GLOBAL_INIT) }
        if serverTLS {
            // Every stored property is set by now, so a throw from here on runs `deinit`, which
            // frees what the context was to be made with (freeing it here too freed it twice).
            guard configuration.tlsCertificate != nil, configuration.tlsPrivateKey != nil else {
                throw WebSocketError(.contextCreationFailed, "TLS needs both a certificate and a private key")
            }
            info.ssl_cert_filepath = keep(configuration.tlsCertificate)
            info.ssl_private_key_filepath = keep(configuration.tlsPrivateKey)
        }
        if listen == nil {
            let system = "/etc/ssl/certs/ca-certificates.crt"
            info.client_ssl_ca_filepath = keep(
                configuration.trustedCertificates
                    ?? (FileManager.default.fileExists(atPath: system) ? system : nil))
        }
        if let listen {
            info.port = Int32(listen.port)
            let address = listen.host == "localhost" ? "127.0.0.1" : listen.host
            if address != "0.0.0.0" && address != "::" && !address.isEmpty {
                interface = strdup(address)
                info.iface = UnsafePointer(interface)
            }
            if !address.contains(":") {
                info.options |= UInt64(LWS_SERVER_OPTION_DISABLE_IPV6)
            }
        } else {
            info.port = CONTEXT_PORT_NO_LISTEN
        }

        guard let context = lws_create_context(&info) else {
            if let certificate = configuration.tlsCertificate, let key = configuration.tlsPrivateKey, listen != nil {
                throw WebSocketError(
                    .contextCreationFailed,
                    "could not start TLS with the certificate \(certificate) and the key \(key) "
                        + "(missing, unreadable, not PEM, or not a pair?), or could not listen on \(listen!.host):\(listen!.port)"
                )
            }
            if let listen {
                throw WebSocketError(
                    .contextCreationFailed,
                    "could not listen on \(listen.host):\(listen.port) (address in use, or not an address of this machine?)"
                )
            }
            throw WebSocketError(.contextCreationFailed, "libwebsockets could not create its context")
        }
        let handle = ContextPointer(context)
        pending.withLock { $0.context = handle }
        if listen != nil, let vhost = lws_get_vhost_by_name(context, "default") {
            listenPort = Int(lws_get_vhost_listen_port(vhost))
        }
        startServiceThread()
    }

    deinit {
        Self.release(protocols: protocols, name: protocolName, policy: idlePolicy)
        sweepTimer.deallocate()
    }

    private static func release(
        protocols: UnsafeMutablePointer<lws_protocols>, name: UnsafeMutablePointer<CChar>,
        policy: UnsafeMutablePointer<lws_retry_bo_t>
    ) {
        protocols.deinitialize(count: 2)
        protocols.deallocate()
        free(name)
        policy.deinitialize(count: 1)
        policy.deallocate()
    }

    /// Connections whose handshake completed and that have not closed yet.
    var connectionCount: Int { openConnections.load(ordering: .relaxed) }

    // MARK: - Any thread

    /// Puts `connection` in the attention list and wakes the service thread if it was idle.
    func needsAttention(_ connection: WebSocketConnection) {
        let wasIdle = pending.withLock { p -> Bool in
            guard p.context != nil else { return false }
            p.attention.append(connection)
            return p.attention.count == 1
        }
        if wasIdle { wake() }
    }

    private func wake() {
        pending.withLock { p in
            if let context = p.context { lws_cancel_service(context.pointer) }
        }
    }

    /// Stops a debug build unless called on the service thread, which owns the loop's state
    /// (the registry, the HTTP exchanges, the budgets) and every libwebsockets call.
    @inline(__always)
    func assertServiceThread(file: StaticString = #fileID, line: UInt = #line) {
        Confinement.check(isServiceThread, "called off the libwebsockets service thread", file: file, line: line)
    }

    /// True when called from inside a callback of this loop.
    var isServiceThread: Bool {
        pending.withLock { p in p.serviceThread.map { pthread_equal($0, pthread_self()) != 0 } ?? false }
    }

    /// Closes every connection with 1001, waits up to `gracePeriod` for the close handshakes,
    /// destroys the context and joins the service thread.
    ///
    /// Called from one of this loop's own callbacks, it only starts the shutdown.
    func shutdown() {
        guard beginShutdown() else { return }
        BlockingCheck.willBlock("waiting for a libwebsockets loop's close handshakes (shutdown())")
        waitUntilFinished()
    }

    /// ``shutdown()`` for async callers: the wait for the close handshakes (up to the grace
    /// period) holds a thread of its own, not one of Swift concurrency's.
    func shutdown() async {
        guard beginShutdown() else { return }
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            Thread.detachNewThread { [self] in
                waitUntilFinished()
                done.resume()
            }
        }
    }

    /// Starts the shutdown (once, whoever calls first); false on the service thread, which
    /// must return to its loop rather than wait for it.
    private func beginShutdown() -> Bool {
        let first = pending.withLock { p -> Bool in
            defer { p.stopping = true }
            return !p.stopping
        }
        if first {
            wake()
            DispatchQueue.global().asyncAfter(deadline: .now() + Self.gracePeriod) { [self] in wake() }
        }
        return !isServiceThread
    }

    private func waitUntilFinished() {
        finished.wait()
        finished.signal()  // let later callers of shutdown() through too
    }

    /// How long a shutdown waits for close handshakes before destroying the context.
    private static let gracePeriod = DispatchTimeInterval.milliseconds(500)

    // MARK: - Service thread

    /// The service thread's name, as `/proc/self/task/*/comm` shows it (at most 15 bytes).
    let threadName = "tandem-lws-\(ServiceLoop.threadNumbers.wrappingAdd(1, ordering: .relaxed).oldValue)"
    private static let threadNumbers = Atomic<Int>(1)

    /// Starts the service thread without waiting for it: until it records itself,
    /// ``isServiceThread`` is false everywhere, which is true of every thread that asks.
    private func startServiceThread() {
        let thread = Thread { [self] in
            tandem_set_thread_name(threadName)
            pending.withLock { $0.serviceThread = pthread_self() }
            run()
        }
        thread.start()
    }

    private func run() {
        guard let context = pending.withLock({ $0.context })?.pointer else { return }
        serviceContext = context
        sweepTimer.storeBytes(
            of: UnsafeRawPointer(Unmanaged.passUnretained(self).toOpaque()),
            toByteOffset: MemoryLayout<lws_sorted_usec_list_t>.stride, as: UnsafeRawPointer.self)
        while !pending.withLock({ $0.stopping }) {
            // lws 4.x ignores the timeout argument; the loop wakes on socket events, its own
            // timers and lws_cancel_service.
            if lws_service(context, 0) < 0 { break }
        }
        closeAllGracefully(context)
        pending.withLock { $0.context = nil }
        lws_sul_cancel(sweepEntry)
        serviceContext = nil
        lws_context_destroy(context)
        let stranded = pending.withLock { p -> [WebSocketConnection] in
            defer { p.attention = [] }
            return p.attention
        }
        for connection in stranded where connection.wsi == nil {
            connection.didClose(failure: "the event loop was shut down")
        }
        for connection in registry.values {
            connection.didClose(failure: "the event loop was shut down")
        }
        registry = [:]
        finished.signal()
    }

    /// Sends a 1001 close to every open connection and services until they are gone or the
    /// grace period's wake-up arrives.
    private func closeAllGracefully(_ context: OpaquePointer) {
        let reason = acceptDelegate == nil ? "client shutting down" : "server shutting down"
        for connection in registry.values where connection.wsi != nil {
            connection.close(code: .goingAway, reason: reason)
            connection.attend()
        }
        // Each wake-up either comes from a socket event (a close handshake progressing) or from
        // the grace-period timer in shutdown(); stop at the timer's or when nothing is left.
        let deadline = DispatchTime.now() + Self.gracePeriod
        while openConnections.load(ordering: .relaxed) > 0 && DispatchTime.now() < deadline {
            if lws_service(context, 0) < 0 { break }
        }
    }

    func handle(
        _ wsi: OpaquePointer, _ reason: lws_callback_reasons, _ user: UnsafeMutableRawPointer?,
        _ input: UnsafeMutableRawPointer?, _ length: Int
    ) -> Int32 {
        // Every callback runs on the service thread, but those libwebsockets makes while the
        // context is created, on the creating thread, before the service thread records itself.
        Confinement.check(
            pending.withLock { p in p.serviceThread.map { pthread_equal($0, pthread_self()) != 0 } ?? true },
            "libwebsockets called back off the service thread (reason \(reason.rawValue))")
        switch reason {
        case LWS_CALLBACK_EVENT_WAIT_CANCELLED:
            serviceAttentionList()
            return 0

        case LWS_CALLBACK_FILTER_NETWORK_CONNECTION:
            // On the listening socket, before anything is read of the new one: past the bound on
            // connections still in their handshake, it is closed at once.
            guard handshaking.count < configuration.maxHandshakes else {
                logger.warning(
                    "refused a connection: \(handshaking.count) connections are still in their handshake",
                    metadata: ["tandem.limit": "\(configuration.maxHandshakes)"])
                return 1
            }
            return 0

        case LWS_CALLBACK_SERVER_NEW_CLIENT_INSTANTIATED:
            handshaking.insert(wsi)
            return 0

        case LWS_CALLBACK_ESTABLISHED:
            handshaking.remove(wsi)
            guard let acceptDelegate else { return -1 }
            let connection = WebSocketConnection(
                loop: self, peer: Self.peerAddress(wsi), delegate: acceptDelegate, configuration: configuration)
            register(connection, wsi)
            openConnections.add(1, ordering: .relaxed)
            connection.didOpen(wsi)
            return 0

        case LWS_CALLBACK_CLIENT_ESTABLISHED:
            guard let connection = connection(of: wsi) else { return -1 }
            clientOpened(connection, wsi)
            return 0

        case LWS_CALLBACK_RAW_CONNECTED:
            connection(of: wsi)?.rawConnected(wsi)
            return 0

        case LWS_CALLBACK_RAW_RX:
            return connection(of: wsi)?.rawReceived(wsi, input, length) ?? -1

        case LWS_CALLBACK_RAW_WRITEABLE:
            return connection(of: wsi)?.rawWritable(wsi) ?? -1

        case LWS_CALLBACK_RAW_CLOSE:
            let failure = connection(of: wsi)?.rawUpgradeFailure
            finish(wsi, failure: failure.map { pending.withLock { $0.stopping } ? "the event loop was shut down" : $0 })
            return 0

        case LWS_CALLBACK_RECEIVE, LWS_CALLBACK_CLIENT_RECEIVE:
            return connection(of: wsi)?.received(wsi, input, length) ?? -1

        case LWS_CALLBACK_SERVER_WRITEABLE, LWS_CALLBACK_CLIENT_WRITEABLE:
            return connection(of: wsi)?.writable() ?? -1

        case LWS_CALLBACK_TIMER:
            if let exchange = exchanges[wsi] { return exchangeTimer(exchange) }
            return connection(of: wsi)?.closeIdle(wsi) ?? 0

        case LWS_CALLBACK_RECEIVE_PONG, LWS_CALLBACK_CLIENT_RECEIVE_PONG:
            connection(of: wsi)?.heardFrom()
            return 0

        case LWS_CALLBACK_WS_PEER_INITIATED_CLOSE:
            return connection(of: wsi)?.peerInitiatedClose(wsi, input, length) ?? 0

        case LWS_CALLBACK_WS_SERVER_DROP_PROTOCOL:
            connection(of: wsi)?.dropping(wsi)
            return 0

        case LWS_CALLBACK_CLOSED, LWS_CALLBACK_CLIENT_CLOSED, LWS_CALLBACK_WSI_DESTROY:
            if reason == LWS_CALLBACK_WSI_DESTROY {
                handshaking.remove(wsi)
                if let exchange = exchanges.removeValue(forKey: wsi) { end(exchange) }
            }
            finish(wsi, failure: nil)
            return 0

        case LWS_CALLBACK_HTTP:
            return startHTTP(wsi, input)

        case LWS_CALLBACK_HTTP_BODY:
            guard let exchange = exchanges[wsi], let input, !exchange.refused else { return 0 }
            // More than its Content-Length said cannot come (libwebsockets counts it down), but
            // the reservation is the bound all the same.
            guard exchange.request.body.count + length <= exchange.reservedBytes else {
                exchange.request.body = []
                refuse(exchange, .error(413, "too-large", "the request body is longer than its Content-Length"))
                return 0
            }
            exchange.request.body.append(contentsOf: UnsafeRawBufferPointer(start: input, count: length))
            return 0

        case LWS_CALLBACK_HTTP_BODY_COMPLETION:
            guard let exchange = exchanges[wsi], !exchange.dispatched, exchange.readyResponse == nil else { return 0 }
            dispatch(exchange)
            return 0

        case LWS_CALLBACK_HTTP_WRITEABLE:
            return exchanges[wsi]?.write() ?? 0

        case LWS_CALLBACK_CLOSED_HTTP:
            handshaking.remove(wsi)
            if let exchange = exchanges.removeValue(forKey: wsi) { end(exchange) }
            return 0

        case LWS_CALLBACK_CLIENT_CONNECTION_ERROR:
            let message = input.map { String(cString: $0.assumingMemoryBound(to: CChar.self)) }
            finish(wsi, failure: message ?? "connection failed")
            return 0

        default:
            return lws_callback_http_dummy(wsi, reason, user, input, length)
        }
    }

    /// A client connection completed its handshake (service thread).
    func clientOpened(_ connection: WebSocketConnection, _ wsi: OpaquePointer) {
        openConnections.add(1, ordering: .relaxed)
        connection.didOpen(wsi)
    }

    /// Forgets the connection of `wsi` and reports its end. After this, no callback of `wsi`
    /// reaches the connection object: its opaque pointer is cleared first.
    private func finish(_ wsi: OpaquePointer, failure: String?) {
        guard let connection = connection(of: wsi) else { return }
        lws_set_opaque_user_data(wsi, nil)
        if connection.wsi != nil { openConnections.subtract(1, ordering: .relaxed) }
        registry[ObjectIdentifier(connection)] = nil
        connection.didClose(failure: failure)
    }

    // MARK: - Keepalive

    /// A connection's keepalive is due at `instant` (service thread): the sweep runs by then,
    /// and within a second in any case (it also looks for frames that announce too much).
    func keepAliveDue(at instant: ContinuousClock.Instant) {
        let due = min(instant, .now + .seconds(1))
        if let sweepAt, sweepAt <= due { return }
        scheduleSweep(at: due)
    }

    private func scheduleSweep(at instant: ContinuousClock.Instant) {
        guard let serviceContext else { return }
        sweepAt = instant
        let delay = max(instant - .now, .microseconds(1))
        lws_sul_schedule(
            serviceContext, 0, sweepEntry,
            { timer in
                guard let timer else { return }
                let loop = UnsafeRawPointer(timer).load(
                    fromByteOffset: MemoryLayout<lws_sorted_usec_list_t>.stride, as: UnsafeRawPointer.self)
                Unmanaged<ServiceLoop>.fromOpaque(loop).takeUnretainedValue().sweepKeepAlive()
            }, Self.microseconds(delay))
    }

    /// The keepalive of every connection whose time has come, through one timer for the whole
    /// loop (service thread).
    ///
    /// A timer per connection (`lws_set_timer_usecs`) goes into libwebsockets' one sorted
    /// list, and each insertion walks the list to its place: with 10,000 connections opened
    /// together, their timers fell due together, and re-arming them walked 10,000 entries
    /// each (`lws_dll2_add_sorted` was half the server's CPU during those fan-outs, and a
    /// quarter while the connections opened). The sweep looks at each connection's
    /// ``WebSocketConnection/nextKeepAlive`` instead, at most every 100 ms.
    ///
    /// A sweep that runs late by more than ``stallAllowance`` found the service thread stopped:
    /// the process or the machine stood still, or a callback blocked. The peers' threads may
    /// have stood still too, and whichever runs first afterwards, that time is nobody's silence:
    /// every connection's clocks move on by the stall before anything is decided. Without this,
    /// a process stopped for longer than the idle timeout closed its peers on waking, before
    /// they had run once. The sweep runs at least every second, so a stall goes unseen for at
    /// most that long.
    func sweepKeepAlive() {
        assertServiceThread()
        let now = ContinuousClock.now
        if let sweepAt, now - sweepAt > Self.stallAllowance {
            let stall = now - sweepAt - Self.stallAllowance
            for connection in registry.values { connection.excuse(stall, now: now) }
        }
        sweepAt = nil
        var earliest: ContinuousClock.Instant?
        for connection in registry.values {
            guard let wsi = connection.wsi else { continue }
            if acceptDelegate != nil && connection.announcesTooMuch(wsi) {
                connection.closeTooBig(wsi)
                continue
            }
            if connection.nextKeepAlive <= now && connection.keepAlive(wsi, now: now) {
                // Closed from its own timer's callback, the one place libwebsockets allows it.
                lws_set_timer_usecs(wsi, 1)
                continue
            }
            earliest = min(earliest ?? connection.nextKeepAlive, connection.nextKeepAlive)
        }
        if let earliest { scheduleSweep(at: min(max(earliest, now + .milliseconds(100)), now + .seconds(1))) }
    }

    /// How late a sweep may run before the lateness counts as a stall (see ``sweepKeepAlive()``):
    /// a loop busy with a fan-out runs its timers a little late without anyone standing still.
    static let stallAllowance = Duration.milliseconds(250)

    static func microseconds(_ duration: Duration) -> lws_usec_t {
        lws_usec_t(duration.components.seconds * 1_000_000 + duration.components.attoseconds / 1_000_000_000_000)
    }

    private func register(_ connection: WebSocketConnection, _ wsi: OpaquePointer) {
        assertServiceThread()
        registry[ObjectIdentifier(connection)] = connection
        lws_set_opaque_user_data(wsi, Unmanaged.passUnretained(connection).toOpaque())
    }

    private func connection(of wsi: OpaquePointer) -> WebSocketConnection? {
        guard let raw = lws_get_opaque_user_data(wsi) else { return nil }
        return Unmanaged<WebSocketConnection>.fromOpaque(raw).takeUnretainedValue()
    }

    private func serviceAttentionList() {
        assertServiceThread()
        let (list, answered) = pending.withLock { p -> ([WebSocketConnection], [HTTPExchange]) in
            defer {
                p.attention = []
                p.answered = []
            }
            return (p.attention, p.answered)
        }
        for exchange in answered {
            if let wsi = exchange.wsi, exchanges[wsi] === exchange { lws_callback_on_writable(wsi) }
        }
        for connection in list {
            if connection.wsi == nil, let target = connection.connectTarget {
                connection.connectTarget = nil
                startConnect(connection, target)
            }
            connection.attend()
        }
    }

    // MARK: - HTTP

    /// A plain HTTP request's headers arrived (service thread). It is judged from them alone
    /// (``HTTPAdmission``: access, the path, the body it may have), and its `Content-Length`
    /// against the path's limit and the loop's budget for bodies, before any of its body is
    /// read: a refusal is answered at once and the body never held. A request with no body
    /// goes to the handler now; one with a body, once it is in.
    private func startHTTP(_ wsi: OpaquePointer, _ input: UnsafeMutableRawPointer?) -> Int32 {
        assertServiceThread()
        handshaking.remove(wsi)
        // A keep-alive connection's earlier request is over.
        if let earlier = exchanges.removeValue(forKey: wsi) { end(earlier) }
        let path = input.map { String(cString: $0.assumingMemoryBound(to: CChar.self)) } ?? "/"
        let method: String
        if lws_hdr_total_length(wsi, WSI_TOKEN_POST_URI) > 0 {
            method = "POST"
        } else if lws_hdr_total_length(wsi, WSI_TOKEN_GET_URI) > 0 {
            method = "GET"
        } else {
            method = "OTHER"
        }
        let request = HTTPRequest(
            method: method, path: path, arguments: Self.arguments(wsi),
            authorization: Self.header(wsi, WSI_TOKEN_HTTP_AUTHORIZATION), host: Self.header(wsi, WSI_TOKEN_HOST),
            origin: Self.header(wsi, WSI_TOKEN_ORIGIN), body: [], peer: Self.peerAddress(wsi))
        let exchange = HTTPExchange(wsi: wsi, request: request)
        exchanges[wsi] = exchange
        let maxBody: Int
        switch httpAdmission?(request) ?? .accept(maxBodyBytes: configuration.maxHTTPBodyBytes) {
        case .refuse(let response):
            refuse(exchange, response)
            return 0
        case .accept(let limit):
            maxBody = limit
        }
        let declared = Self.header(wsi, WSI_TOKEN_HTTP_CONTENT_LENGTH)
        if Self.header(wsi, WSI_TOKEN_HTTP_TRANSFER_ENCODING) != nil {
            // libwebsockets 4.1 does not decode chunked bodies.
            refuse(exchange, .error(411, "length-required", "send the body with a Content-Length, not chunked"))
            return 0
        }
        guard let length = declared.map({ Int($0) }) ?? 0, length >= 0 else {
            refuse(exchange, .error(400, "bad-request", "Content-Length '\(declared ?? "")' is not a length"))
            return 0
        }
        guard length <= maxBody else {
            refuse(
                exchange,
                .error(
                    413, "too-large",
                    "the request body is \(length) bytes; \(request.method) \(request.path) takes at most \(maxBody)"))
            return 0
        }
        guard length <= configuration.maxHTTPBodyBytesInFlight - bodyBytesInFlight else {
            var busy = HTTPResponse.error(
                503, "busy", "the server holds as many request bodies as it may; send this again in a moment")
            busy.headers = [("Retry-After", "1")]
            refuse(exchange, busy)
            return 0
        }
        // A POST's body arrives in LWS_CALLBACK_HTTP_BODY, and LWS_CALLBACK_HTTP_BODY_COMPLETION
        // hands it on. A request with no body is handed on now, and only once (`dispatched`):
        // libwebsockets may still call the completion for it.
        guard length > 0 else {
            dispatch(exchange)
            return 0
        }
        exchange.reservedBytes = length
        bodyBytesInFlight += length
        exchange.request.body.reserveCapacity(length)
        exchange.bodyDeadline = .now + configuration.httpBodyTimeout
        lws_set_timer_usecs(wsi, Self.microseconds(configuration.httpBodyTimeout))
        return 0
    }

    /// Answers a request from its headers alone: what arrives of its body is dropped, and the
    /// connection closes after the answer (``HTTPExchange/finished``).
    private func refuse(_ exchange: HTTPExchange, _ response: HTTPResponse) {
        exchange.refused = true
        exchange.dispatched = true
        releaseBody(of: exchange)
        answer(exchange, response)
    }

    /// The exchange's timer (service thread): a refused one's answer is out, and its connection
    /// closes; one whose body is not in by its deadline is answered 408. (libwebsockets 4.1
    /// cannot cancel a timer, so one that comes early or for a request since handed on is let
    /// be.)
    private func exchangeTimer(_ exchange: HTTPExchange) -> Int32 {
        assertServiceThread()
        if exchange.closing { return -1 }
        if !exchange.dispatched, let deadline = exchange.bodyDeadline, ContinuousClock.now >= deadline {
            exchange.request.body = []
            refuse(
                exchange,
                .error(408, "timeout", "the request body did not arrive within \(configuration.httpBodyTimeout)"))
        }
        return 0
    }

    /// The exchange is over: its body's reservation goes back to the budget.
    private func end(_ exchange: HTTPExchange) {
        exchange.wsi = nil
        releaseBody(of: exchange)
    }

    private func releaseBody(of exchange: HTTPExchange) {
        bodyBytesInFlight -= exchange.reservedBytes
        exchange.reservedBytes = 0
    }

    private func dispatch(_ exchange: HTTPExchange) {
        assertServiceThread()
        guard !exchange.dispatched else { return }
        exchange.dispatched = true
        // The body is in; what it holds stays until the exchange ends.
        guard let httpHandler else {
            answer(exchange, .notFound(exchange.request.path))
            return
        }
        httpHandler(exchange.request) { [self] response in answer(exchange, response) }
    }

    /// Any thread: the answer is ready; the service thread writes it.
    private func answer(_ exchange: HTTPExchange, _ response: HTTPResponse) {
        guard exchange.setResponse(response) else { return }
        let wasIdle = pending.withLock { p -> Bool in
            guard p.context != nil else { return false }
            p.answered.append(exchange)
            return p.answered.count + p.attention.count == 1
        }
        if wasIdle { wake() }
    }

    /// The query's arguments (`name=value` each): libwebsockets keeps each as a fragment of
    /// the URI arguments header, percent-decoded.
    private static func arguments(_ wsi: OpaquePointer) -> [String] {
        var arguments: [String] = []
        var buffer = [CChar](repeating: 0, count: 4096)
        var index: Int32 = 0
        while true {
            let copied = buffer.withUnsafeMutableBufferPointer {
                lws_hdr_copy_fragment(wsi, $0.baseAddress, Int32($0.count), WSI_TOKEN_HTTP_URI_ARGS, index)
            }
            guard copied >= 0 else { break }
            arguments.append(
                String(decoding: buffer.prefix(Int(copied)).map { UInt8(bitPattern: $0) }, as: UTF8.self))
            index += 1
        }
        return arguments
    }

    private static func header(_ wsi: OpaquePointer, _ token: lws_token_indexes) -> String? {
        let length = lws_hdr_total_length(wsi, token)
        guard length > 0 else { return nil }
        var buffer = [CChar](repeating: 0, count: Int(length) + 1)
        let copied = buffer.withUnsafeMutableBufferPointer { lws_hdr_copy(wsi, $0.baseAddress, Int32($0.count), token) }
        guard copied >= 0 else { return nil }
        return String(decoding: buffer.prefix(Int(copied)).map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Starts a client connection (service thread only, like every lws call).
    private func startConnect(_ connection: WebSocketConnection, _ target: WebSocketConnection.ConnectTarget) {
        assertServiceThread()
        guard let context = pending.withLock({ $0.context })?.pointer else {
            connection.didClose(failure: "the event loop was shut down")
            return
        }
        registry[ObjectIdentifier(connection)] = connection
        // Plain ws:// frames its own messages on a raw connection (see ClientFraming).
        let raw = !target.useTLS && configuration.ownClientFraming
        if raw { connection.useRawClient(target) }
        let hostHeader = "\(target.host):\(target.port)"
        let opened: Bool = target.host.withCString { host in
            target.path.withCString { path in
                hostHeader.withCString { hostHeader in
                    var info = lws_client_connect_info()
                    info.context = context
                    info.address = host
                    info.port = Int32(target.port)
                    info.path = path
                    info.host = hostHeader
                    info.origin = hostHeader
                    info.ssl_connection = target.useTLS ? Int32(LCCSCF_USE_SSL.rawValue) : 0
                    info.retry_and_idle_policy = UnsafePointer(idlePolicy)
                    info.opaque_user_data = Unmanaged.passUnretained(connection).toOpaque()
                    if raw {
                        info.local_protocol_name = UnsafePointer(protocolName)
                        return "RAW".withCString { method in
                            info.method = method
                            return lws_client_connect_via_info(&info) != nil
                        }
                    }
                    return lws_client_connect_via_info(&info) != nil
                }
            }
        }
        if !opened {
            connection.didClose(failure: "could not start a connection to \(hostHeader)")
            registry[ObjectIdentifier(connection)] = nil
        }
    }

    private static func peerAddress(_ wsi: OpaquePointer) -> String {
        var buffer = [CChar](repeating: 0, count: 64)
        return buffer.withUnsafeMutableBufferPointer { pointer in
            guard let name = lws_get_peer_simple(wsi, pointer.baseAddress, pointer.count) else { return "unknown" }
            return String(cString: name)
        }
    }
}

/// A `struct lws_context *`, which only `lws_cancel_service` may use from other threads.
struct ContextPointer: @unchecked Sendable {
    let pointer: OpaquePointer
    init(_ pointer: OpaquePointer) { self.pointer = pointer }
}

/// The protocol callback libwebsockets calls for every event. A C function pointer cannot
/// capture context, so it finds its loop through the context's user pointer.
private func tandemServiceCallback(
    _ wsi: OpaquePointer?, _ reason: lws_callback_reasons, _ user: UnsafeMutableRawPointer?,
    _ input: UnsafeMutableRawPointer?, _ length: Int
) -> Int32 {
    guard let wsi, let context = lws_get_context(wsi), let raw = lws_context_user(context) else {
        return lws_callback_http_dummy(wsi, reason, user, input, length)
    }
    let loop = Unmanaged<ServiceLoop>.fromOpaque(raw).takeUnretainedValue()
    return loop.handle(wsi, reason, user, input, length)
}
