import Dispatch
import Foundation
import Logging
import TandemSocket
import TandemWire

/// The server's state and logic, serialized on one dispatch queue (`queue`).
///
/// Sessions, listeners and the store are touched only on `queue`, so messages are handled one
/// at a time, in the order they arrive. Writes are the exception to "one at a time": the
/// writes waiting on the queue are applied together, in one transaction with one sync to disk
/// (a group commit, ``flushWrites()``), before anything else is handled, and each is
/// answered after that commit.
///
/// Listeners hear of changes through the change feed, never straight from a write: after a
/// commit (this node's, or another node's announced by the store), the node reads each
/// followed collection's feed once, after the position it had read up to, and sends what is
/// new to every live listener of that collection (``runFeedRound(_:)``). So every listener
/// sees a collection's changes in sequence order, which is commit order, whichever node wrote
/// them.
///
/// The socket delegate methods run on the socket's service thread; each hops to `queue`. The
/// entry points of the state's users check, in debug builds, that they run there
/// (``Confinement``).
final class ServerCore: WebSocketDelegate, @unchecked Sendable {
    let queue = DispatchQueue(label: "tandem.server.core")
    let store: any DocumentStore
    let configuration: ServerConfiguration
    let logger: Logger

    // Confined to `queue`.
    var sessions: [UInt64: Session] = [:]
    /// The collections this node follows the feed of: those with listeners, and those holding
    /// documents a listener's read permission depends on.
    var followed: [CollectionPath: FeedFollower] = [:]
    /// Collections whose feed has news to read (written here, or announced by the store).
    var pendingRound: Set<CollectionPath> = []
    var roundScheduled = false
    /// Writes waiting for the next group commit, in arrival order.
    var waitingWrites: [WaitingWrite] = []
    var waitingOps = 0
    var flushScheduled = false
    /// A group commit whose answer was lost, until the node finds out what became of it; no
    /// other group commits meanwhile.
    var commitInDoubt: CommitInDoubt?
    /// Injected failures, when configured (tests, `tandem serve --fault-…`).
    var faults: FaultInjector?
    /// While true, every delivery is held until ``releaseDeliveries()`` (tests).
    var holdsDeliveries = false
    /// False while the store cannot be reached (PostgreSQL down or cut off): the node then
    /// closes its connections (1013) and turns new ones away, so that clients go to a node
    /// that can serve them.
    var storeReachable = true
    private var maintenance: DispatchSourceTimer?
    var isStopped = false

    /// Past this many unhandled messages a connection stops being read; below the low mark
    /// it is read again. A client cannot queue unbounded work on the server.
    private static let pendingHighMark = 256
    private static let pendingLowMark = 32

    /// What `/healthz` reports; read by the socket's service thread.
    let health: NodeHealth
    /// What `/metrics` reports.
    let metrics: ServerMetrics

    init(configuration: ServerConfiguration, store: any DocumentStore) {
        self.configuration = configuration
        self.logger = configuration.logger
        self.store = store
        health = NodeHealth(
            node: configuration.nodeName ?? "\(configuration.host):\(configuration.port)", store: store.kind)
        faults = configuration.faults.map(FaultInjector.init)
        metrics = ServerMetrics(extra: configuration.metricsFactory)
    }

    func startMaintenance() {
        queue.async { [self] in
            runMaintenance()
            let timer = DispatchSource.makeTimerSource(queue: queue)
            let interval = configuration.maintenanceInterval.dispatchInterval
            timer.schedule(deadline: .now() + interval, repeating: interval)
            timer.setEventHandler { [weak self] in self?.runMaintenance() }
            timer.resume()
            maintenance = timer
        }
    }

    /// Purges expired tombstones and idempotency keys (on `queue`).
    @discardableResult
    func runMaintenance() -> (tombstones: Int, keys: Int) {
        Confinement.check(queue)
        let now = configuration.clock()
        do {
            let purged = try store.purge(
                tombstonesBefore: now - configuration.tombstoneRetention.milliseconds,
                keysBefore: now - configuration.idempotencyRetention.milliseconds)
            if purged.tombstones > 0 || purged.keys > 0 {
                logger.info(
                    "purged expired tombstones and idempotency keys",
                    metadata: ["tandem.tombstones": "\(purged.tombstones)", "tandem.keys": "\(purged.keys)"])
            }
            return purged
        } catch {
            logger.error("maintenance failed", metadata: ["tandem.error": "\(error)"])
            return (0, 0)
        }
    }

    /// Applies the writes still waiting, stops timers, forgets sessions and closes the
    /// database (on `queue`).
    func stop() {
        Confinement.check(queue)
        guard !isStopped else { return }
        flushWrites()
        isStopped = true
        health.update { $0.stopping = true }
        maintenance?.cancel()
        maintenance = nil
        for session in sessions.values { session.isClosed = true }
        sessions = [:]
        followed = [:]
        do { try store.close() } catch {
            logger.error("closing the store failed", metadata: ["tandem.error": "\(error)"])
        }
    }

    var stats: ServerStats {
        Confinement.check(queue)
        let all = sessions.values.flatMap(\.listeners.values)
        return ServerStats(
            connections: sessions.count, listeners: all.count, liveListeners: all.filter(\.isLive).count,
            heldMessages: sessions.values.map(\.heldCount).reduce(0, +))
    }

    // MARK: - Socket events (service thread)

    func webSocketDidOpen(_ connection: WebSocketConnection) {
        let session = Session(connection: connection, metrics: metrics)
        connection.userData = session
        queue.async { [self] in
            guard !isStopped else { return }
            sessions[connection.id] = session
            health.update { $0.connections = sessions.count }
        }
        let timeout = configuration.helloTimeout.dispatchInterval
        queue.asyncAfter(deadline: .now() + timeout) { [weak session] in
            guard let session, !session.isClosed, session.clientId == nil else { return }
            session.connection.close(
                code: .policyViolation, reason: "no hello within \(self.configuration.helloTimeout)")
            session.isClosed = true
        }
    }

    /// Passes a message to the core queue, decoded there when small.
    ///
    /// A large message (a write of many documents) is decoded first on the session's own
    /// `decoder` queue, on another core: decoding was a seventh of the core queue's samples
    /// under a stream of writes of 100, and the core queue is the server's one serial stage. A small one goes
    /// straight to the core queue, since the extra hand-over would cost it more time than its
    /// decoding. Order is kept: while the decoder holds any message of the session, the ones
    /// after it go through the decoder too, and it passes each on before counting it done.
    func webSocket(_ connection: WebSocketConnection, didReceive message: WebSocketMessage) {
        guard let session = connection.userData as? Session else { return }
        if session.pendingMessages.add(1, ordering: .relaxed).newValue > Self.pendingHighMark {
            connection.pauseReceiving()
        }
        if message.bytes.count < Self.decodeInlineBytes && session.decoding.load(ordering: .acquiring) == 0 {
            queue.async { [self] in handle(Self.decode(message), from: session) }
            return
        }
        session.decoding.add(1, ordering: .relaxed)
        session.decoder.async { [self] in
            let decoded = Self.decode(message)
            queue.async { [self] in handle(decoded, from: session) }
            session.decoding.subtract(1, ordering: .releasing)
        }
    }

    /// Messages under this many bytes are decoded on the core queue (see
    /// ``webSocket(_:didReceive:)``).
    private static let decodeInlineBytes = 4096

    private static func decode(_ frame: WebSocketMessage) -> Result<ClientMessage, WireError> {
        guard frame.kind == .text else {
            return .failure(
                WireError(.badMessage, "binary frames are not supported; send each message as a JSON text frame"))
        }
        return Result { () throws(WireError) in try Wire.decode(ClientMessage.self, from: frame.bytes) }
    }

    func webSocketDidDrain(_ connection: WebSocketConnection) {
        guard let session = connection.userData as? Session else { return }
        queue.async { [self] in
            for listener in session.listeners.values where listener.awaitsDrain {
                listener.awaitsDrain = false
                advance(listener)
            }
        }
    }

    func webSocket(_ connection: WebSocketConnection, didCloseWith event: WebSocketCloseEvent) {
        guard let session = connection.userData as? Session else { return }
        connection.userData = nil
        queue.async { [self] in
            session.isClosed = true
            session.expiry?.cancel()
            session.expiry = nil
            session.heldMessages = []
            for listener in session.listeners.values { remove(listener) }
            session.listeners = [:]
            session.release()
            sessions[connection.id] = nil
            health.update { $0.connections = sessions.count }
            logger.debug(
                "connection closed",
                metadata: ["tandem.session": "\(session.id)", "tandem.close": "\(event)"])
        }
    }

    // MARK: - Messages (queue)

    /// Handles one decoded message and counts it off the session's pending messages.
    private func handle(_ decoded: Result<ClientMessage, WireError>, from session: Session) {
        Confinement.check(queue)
        if !session.isClosed && !isStopped { respond(to: decoded, from: session) }
        if session.pendingMessages.subtract(1, ordering: .relaxed).newValue <= Self.pendingLowMark {
            session.connection.resumeReceiving()
        }
    }

    private func respond(to decoded: Result<ClientMessage, WireError>, from session: Session) {
        session.messagesHandled += 1
        if let faults, faults.dropsConnection(messageCount: session.messagesHandled) {
            drop(session, "injected fault: connection dropped")
            return
        }
        if session.awaitingKeys {
            guard session.heldMessages.count < Session.maxHeldMessages else {
                let reason = "more than \(Session.maxHeldMessages) messages before the token was verified"
                session.send(WireError(.rateLimited, reason))
                session.connection.close(code: .policyViolation, reason: reason)
                session.isClosed = true
                return
            }
            session.heldMessages.append(decoded)
            return
        }
        let message: ClientMessage
        switch decoded {
        case .success(let decodedMessage): message = decodedMessage
        case .failure(let error):
            session.send(error)
            return
        }
        if case .write(let write) = message, let clientId = session.clientId {
            enqueue(write, from: session, clientId)
            return
        }
        // Anything else comes after the writes that arrived before it: a `get` sees them.
        flushWrites()
        if case .hello(let hello) = message {
            greet(session, hello)
            return
        }
        guard session.clientId != nil else {
            session.send(
                WireError(
                    .badMessage, #"send hello first: {"type":"hello","protocol":1,"clientId":"…"}"#,
                    request: message.request, target: message.target))
            return
        }
        switch message {
        case .hello: break
        case .listen(let listen): self.listen(session, listen)
        case .unlisten(let unlisten): self.unlisten(session, unlisten.target)
        case .write: break
        case .get(let get): self.get(session, get)
        case .auth(let auth): reauthenticate(session, auth.token)
        }
    }

    private func greet(_ session: Session, _ hello: ClientMessage.Hello) {
        guard storeReachable else {
            let reason = "store unavailable: this node cannot reach its database; try another node or later"
            session.send(WireError(.internal, reason))
            session.connection.close(code: .tryAgainLater, reason: reason)
            session.isClosed = true
            return
        }
        guard session.clientId == nil else {
            session.send(WireError(.badMessage, "hello was already received on this connection"))
            return
        }
        guard hello.protocolVersion == Wire.protocolVersion else {
            session.send(
                WireError(
                    .unsupportedProtocol,
                    "this server speaks protocol \(Wire.protocolVersion); the client asked for \(hello.protocolVersion)"
                ))
            return
        }
        identify(session, token: hello.token) { [self] identity in
            session.clientId = hello.clientId
            adopt(identity, for: session)
            session.send(
                .welcome(
                    .init(
                        sessionId: session.id, serverTime: configuration.clock(), limits: configuration.limits,
                        user: identity.user, expires: identity.expires)))
        }
    }

    // MARK: - Tokens (queue)

    /// Verifies a `hello` or `auth` token and calls `accept` with who it names, or refuses it
    /// (`unauthenticated`, then a 1008 close). A JWT whose `kid` the key set lacks waits for one
    /// fetch of the set (an identity provider that rotated its keys publishes the new one
    /// first); what the connection sends meanwhile waits behind it.
    private func identify(_ session: Session, token: String?, then accept: @escaping @Sendable (Identity) -> Void) {
        guard let access = configuration.access else { return accept(.anonymous) }
        do throws(AccessControl.Refusal) {
            accept(try access.identify(token))
        } catch {
            guard error.reason == .unknownKey, let keys = access.jwt?.keys else {
                return refuseToken(error, session)
            }
            session.awaitingKeys = true
            keys.refetchForUnknownKey { [self] fetched in
                queue.async { [self] in
                    session.awaitingKeys = false
                    guard !session.isClosed, !isStopped else { return }
                    do throws(AccessControl.Refusal) {
                        guard fetched else { throw error }
                        accept(try access.identify(token))
                    } catch {
                        refuseToken(error, session)
                    }
                    let held = session.heldMessages
                    session.heldMessages = []
                    for message in held where !session.isClosed { respond(to: message, from: session) }
                }
            }
        }
    }

    private func refuseToken(_ refusal: AccessControl.Refusal, _ session: Session) {
        metrics.tokenRefused(refusal.label)
        session.send(refusal.error)
        session.connection.close(code: .policyViolation, reason: refusal.error.message)
        session.isClosed = true
    }

    /// The session's user is `identity` from now on; a token that expires closes the
    /// connection at its `exp` (with the leeway) unless another comes first.
    private func adopt(_ identity: Identity, for session: Session) {
        session.identity = identity
        session.expiry?.cancel()
        session.expiry = nil
        guard let expires = identity.expires else { return }
        let leeway = configuration.access?.jwt?.verifier.configuration.leeway.components.seconds ?? 0
        let seconds = Double(expires + leeway) - Date().timeIntervalSince1970
        let timer = DispatchSource.makeTimerSource(queue: queue)
        timer.schedule(deadline: .now() + max(0, seconds))
        timer.setEventHandler { [weak self, weak session] in
            guard let self, let session, !session.isClosed, session.identity.expires == expires else { return }
            self.metrics.tokenRefused(TokenRefusal.expired.rawValue)
            let reason = "the token expired: send auth with a new token before it expires, or connect again with one"
            session.send(WireError(.unauthenticated, reason))
            session.connection.close(code: .policyViolation, reason: "the token expired")
            session.isClosed = true
        }
        timer.resume()
        session.expiry = timer
    }

    /// `auth`: a fresh token for the open connection. It must name the same user; every live
    /// listener is then decided again under its claims, and `authenticated` answers.
    private func reauthenticate(_ session: Session, _ token: String) {
        identify(session, token: token) { [self] identity in
            guard identity.user == session.user else {
                let message =
                    "the new token names \(AccessControl.describe(identity.user)), not \(who(session)): "
                    + "connect again to change users"
                return refuseToken(
                    AccessControl.Refusal(error: WireError(.unauthenticated, message), label: "other_user"), session)
            }
            adopt(identity, for: session)
            redecide(Array(session.listeners.values))
            session.send(.authenticated(.init(user: identity.user, expires: identity.expires)))
        }
    }

    private func get(_ session: Session, _ get: ClientMessage.Get) {
        do {
            let refusal = WireError(
                .permissionDenied, "\(who(session)) may not read \(get.collection)", request: get.request)
            let scope = try readScope(get.collection, session).scope
            guard scope != .none else { return session.send(refusal) }
            let stored = try store.document(in: get.collection, id: get.id).flatMap { $0.deleted ? nil : $0 }
            // Under rules that look at each document, one the user may not read and one that
            // does not exist get the same answer.
            if scope == .perDocument, try !mayRead(stored?.fields ?? [:], in: get.collection, session) || stored == nil
            {
                return session.send(refusal)
            }
            guard let stored else {
                session.send(
                    WireError(.notFound, "document '\(get.collection)/\(get.id)' does not exist", request: get.request))
                return
            }
            session.send(.document(.init(request: get.request, document: try stored.document)))
        } catch {
            session.send(internalError(error, request: get.request))
        }
    }

    /// Drops a connection at once, without answering what it sent (injected faults).
    func drop(_ session: Session, _ reason: String) {
        logger.warning("\(reason)", metadata: ["tandem.session": "\(session.id)"])
        session.connection.abort(code: .internalError, reason: reason)
        session.isClosed = true
    }

    // MARK: - The store's news

    /// Another node committed to these collections (nil: read every followed feed, after the
    /// store's connection came back or on its periodic check).
    func storeNews(_ collections: Set<CollectionPath>?) {
        Confinement.check(queue)
        guard !isStopped, storeReachable else { return }
        if let collections {
            scheduleFeedRound(collections.filter { followed[$0] != nil })
        } else {
            scheduleFeedRound(Set(followed.keys))
        }
    }

    /// The store stopped or started answering.
    func storeReachability(_ reachable: Bool) {
        Confinement.check(queue)
        guard !isStopped, reachable != storeReachable else { return }
        storeReachable = reachable
        health.update { $0.storeReachable = reachable }
        if reachable {
            logger.notice("the store answers again; accepting connections")
            return
        }
        logger.error(
            "the store is unreachable; closing connections so that clients go to another node",
            metadata: ["tandem.connections": "\(sessions.count)"])
        for session in sessions.values where !session.isClosed {
            session.connection.close(
                code: .tryAgainLater, reason: "store unavailable: this node lost its database; reconnect")
            session.isClosed = true
            for listener in session.listeners.values { remove(listener) }
            session.listeners = [:]
        }
    }

    /// Holds the deliveries of every connection until ``releaseDeliveries()``.
    func holdDeliveries() {
        Confinement.check(queue)
        flushWrites()
        holdsDeliveries = true
    }

    func releaseDeliveries() {
        Confinement.check(queue)
        holdsDeliveries = false
        for session in sessions.values { session.release() }
    }

    func internalError(_ error: any Error, request: String? = nil, target: String? = nil) -> WireError {
        logger.error("storage failed", metadata: ["tandem.error": "\(error)"])
        return WireError(
            .internal, "the server could not read or write its database; nothing was changed. Retry later.",
            request: request, target: target)
    }
}

/// What a running server holds.
public struct ServerStats: Sendable, Equatable {
    public var connections: Int
    public var listeners: Int
    public var liveListeners: Int
    /// Messages held back by ``TandemServer/holdDeliveries()`` or an injected delay.
    public var heldMessages: Int
}

extension ClientMessage {
    var request: String? {
        switch self {
        case .write(let write): write.request
        case .get(let get): get.request
        default: nil
        }
    }

    var target: String? {
        switch self {
        case .listen(let listen): listen.target
        case .unlisten(let unlisten): unlisten.target
        default: nil
        }
    }
}
