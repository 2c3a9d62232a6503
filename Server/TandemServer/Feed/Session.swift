import Dispatch
import Foundation
import Synchronization
import TandemSocket
import TandemWire

/// One client connection as the server sees it: who it is and what it listens to.
///
/// Confined to the server's core queue, except `pendingMessages`, `decoder` and `decoding`,
/// which the socket's service thread uses as messages arrive.
final class Session: @unchecked Sendable {
    let connection: WebSocketConnection
    let metrics: ServerMetrics
    let id = DocumentID.random().rawValue
    /// Set by `hello`; nothing else is accepted before it.
    var clientId: ClientName?
    /// Who its token names: the user (nil on an open server, or for anonymous clients) and,
    /// for a JWT, its verified claims.
    var identity = Identity.anonymous
    var user: String? { identity.user }
    /// When the JWT's `exp` is reached (with the leeway) the connection is closed, unless an
    /// `auth` message brought a newer token first (``ServerCore/expire(_:)``).
    var expiry: (any DispatchSourceTimer)?
    /// A token names a key the set lacks, and the set is being fetched again: what arrives
    /// meanwhile waits here, in order (at most ``maxHeldMessages``).
    var awaitingKeys = false
    var heldMessages: [Result<ClientMessage, WireError>] = []
    static let maxHeldMessages = 256
    /// The connection's listeners by target.
    var listeners: [String: Listener] = [:]
    /// Some listener of this connection leaves out its own writes: its acknowledged writes are
    /// noted for the fan-out (``FeedFollower/ownWrites``).
    var excludesOwnWrites: Bool { listeners.values.contains { $0.excludesOwnWrites } }
    var isClosed = false
    /// Where this connection's acknowledged writes left their documents, by collection: the
    /// feed sequences the writes gave them, as runs of consecutive sequences (a batch of
    /// creates that commits alone is one run). A row keeps its sequence until it is written
    /// again, so a row found at one of them holds the state this connection was answered
    /// with, and its listeners that leave out their own writes leave it out of their catch-up
    /// pages too, writes answered before the `listen` included: a device that pushes what it
    /// wrote offline and then listens does not download it all again.
    ///
    /// Noted only while it may serve: for a collection this connection has no live listener
    /// on, or one with the flag still catching up. Once a listener of it there is live and
    /// none with the flag catches up, what was noted goes (a live listener with the flag has
    /// the fan-out leave the writes out). At most ``maxAnsweredRuns`` runs in all: past them a
    /// write is noted only where it extends the last run. A resend answered from memory is not
    /// noted (its row's sequence is not known here).
    private(set) var answered: [CollectionPath: RangeSet<Int64>] = [:]
    private var answeredRuns = 0
    static let maxAnsweredRuns = 1024

    /// Notes the sequences of a write's ops in `collection` (nil for one not noted).
    func noteAnswered(_ sequences: ArraySlice<Int64?>, in collection: CollectionPath) {
        var runs = answered.removeValue(forKey: collection) ?? RangeSet()
        Self.note(sequences, in: &runs, counting: &answeredRuns, cap: Self.maxAnsweredRuns)
        if !runs.isEmpty { answered[collection] = runs }
    }

    /// Adds `sequences` (the nil ones aside) to `runs`, with `count` keeping the number of runs
    /// of every collection; past `cap` runs, sequences go in only where they extend the last
    /// run. A write's ops mostly hold consecutive sequences: each run of them goes in at once
    /// (one at a time, the inserts were 1 % of bench throughput's samples). What is noted is
    /// only ever a write's own sequences: noting fewer of them (past the cap) sends the
    /// connection some of its own writes, never leaves out another's.
    static func note(
        _ sequences: ArraySlice<Int64?>, in runs: inout RangeSet<Int64>, counting count: inout Int, cap: Int
    ) {
        var index = sequences.startIndex
        while index < sequences.endIndex {
            guard let start = sequences[index] else {
                index += 1
                continue
            }
            var end = start + 1
            index += 1
            while index < sequences.endIndex, sequences[index] == end {
                end += 1
                index += 1
            }
            var run = start..<end
            if count >= cap {
                // Past the cap, only what extends the last run goes in.
                guard let last = runs.ranges.last?.upperBound, run.contains(last) else { continue }
                run = last..<end
            }
            let before = runs.ranges.count
            runs.insert(contentsOf: run)
            count += runs.ranges.count - before
        }
    }

    func forgetAnswered(in collection: CollectionPath) {
        answeredRuns -= answered.removeValue(forKey: collection)?.ranges.count ?? 0
    }

    /// Whether its acknowledged writes to `collection` are noted in ``answered``: while it has
    /// no live listener on the collection, or one that leaves them out is still catching up.
    func notesAnswers(in collection: CollectionPath) -> Bool {
        var live = false
        for listener in listeners.values where listener.collection == collection {
            if !listener.isLive && listener.catchUpLeavesOutOwnWrites { return true }
            if listener.isLive { live = true }
        }
        return !live
    }

    /// Messages received and not yet handled: past a high mark the socket stops reading.
    let pendingMessages = Atomic<Int>(0)
    /// Where large messages are decoded, in order, off the core queue (see
    /// `ServerCore.webSocket(_:didReceive:)`): one of a few serial queues the sessions share,
    /// two per core, not the global concurrent pool. In a process that also runs devices (tests,
    /// benchmarks, an app with an embedded server), their pushes block that pool's few threads
    /// while they wait for the answer, which this queue must decode first (seen as stalls of up
    /// to a second, until libdispatch adds a thread); and a queue per session would start a
    /// thread per session in a burst of large writes.
    var decoder: DispatchQueue { Self.decoders[Int(connection.id % UInt64(Self.decoders.count))] }
    private static let decoders = (0..<max(4, 2 * ProcessInfo.processInfo.activeProcessorCount)).map {
        DispatchQueue(label: "tandem.session.decode.\($0)")
    }
    /// Messages given to `decoder` and not yet passed on to the core queue.
    let decoding = Atomic<Int>(0)
    /// Messages handled so far (for injected faults).
    var messagesHandled = 0
    /// Outgoing frames held back by an injected delay, in order; nil when not holding.
    private var held: [OutboundMessage]?

    init(connection: WebSocketConnection, metrics: ServerMetrics) {
        self.connection = connection
        self.metrics = metrics
    }

    /// Encodes and queues a message (or holds it, during an injected delay). A connection that
    /// is closing drops it silently: its session is about to go.
    func send(_ message: ServerMessage) {
        guard !isClosed else { return }
        send(frame: OutboundMessage(textAfterHeadroom: Wire.encode(message, after: OutboundMessage.headroom)))
    }

    /// Queues an encoded frame (or holds it, during an injected delay).
    func send(frame: OutboundMessage) {
        guard !isClosed else { return }
        if held != nil {
            held!.append(frame)
            return
        }
        do {
            try connection.send(frame)
        } catch  where error.code == .sendQueueOverflow {
            // The connection closed itself (1008); its close event ends the session.
            metrics.closedSlowConsumer()
        } catch {
            // Closing already: the session is about to go.
        }
    }

    var isHolding: Bool { held != nil }

    /// Frames held back now.
    var heldCount: Int { held?.count ?? 0 }

    /// Holds every outgoing message from now on (an injected delay), keeping their order.
    func hold() {
        if held == nil { held = [] }
    }

    /// Sends what was held, in order.
    func release() {
        guard let messages = held else { return }
        held = nil
        for frame in messages { send(frame: frame) }
    }

    func send(_ error: WireError) {
        send(.error(error))
    }
}

/// What a node follows of one collection's change feed: how far it has read it, the listeners
/// of the collection (those that are live hear each new change), and the listeners whose read
/// permission depends on documents of the collection. Confined to the core queue.
final class FeedFollower {
    /// The feed has been read up to this sequence.
    var head: Int64
    /// The collection's listeners without a query, catching up or live.
    var listeners: [Listener] = []
    /// Its listeners on queries, catching up or live, and their index.
    var queryListeners: [ObjectIdentifier: Listener] = [:]
    let queries = QueryIndex()
    /// Listeners by the document of this collection their permission depends on.
    var watching: [DocumentID: [ObjectIdentifier: Listener]] = [:]
    /// Documents at the version a connection's own write brought them to, for its listeners
    /// that leave out their own writes; until the feed passes the commit (`upTo`).
    var ownWrites: [DocumentID: OwnWrite] = [:]

    struct OwnWrite {
        var version: Int64
        /// The writing session's id (not its address, which a later connection may reuse).
        var session: String
        /// The collection's last sequence in the commit that wrote it.
        var upTo: Int64
    }

    /// By writer (the id of the client connection that wrote some of `rows`): the documents
    /// among them whose state is the one its own write left (which it knows from its `ack`),
    /// tombstones excepted. Read once per page, so that the listeners of connections that wrote
    /// nothing in it share the page's encoding.
    func ownWrites(in rows: [StoredDocument]) -> [String: Set<DocumentID>] {
        guard !ownWrites.isEmpty else { return [:] }
        var bySession: [String: Set<DocumentID>] = [:]
        for row in rows where !row.deleted {
            guard let write = ownWrites[row.id], write.version == row.version else { continue }
            bySession[write.session, default: []].insert(row.id)
        }
        return bySession
    }

    /// Forgets the own writes of commits the feed has passed.
    func forgetOwnWrites() {
        guard !ownWrites.isEmpty else { return }
        ownWrites = ownWrites.filter { $0.value.upTo > head }
    }

    init(head: Int64) { self.head = head }

    var isIdle: Bool { listeners.isEmpty && queryListeners.isEmpty && watching.isEmpty }

    func add(_ listener: Listener) {
        if let view = listener.view {
            queryListeners[ObjectIdentifier(listener)] = listener
            queries.add(listener, view)
        } else {
            listeners.append(listener)
        }
    }

    func remove(_ listener: Listener) {
        if let view = listener.view {
            guard queryListeners.removeValue(forKey: ObjectIdentifier(listener)) != nil else { return }
            queries.remove(listener, view)
        } else {
            listeners.removeAll { $0 === listener }
        }
    }
}

/// One `listen`: a position in a collection's change feed.
///
/// A listener starts by catching up (sending the feed after its position page by page,
/// waiting for the connection to drain between pages) and then goes live: each commit's
/// changes reach it by fan-out. A live listener whose connection holds too much still to send
/// falls behind and catches up the same way (``ServerCore/fallsBehind(_:)``), then is live
/// again. Confined to the core queue.
final class Listener: @unchecked Sendable {
    unowned let session: Session
    let target: String
    let collection: CollectionPath
    /// The sequence of the last change sent. (A live query listener's is brought forward only
    /// when a write concerns it: it has seen its follower's head too.)
    var position: Int64
    /// Caught up: fan-out sends it each commit.
    var isLive = false
    /// Removed by `unlisten` or by the connection closing.
    var isCancelled = false
    /// Waiting for the connection's send queue to drain before the next catch-up page.
    var awaitsDrain = false
    /// Was live, and fell behind (its connection's queue held too much): it catches up from
    /// the feed, with pages sent as live snapshots (not `initial`), until it is live again.
    var fellBehind = false
    /// Held by a test (``ServerHooks/holdsCatchUp``): the number of the hold, which only that
    /// hold's go-on ends; `holds` counts them.
    var heldByHook: Int?
    var holds = 0
    /// The feed's horizon when this catch-up began: should it move past the listener's
    /// position before the listener is live, documents the client holds may be gone unseen.
    var catchUpHorizon: Int64?
    /// For a listener on a query: what its client sees (nil for a whole collection).
    var view: QueryView?
    /// Live snapshots leave out what this connection's own writes made (a whole collection
    /// only), tombstones excepted: a client may keep what it knows of its delete until the
    /// tombstone comes.
    var excludesOwnWrites = false
    /// Whether its catch-up pages leave them out too (``Session/answered``): they do, but not
    /// the full snapshot after a `reset`, which a client takes as the whole truth (it drops
    /// the rows it does not bring).
    var catchUpLeavesOutOwnWrites = false
    /// For a query listener resuming: the ids of the view its client holds, as of `position`.
    var resumedView: [DocumentID]?
    /// For a query listener catching up: whether its view was read, and the frames of its
    /// first snapshot not yet queued (they go out as the connection drains).
    var viewLoaded = false
    var pendingFrames: [OutboundMessage] = []
    /// The documents its read permission was decided on: a change to one of them decides
    /// again, and may end the listener.
    var accessDependencies: Set<DocumentKey> = []

    var clientId: String? { session.clientId?.rawValue }

    /// Whether a read scope lets this listener read: one on a whole collection needs all of it
    /// (it would have no way to hear that a document left what it may read).
    func may(read scope: AccessControl.ReadScope) -> Bool {
        scope == .all || (scope == .perDocument && view != nil)
    }

    init(session: Session, target: String, collection: CollectionPath, position: Int64) {
        self.session = session
        self.target = target
        self.collection = collection
        self.position = position
    }
}
