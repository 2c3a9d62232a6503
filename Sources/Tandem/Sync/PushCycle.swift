import TandemWire

/// The push cycle's decisions, as a state machine in the style of postgres-nio's
/// `ConnectionStateMachine`: each event the push reports (a batch prepared, an answer
/// received) is a pure transition from one state to the next, and returns what the push must
/// do. ``SyncService/push()`` performs the actions (reads the ledger, sends, waits, writes
/// back); this type does no I/O, so its transitions are unit-tested without sockets or SQLite.
///
/// The cycle: prepare a batch of filed deletes and dirty rows → send it → (more batches, up to
/// `depth` on their way) → await the oldest answer → write it back or settle what it refused →
/// again, until nothing is left to prepare and nothing is on its way.
///
/// - A batch that creates rows others depend on (parents, reference targets) is answered
///   before the next is prepared: the next may need the server ids it brings.
/// - After `maxBatches` batches the push stops preparing (listener work waits behind its
///   barrier) and asks for another push for the rest.
/// - A refused op, a conflict or a push passing rows over leaves work for another push,
///   queued as soon as this one ends.
/// - A push that stops with answers unread or not written back must drop its connection: the
///   server counts those writes as known to the connection, and its listeners leave them
///   out. A new connection hears them again, and the recorded keys settle the rest.
struct PushCycle: Equatable {
    /// What the push does next.
    enum Step: Equatable {
        /// Read the next batch from the ledger and report it with ``prepared(_:passedOver:)``.
        case prepare
        /// Wait for the oldest batch on its way, and report its answer with ``answered(_:batchSize:)``.
        case awaitOldest
        /// Nothing is left to prepare or to await; with `pushAgain`, queue another push at once.
        case finish(pushAgain: Bool)
    }

    /// A batch as the ledger gave it.
    struct Batch: Equatable {
        /// It creates rows of a table others nest under or reference.
        var createsDependedOn: Bool
        /// It read every filed delete and dirty row there was when it was taken.
        var reachedEnd: Bool
    }

    /// How the server answered a batch, as far as the cycle's decisions go.
    enum Answer: Equatable {
        /// Applied; `creates` of its ops made new documents.
        case acknowledged(creates: Int)
        /// An op's base version was stale: nothing was applied.
        case conflict(op: Int)
        /// The server refused the batch (nothing was applied), naming the op when one was the cause.
        case refused(ErrorCode, op: Int?)
        /// No answer: a timeout, or the connection failed. The batch may have been applied.
        case lost
    }

    /// What to do with an op the server refused alone.
    enum Refusal: Equatable {
        /// Its document is gone: the row's bookkeeping says so.
        case notFound
        /// The server will never take it (access, validation): the row is failed.
        case reject
        /// Perhaps a passing refusal: a failed attempt, retried up to the configured maximum.
        case countAttempt
    }

    /// What the push does with an answer.
    enum Settlement: Equatable {
        /// Write the acknowledgement back.
        case writeBack
        /// Resolve the conflict of this op; the others go out again.
        case resolveConflict(op: Int)
        /// Settle this op as said; the batch's others go out again.
        case refuseOne(op: Int, Refusal)
        /// Fail every row of the batch: the server will never take it.
        case rejectAll
        /// Stop the push with the error. `countsAttempt`: a failed attempt of each row (not
        /// when the outcome is unknown: the resend under the same keys finds it out);
        /// `resendSoon`: queue that resend after the reconnect delay.
        case stop(countsAttempt: Bool, resendSoon: Bool)
    }

    private let depth: Int
    private let maxBatches: Int
    /// Of each batch on its way, oldest first: whether it creates rows others depend on.
    private var inFlight: [Bool] = []
    /// No batch is to be prepared in this push (the ledger ran out, or enough were).
    private var exhausted = false
    /// The last batch read every row there was when it was taken.
    private var endReached = false
    private var batches = 0
    private var createsAcknowledged = 0
    /// Ops not applied (refused, conflicting, passed over) are waiting for another push.
    private var leftBehind = false
    /// A row was passed over in the ledger: it waits for its parent's or target's server id.
    private var passedOver = false
    /// The oldest answer was taken and is not settled yet.
    private var answering = false
    /// An answer was settled since the last step: only then may a local commit reopen the
    /// preparing, so that a batch's write-back (a filed delete's new base version, say) comes
    /// before the next batch is read.
    private var settled = false
    private var finished = false

    /// - Parameters:
    ///   - depth: How many batches may be on their way at once (at least one).
    ///   - maxBatches: After how many batches the push leaves the rest to another one.
    init(depth: Int, maxBatches: Int = 64) {
        self.depth = max(1, depth)
        self.maxBatches = maxBatches
    }

    /// The next step. `localCommitQueued`: a local commit since the push started queued
    /// another one, which waits behind it; what it filed goes out in this push instead.
    mutating func next(localCommitQueued: Bool) -> Step {
        answering = false
        defer { settled = false }
        if settled && endReached && localCommitQueued {
            exhausted = false
            endReached = false
        }
        if !exhausted && inFlight.count < depth && inFlight.last != true {
            if batches < maxBatches { return .prepare }
            // Long enough: listener work waits behind this push's barrier.
            leftBehind = true
            exhausted = true
        }
        guard !inFlight.isEmpty else {
            finished = true
            return .finish(pushAgain: leftBehind || (passedOver && createsAcknowledged > 0))
        }
        inFlight.removeFirst()
        answering = true
        return .awaitOldest
    }

    /// The ledger gave a batch (nil: nothing left). Returns whether to send it.
    ///
    /// - Parameter passedOver: Whether the push has passed a row over so far.
    mutating func prepared(_ batch: Batch?, passedOver: Bool) -> Bool {
        self.passedOver = passedOver
        guard let batch else {
            exhausted = true
            return false
        }
        // Rows under or referring to the rows a batch creates were not read at all: after its
        // answer, the push looks again.
        endReached = batch.reachedEnd && !batch.createsDependedOn
        exhausted = endReached
        batches += 1
        inFlight.append(batch.createsDependedOn)
        return true
    }

    /// The oldest batch's answer (of `batchSize` ops): what to do with it.
    mutating func answered(_ answer: Answer, batchSize: Int) -> Settlement {
        settled = true
        switch answer {
        case .acknowledged(let creates):
            createsAcknowledged += creates
            return .writeBack
        case .conflict(let op):
            leftBehind = true
            return .resolveConflict(op: op)
        case .refused(let code, let op):
            // The server's own answer: nothing of the batch was applied, nothing is unread.
            answering = false
            if let op, (0..<batchSize).contains(op) {
                leftBehind = true
                let refusal: Refusal = code == .notFound ? .notFound : code.isRejection ? .reject : .countAttempt
                return .refuseOne(op: op, refusal)
            }
            if code.isRejection { return .rejectAll }
            let unknown = code == .outcomeUnknown
            return .stop(countsAttempt: !unknown, resendSoon: unknown)
        case .lost:
            return .stop(countsAttempt: true, resendSoon: false)
        }
    }

    /// Whether a push that ends here (thrown out of) must drop its connection: it leaves an
    /// answer unsettled, or batches on their way.
    var leavesAnswersUnread: Bool { !finished && (answering || !inFlight.isEmpty) }
}
