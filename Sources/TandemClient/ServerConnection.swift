import Dispatch
import Foundation
import Logging
import Synchronization
import TandemWire

/// One WebSocket connection to a Tandem server, speaking the protocol: `hello`, requests
/// answered by `request` id, and listeners fed by `target`.
///
/// Messages are decoded and delivered on the connection's own serial queue, in the order the
/// server sent them, never on the socket's service thread.
///
/// For example:
///
/// ```swift
/// let connection = try await ServerConnection.connect(to: "ws://127.0.0.1:7878", clientId: "cli-1")
/// let reply = try await connection.write([.create(in: accounts, fields: ["name": "Home"], idempotencyKey: key)])
/// connection.listen(to: accounts) { event in print(event) }
/// ```
public final class ServerConnection: Sendable {
    /// The server's `welcome`: session id, server time, limits.
    public var welcome: ServerMessage.Welcome { state.withLock { $0.welcome! } }
    public let clientId: ClientName
    public let url: String

    private let socket: any TransportConnection
    private let inbox: DispatchQueue
    private let state = Mutex(State())
    private let logger: Logger
    private let messagesReceived = Atomic(0)
    /// A message of a kind this client knows could not be read: nothing after it is handled.
    private let unreadable = Atomic(false)

    /// The connection was dropped because a message of a kind this client knows could not be
    /// read: a fault of what the server sent, which a new connection may meet again, not of
    /// the network.
    package var closedOnUnreadableMessage: Bool { unreadable.load(ordering: .relaxed) }

    /// How many messages have come from the server so far. Read in a listener's handler (on
    /// the connection's queue), it numbers the message being handled; a write's answer is
    /// numbered the same way (``PendingWrite/arrival``), so the two can be put in order.
    /// Read on another thread, it may not count a message being handled: a number no later
    /// than the truth.
    package var arrivals: Int { messagesReceived.load(ordering: .relaxed) }

    private struct State {
        var welcome: ServerMessage.Welcome?
        var handshake: CheckedContinuation<Void, any Error>?
        var pending: [String: @Sendable (Result<ServerMessage, any Error>) -> Void] = [:]
        /// The pending request that is an `auth` (whose answer names no request).
        var authRequest: String?
        var listeners: [String: @Sendable (ListenEvent) -> Void] = [:]
        var nextRequest = 1
        var closeEvent: TransportClose?
        var onClose: (@Sendable (TransportClose) -> Void)?
    }

    /// What a listener hears.
    public enum ListenEvent: Sendable {
        /// Changes after the listener's position (see ``ServerMessage/Snapshot``).
        case snapshot(ServerMessage.Snapshot)
        /// The resume token could not be used; a full snapshot follows.
        case reset(reason: String)
        /// The listen was refused (invalid path, too many listeners, …); it is over.
        case error(WireError)
    }

    /// The answer to a write.
    public enum WriteReply: Sendable {
        /// Every op applied; one result per op.
        case ack([WriteResult])
        /// The op at `op` failed its precondition; nothing was applied. `server` is the
        /// document as the server has it.
        case conflict(op: Int, server: Document)
    }

    private init(
        url: String, clientId: ClientName, socket: any TransportConnection, inbox: DispatchQueue, logger: Logger
    ) {
        self.url = url
        self.clientId = clientId
        self.socket = socket
        self.inbox = inbox
        self.logger = logger
    }

    /// Connects, says `hello` and waits for `welcome`.
    ///
    /// - Parameters:
    ///   - url: `ws://HOST:PORT`.
    ///   - clientId: Stable for this device: idempotency keys are remembered per client id.
    ///   - token: A bearer token, for servers with access control.
    ///   - transport: The WebSocket client to connect with; by default
    ///     `LibWebSocketsTransport`, on an event loop shared by the whole process. Required
    ///     where no target links libwebsockets (iOS): without it this throws `.invalidArgument`.
    ///   - trustedCertificates: For `wss://` over the default transport: a PEM file of the
    ///     certificate authorities the server's certificate must chain to (nil: the system's).
    ///   - timeout: How long to wait for `welcome`.
    ///   - queue: The serial queue that decodes this connection's messages and runs its
    ///     handlers; by default one of its own. Connections may share one (a process that holds
    ///     hundreds of them), and each then waits while another's handler runs. Never a queue
    ///     of the global concurrent pool: libdispatch on Linux gives that pool as many threads
    ///     as cores and adds one a second while they are blocked, so a push waiting there for
    ///     its `ack` (Tandem's sync service's do) would wait that long for the queue that brings
    ///     it.
    /// - Throws: ``TandemError``: `.invalidArgument` for a bad URL or client id, `.unreachable`
    ///   when the server cannot be reached, `.server` when it refuses the `hello`,
    ///   `.timedOut`.
    public static func connect(
        to url: String, clientId: String, token: String? = nil, transport: (any WebSocketTransport)? = nil,
        trustedCertificates: String? = nil,
        timeout: Duration = .seconds(10), queue: DispatchQueue? = nil,
        logger: Logger = Logger(label: "tandem.connection"), onClose: (@Sendable (TransportClose) -> Void)? = nil
    ) async throws -> ServerConnection {
        let name: ClientName
        do { name = try ClientName(clientId, field: "clientId") } catch {
            throw TandemError(.invalidArgument, error.message)
        }
        let relay = Relay()
        let socket: any TransportConnection
        do throws(TransportError) {
            let chosen: any WebSocketTransport =
                if let transport { transport } else { try defaultTransport(trustedCertificates: trustedCertificates) }
            socket = try chosen.connect(to: url) { event in relay.forward(event) }
        } catch {
            throw TandemError(
                [.invalidURL, .unavailable].contains(error.code) ? .invalidArgument : .unreachable, error.message)
        }
        let connection = ServerConnection(
            url: url, clientId: name, socket: socket,
            inbox: queue ?? DispatchQueue(label: "tandem.connection"), logger: logger)
        connection.state.withLock { $0.onClose = onClose }
        relay.attach(connection)

        do {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                // The socket may have closed already (a refused connection fails at once).
                let closed = connection.state.withLock { state -> TransportClose? in
                    if state.closeEvent == nil { state.handshake = continuation }
                    return state.closeEvent
                }
                if let closed {
                    continuation.resume(throwing: connection.handshakeError(closed))
                    return
                }
                connection.sendRaw(.hello(.init(clientId: name, token: token)))
                connection.scheduleTimeout(timeout) { state in
                    guard let handshake = state.handshake else { return nil }
                    state.handshake = nil
                    return {
                        handshake.resume(throwing: TandemError(.timedOut, "no welcome from \(url) within \(timeout)"))
                    }
                }
            }
        } catch {
            // A refused hello or a timeout: the socket must not stay open behind the error.
            connection.socket.abort()
            throw error
        }
        return connection
    }

    /// Applies ops on the server, all or nothing.
    ///
    /// - Throws: ``TandemError``: `.server` with the server's error (`not-found`,
    ///   `too-large`, …), `.disconnected`, `.timedOut`.
    public func write(_ ops: [WriteOp], timeout: Duration = .seconds(30)) async throws -> WriteReply {
        try await withCheckedThrowingContinuation { continuation in
            write(ops, timeout: timeout) { continuation.resume(with: $0) }
        }
    }

    /// Applies ops on the server and calls `completion` with the answer, on the connection's
    /// queue.
    public func write(
        _ ops: [WriteOp], timeout: Duration = .seconds(30),
        completion: @escaping @Sendable (Result<WriteReply, any Error>) -> Void
    ) {
        request(timeout: timeout, { .write(.init(request: $0, ops: ops)) }) { result in
            completion(
                result.flatMap { reply in
                    switch reply {
                    case .ack(let ack): .success(.ack(ack.results))
                    case .conflict(let conflict): .success(.conflict(op: conflict.op, server: conflict.server))
                    default: .failure(TandemError(.server, "unexpected answer to a write: \(reply)"))
                    }
                })
        }
    }

    /// Applies ops and waits for the answer, blocking the calling thread.
    ///
    /// For code that runs on its own serial queue and must not let anything else run until
    /// the answer is handled, like the sync service's push barrier; apps use the `async`
    /// ``write(_:timeout:)``. Never call it from the connection's own queue or from Swift
    /// concurrency's cooperative pool. Package-internal: only the sync library blocks.
    package func writeAndWait(_ ops: [WriteOp], timeout: Duration = .seconds(30)) -> Result<WriteReply, any Error> {
        startWrite(ops, timeout: timeout).wait()
    }

    /// Sends a write now and returns its answer to wait for later, so that the next write can
    /// go out before this one is answered. The same rules as ``writeAndWait(_:timeout:)``
    /// hold for ``PendingWrite/wait()``.
    /// Runs `body` on the connection's queue once what it has queued so far has run.
    package func afterQueuedWork(_ body: @escaping @Sendable () -> Void) {
        inbox.async(execute: body)
    }

    package func startWrite(_ ops: [WriteOp], timeout: Duration = .seconds(30)) -> PendingWrite {
        let pending = PendingWrite()
        write(ops, timeout: timeout) { [weak self] result in pending.fulfil(result, arrival: self?.arrivals ?? 0) }
        return pending
    }

    /// The answer to a write sent with ``startWrite(_:timeout:)``.
    package final class PendingWrite: Sendable {
        private let answered = DispatchSemaphore(value: 0)
        private let result = Mutex<(Result<WriteReply, any Error>, arrival: Int)?>(nil)

        fileprivate init() {}

        fileprivate func fulfil(_ result: Result<WriteReply, any Error>, arrival: Int) {
            self.result.withLock { $0 = (result, arrival) }
            answered.signal()
        }

        /// The number of the message that answered (see ``ServerConnection/arrivals``), once
        /// ``wait()`` has returned: a listener's snapshot numbered lower came before it. For a
        /// write that failed without an answer (a timeout, the connection's end), the count
        /// when it failed.
        package var arrival: Int { result.withLock { $0?.arrival ?? 0 } }

        /// Blocks until the answer (or the write's timeout, or the connection's end).
        package func wait() -> Result<WriteReply, any Error> {
            if let (result, _) = result.withLock({ $0 }) { return result }
            BlockingCheck.willBlock("waiting for a write's answer (PendingWrite.wait())")
            answered.wait()
            return result.withLock { $0!.0 }
        }
    }

    /// The document, or nil when it does not exist.
    public func get(_ collection: CollectionPath, _ id: DocumentID, timeout: Duration = .seconds(30)) async throws
        -> Document?
    {
        do {
            let reply = try await request(timeout: timeout) { .get(.init(request: $0, collection: collection, id: id)) }
            guard case .document(let document) = reply else {
                throw TandemError(.server, "unexpected answer to a get: \(reply)")
            }
            return document.document
        } catch let error as TandemError where error.serverError?.code == .notFound {
            return nil
        }
    }

    /// Gives the open connection a fresh token (a JWT about to expire): the server verifies it
    /// and decides every listener again under its claims. A token it refuses ends the
    /// connection (`unauthenticated`, then a 1008 close), as a refused `hello` does.
    ///
    /// - Returns: The user the token names and its expiry, as the server read them.
    public func authenticate(token: String, timeout: Duration = .seconds(30)) async throws
        -> ServerMessage.Authenticated
    {
        let reply = try await request(timeout: timeout) { id in
            state.withLock { $0.authRequest = id }
            return .auth(.init(token: token))
        }
        guard case .authenticated(let authenticated) = reply else {
            throw TandemError(.server, "unexpected answer to auth: \(reply)")
        }
        return authenticated
    }

    /// Starts listening to a collection. `handler` runs on the connection's queue, in order.
    ///
    /// - Parameters:
    ///   - target: The listener's name on this connection; by default the collection path.
    ///   - resumeToken: The token of the last snapshot applied, to receive only what changed.
    ///   - query: Only the documents it selects, in its order, with positioned changes
    ///     (`added`, `modified`, `removed` with `oldIndex` and `newIndex`); nil for the whole
    ///     collection.
    ///   - view: With a query and a resume token: the ids of the view the client holds, in
    ///     order, so that the server sends only how it changed (without them, a `reset` and
    ///     the whole view).
    ///   - excludingOwnWrites: Snapshots leave out the changes this connection's own
    ///     acknowledged writes made, deletes excepted; catch-up pages may still carry some,
    ///     and the full snapshot after a `reset` carries all (a whole collection only; see
    ///     PROTOCOL.md, `listen`).
    /// - Returns: The target, to pass to ``unlisten(_:)``.
    @discardableResult
    public func listen(
        to collection: CollectionPath, target: String? = nil, resumeToken: String? = nil, query: Query? = nil,
        view: [DocumentID]? = nil, excludingOwnWrites: Bool = false, handler: @escaping @Sendable (ListenEvent) -> Void
    ) -> String {
        let target = target ?? collection.rawValue
        state.withLock { $0.listeners[target] = handler }
        sendRaw(
            .listen(
                .init(
                    target: target, collection: collection, resumeToken: resumeToken, query: query, view: view,
                    excludesOwnWrites: excludingOwnWrites)))
        return target
    }

    /// Stops a listener; no event reaches its handler after this returns.
    public func unlisten(_ target: String) {
        guard state.withLock({ $0.listeners.removeValue(forKey: target) }) != nil else { return }
        sendRaw(.unlisten(.init(target: target)))
    }

    /// True until the connection closes.
    public var isOpen: Bool { state.withLock { $0.closeEvent == nil } && socket.isOpen }

    /// Closes the connection (1000). Pending requests fail with `.disconnected`.
    public func close() {
        socket.close(code: 1000, reason: "client closing")
    }

    /// Drops the connection at once, as a network failure would (for tests).
    public func abort() {
        socket.abort()
    }

    // MARK: - Plumbing

    /// A JSON object whose `type` is a string that names no server message this client knows.
    private static func isOfUnknownKind(_ bytes: [UInt8]) -> Bool {
        guard case .object(let members)? = try? Wire.parse(bytes, maxDepth: Wire.maxServerNestingDepth),
            case .string(let type)? = members["type"]
        else {
            return false
        }
        return !ServerMessage.kinds.contains(type)
    }

    private func request(
        timeout: Duration, _ make: (String) -> ClientMessage,
        completion: @escaping @Sendable (Result<ServerMessage, any Error>) -> Void
    ) {
        let (id, closed): (String?, TransportClose?) = state.withLock { state in
            if let event = state.closeEvent { return (nil, event) }
            let id = "r\(state.nextRequest)"
            state.nextRequest += 1
            state.pending[id] = completion
            return (id, nil)
        }
        guard let id else {
            completion(
                .failure(
                    TandemError(.disconnected, "the connection to \(url) is closed (\(closed.map { "\($0)" } ?? "")")))
            return
        }
        sendRaw(make(id))
        scheduleTimeout(timeout) { state in
            guard let completion = state.pending.removeValue(forKey: id) else { return nil }
            return { completion(.failure(TandemError(.timedOut, "no answer from \(self.url) within \(timeout)"))) }
        }
    }

    private func request(timeout: Duration, _ make: (String) -> ClientMessage) async throws -> ServerMessage {
        try await withCheckedThrowingContinuation { continuation in
            request(timeout: timeout, make) { continuation.resume(with: $0) }
        }
    }

    /// A message that cannot be sent (the connection is closing, or the server stopped
    /// reading) ends the connection: its requests fail and its listeners hear the close,
    /// instead of waiting for an answer to something never sent.
    private func sendRaw(_ message: ClientMessage) {
        do {
            try socket.send(text: Wire.encode(message))
        } catch {
            logger.debug("send failed; dropping the connection", metadata: ["tandem.error": "\(error)"])
            socket.abort()
        }
    }

    /// After `timeout`, runs `expire` under the lock; the closure it returns runs outside it.
    private func scheduleTimeout(
        _ timeout: Duration, _ expire: @escaping @Sendable (inout State) -> (@Sendable () -> Void)?
    ) {
        // On the connection's queue, not the global pool: a push waiting on that pool for a
        // silent server must get its timeout whatever else holds the pool's threads.
        inbox.asyncAfter(deadline: .now() + timeout.dispatchInterval) { [self] in
            let action = state.withLock { state in expire(&state) }
            action?()
        }
    }

    fileprivate func received(_ bytes: [UInt8]) {
        Confinement.check(inbox)
        messagesReceived.add(1, ordering: .relaxed)
        guard !unreadable.load(ordering: .relaxed) else { return }
        let message: ServerMessage
        do {
            message = try Wire.decode(ServerMessage.self, from: bytes)
        } catch {
            // A later protocol's new kind of message is skipped. One of a kind this client
            // knows must not be: a listener's next snapshot would store a token past the
            // changes lost with it, and a write's answer would never come. The connection
            // goes; listeners resume from their stored tokens, writes are sent again.
            if Self.isOfUnknownKind(bytes) {
                logger.warning("skipped a server message of a kind this client does not know")
                return
            }
            logger.error(
                "cannot read a message from the server; dropping the connection",
                metadata: ["tandem.error": "\(error)"])
            unreadable.store(true, ordering: .relaxed)
            socket.abort()
            return
        }
        switch message {
        case .welcome(let welcome):
            let handshake = state.withLock { state in
                state.welcome = welcome
                defer { state.handshake = nil }
                return state.handshake
            }
            handshake?.resume()
        case .snapshot(let snapshot):
            deliver(to: snapshot.target, .snapshot(snapshot))
        case .reset(let reset):
            deliver(to: reset.target, .reset(reason: reset.reason))
        case .ack(let ack):
            answer(ack.request, message)
        case .conflict(let conflict):
            answer(conflict.request, message)
        case .document(let reply):
            answer(reply.request, message)
        case .authenticated:
            if let request = state.withLock({ $0.authRequest.take() }) { answer(request, message) }
        case .error(let error):
            if let request = error.request {
                answer(request, message)
            } else if error.target == nil, let request = state.withLock({ $0.authRequest.take() }) {
                answer(request, message)
            } else if let target = error.target {
                let handler = state.withLock { $0.listeners.removeValue(forKey: target) }
                handler?(.error(error))
            } else {
                let handshake = state.withLock { state in
                    defer { state.handshake = nil }
                    return state.handshake
                }
                if let handshake {
                    handshake.resume(throwing: TandemError(server: error))
                } else {
                    logger.warning("error from the server", metadata: ["tandem.error": "\(error)"])
                }
            }
        }
    }

    private func deliver(to target: String, _ event: ListenEvent) {
        guard let handler = state.withLock({ $0.listeners[target] }) else { return }
        handler(event)
    }

    private func answer(_ request: String, _ message: ServerMessage) {
        guard let completion = state.withLock({ $0.pending.removeValue(forKey: request) }) else { return }
        if case .error(let error) = message {
            completion(.failure(TandemError(server: error)))
        } else {
            completion(.success(message))
        }
    }

    private func handshakeError(_ event: TransportClose) -> TandemError {
        let code: TandemError.Code = event.failedToConnect ? .unreachable : .disconnected
        if event.failedToConnect && url.lowercased().hasPrefix("wss://") && event.reason.contains("SSL") {
            return TandemError(
                code,
                "the TLS handshake with \(url) failed: its certificate is not trusted here (signed by an authority "
                    + "this client does not trust, or issued for another name), or it does not speak TLS: \(event.reason)"
            )
        }
        return TandemError(code, "cannot reach the server at \(url): \(event.reason)")
    }

    fileprivate func closed(_ event: TransportClose) {
        Confinement.check(inbox)
        let (handshake, pending, onClose) = state.withLock { state in
            state.closeEvent = event
            defer {
                state.handshake = nil
                state.pending = [:]
                state.listeners = [:]
                state.onClose = nil
            }
            return (state.handshake, Array(state.pending.values), state.onClose)
        }
        handshake?.resume(throwing: handshakeError(event))
        for completion in pending {
            completion(.failure(TandemError(.disconnected, "the connection to \(url) closed: \(event)")))
        }
        onClose?(event)
    }

    /// Forwards socket events to the connection's queue.
    ///
    /// The socket exists before its `ServerConnection` does, and a refused connection fails
    /// within microseconds, on the service thread: events that come before ``attach(_:)`` are
    /// kept and handed over then, in order, so that a fast failure is never lost (it would
    /// leave `connect` waiting for its timeout).
    private final class Relay: Sendable {
        private struct State {
            var connection: ServerConnection?
            var early: [TransportEvent] = []
            var isClosed = false
        }

        private let state = Mutex(State())

        func attach(_ connection: ServerConnection) {
            state.withLock { state in
                state.connection = connection
                for event in state.early { Self.deliver(event, to: connection) }
                state.early = []
                if state.isClosed { state.connection = nil }
            }
        }

        /// Enqueued under the lock, so that events keep their order across `attach`.
        func forward(_ event: TransportEvent) {
            state.withLock { state in
                if case .closed = event { state.isClosed = true }
                guard let connection = state.connection else {
                    state.early.append(event)
                    return
                }
                Self.deliver(event, to: connection)
                if state.isClosed { state.connection = nil }
            }
        }

        private static func deliver(_ event: TransportEvent, to connection: ServerConnection) {
            switch event {
            case .text(let bytes): connection.inbox.async { connection.received(bytes) }
            case .closed(let close): connection.inbox.async { connection.closed(close) }
            }
        }
    }
}
