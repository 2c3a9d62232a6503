import Dispatch
import TandemWire

/// A `write` message waiting for the next group commit.
struct WaitingWrite {
    var session: Session
    var clientId: ClientName
    var write: ClientMessage.Write
    /// Set once the write was in a commit whose answer was lost and was found not applied:
    /// when a new attempt loses its answer too, the node stops trying to find out here.
    var doubtDeadline: ContinuousClock.Instant? = nil
}

/// What a group's transaction worked out, kept outside it: when the commit's answer is lost,
/// the node still knows what it would answer once it learns that the commit took effect.
struct GroupCommit {
    /// The indices, among the waiting writes, of those the group took, with their outcomes.
    var requests: [Int]
    var outcomes: [WriteOutcome]
    /// The last sequence the group gave out in each collection it wrote to.
    var lastSequences: [CollectionPath: Int64]
    /// One idempotency record the group saved: found in the store, it shows the commit took
    /// effect. Nil when the group saved nothing (resends, conflicts, refusals).
    var witness: IdempotencyRecord?
}

/// A group commit whose answer was lost, held until the node finds out whether it took effect.
struct CommitInDoubt {
    var waiting: [WaitingWrite]
    /// The answers of the writes the group did not take.
    var answers: [ServerMessage?]
    var commit: GroupCommit
    /// Past this, the writes are answered `outcome-unknown`.
    var deadline: ContinuousClock.Instant
    /// Some of the writes were in doubt before, found not applied, and applied again.
    var isRetry: Bool
}

/// The node tried for as long as it may.
private struct StoreAttemptsExhausted: Error, CustomStringConvertible {
    var description: String { "the writes lost the answer of every commit until the deadline" }
}

extension ServerCore {
    /// Past this many ops waiting, the group commits at once instead of waiting for the queue
    /// to run its flush.
    static let groupCommitOps = 5000

    /// Queues a write for the next group commit, which runs once the messages already on the
    /// core queue have been taken in (they may be writes that join the group).
    func enqueue(_ write: ClientMessage.Write, from session: Session, _ clientId: ClientName) {
        Confinement.check(queue)
        waitingWrites.append(WaitingWrite(session: session, clientId: clientId, write: write))
        waitingOps += write.ops.count
        if waitingOps >= Self.groupCommitOps {
            flushWrites()
        } else if !flushScheduled {
            flushScheduled = true
            queue.async { [self] in flushWrites() }
        }
    }

    /// Applies every waiting write in one transaction (one sync to disk for all of them),
    /// then answers each, in the order they arrived, then sends the changes to listeners.
    ///
    /// Each write is still all or nothing on its own: one refused or conflicting write leaves
    /// the others of the group unaffected. An `ack` goes out only after the commit that holds
    /// its write returned, so an acknowledged write is durable. When the commit's result is
    /// lost, nothing is answered until the node finds out what happened
    /// (``resolveCommitInDoubt()``), and no later group commits before then, so that answers
    /// keep their order.
    func flushWrites() {
        Confinement.check(queue)
        flushScheduled = false
        guard !waitingWrites.isEmpty, !isStopped, commitInDoubt == nil else { return }
        let waiting = waitingWrites
        waitingWrites = []
        waitingOps = 0

        // Checks that need no database, in arrival order; the rest goes to the group.
        var answers: [ServerMessage?] = Array(repeating: nil, count: waiting.count)
        var requests: [(index: Int, request: WriteRequest)] = []
        for (index, entry) in waiting.enumerated() {
            switch prepare(entry) {
            case .failure(let error): answers[index] = .error(error)
            case .success(let request): requests.append((index, request))
            }
        }
        guard !requests.isEmpty else { return deliver(waiting, answers, nil) }

        let collections = Set(requests.flatMap { $0.request.ops.map(\.collection) }).sorted()
        var commit: GroupCommit?
        if let cut = configuration.hooks.cutsStoreAtCommit { store.cutNextCommit(cut()) }
        do {
            try store.write(locking: collections) { transaction in
                commit = try groupCommit(requests, in: transaction)
                configuration.hooks.beforeCommit?()
            }
        } catch let lost as CommitOutcomeUnknown where commit?.witness != nil {
            logger.error(
                "a group commit's answer was lost; finding out whether it took effect",
                metadata: ["tandem.error": "\(lost)", "tandem.writes": "\(requests.count)"])
            let deadlines = waiting.compactMap(\.doubtDeadline)
            commitInDoubt = CommitInDoubt(
                waiting: waiting, answers: answers, commit: commit!,
                deadline: deadlines.min() ?? ContinuousClock.now + configuration.commitOutcomeTimeout,
                isRetry: !deadlines.isEmpty)
            return resolveCommitInDoubt()
        } catch is CommitOutcomeUnknown {
            // The group saved nothing (resends, conflicts, refusals): its answers hold either way.
        } catch {
            let failure = internalError(error)
            for (index, _) in requests {
                var answer = failure
                answer.request = waiting[index].write.request
                answers[index] = .error(answer)
            }
            return deliver(waiting, answers, nil)
        }
        deliver(waiting, answers, commit)
    }

    /// Applies the group's messages in the store's transaction and saves what they wrote:
    /// each message's outcome, the last sequence of each collection written, and the group's
    /// witness (how a commit whose answer is lost is found out).
    private func groupCommit(_ requests: [(index: Int, request: WriteRequest)], in transaction: any StoreTransaction)
        throws -> GroupCommit
    {
        let group = try WriteGroup(
            transaction, requests: requests.map(\.request), access: configuration.access, now: configuration.clock(),
            maxDocumentBytes: configuration.limits.maxDocumentBytes)
        let outcomes = try requests.map { try group.apply($0.request) }
        try group.save()
        var lastSequences: [CollectionPath: Int64] = [:]
        for collection in group.writtenCollections { lastSequences[collection] = group.lastSequence(in: collection) }
        return GroupCommit(
            requests: requests.map(\.index), outcomes: outcomes, lastSequences: lastSequences, witness: group.witness)
    }

    /// Sends each waiting write its answer, in arrival order: `answers` for those the group
    /// did not take, `commit`'s outcomes for the others; then the changes to listeners.
    private func deliver(_ waiting: [WaitingWrite], _ answers: [ServerMessage?], _ commit: GroupCommit?) {
        var answers = answers
        if let commit {
            for (index, outcome) in zip(commit.requests, commit.outcomes) {
                let request = waiting[index].write.request
                switch outcome {
                case .applied(let results, let sequences):
                    answers[index] = .ack(.init(request: request, results: results))
                    noteOwnWrites(waiting[index], results, sequences, commit.lastSequences)
                case .conflict(let op, let server):
                    answers[index] = .conflict(.init(request: request, op: op, server: server))
                case .refused(var error):
                    error.request = request
                    answers[index] = .error(error)
                }
            }
        }
        for (entry, answer) in zip(waiting, answers) {
            guard let answer else { continue }
            metrics.answered(entry.write, with: answer)
            if case .ack = answer, let faults, faults.losesAck() {
                // Committed, but the answer is lost with the connection.
                drop(entry.session, "injected fault: acknowledgement lost")
            } else {
                entry.session.send(answer)
            }
        }
        if let written = commit?.lastSequences.keys, !written.isEmpty { runFeedRound(Set(written)) }
    }

    /// Finds out whether the commit in doubt took effect, from the idempotency record it
    /// saved: found as the group wrote it, the commit happened, and its writes get the answers
    /// worked out in it; not found, it did not, and the writes go back to the head of the queue
    /// to be applied now (a commit still under way on the database when the record was read
    /// holds the collections' locks, so the new attempt waits for it and then finds its records,
    /// answering as resends). While the database cannot be asked, it tries again until
    /// ``ServerConfiguration/commitOutcomeTimeout``, then answers `outcome-unknown`.
    func resolveCommitInDoubt() {
        Confinement.check(queue)
        guard let doubt = commitInDoubt, !isStopped else { return }
        let witness = doubt.commit.witness!
        let givesUp = ContinuousClock.now >= doubt.deadline || doubt.waiting.allSatisfy(\.session.isClosed)
        do {
            let found = try store.recordedResult(user: witness.user, client: witness.client, key: witness.key)
            if let found, found.id == witness.result.id, found.version == witness.result.version,
                found.updateTime == witness.result.updateTime
            {
                logger.notice("the commit in doubt took effect; answering its writes")
                metrics.commitInDoubt(found: .committed)
                commitInDoubt = nil
                deliver(doubt.waiting, doubt.answers, doubt.commit)
                return flushWrites()
            }
            guard !givesUp else { throw CommitOutcomeUnknown(cause: StoreAttemptsExhausted()) }
            logger.notice("the commit in doubt did not take effect; applying its writes again")
            metrics.commitInDoubt(found: .notCommitted)
            // A second attempt that lost its answer too (a disk that fails every sync) waits a
            // little first; later writes wait behind it meanwhile.
            let start: DispatchTime = doubt.isRetry ? .now() + .milliseconds(100) : .now()
            queue.asyncAfter(deadline: start) { [self] in
                commitInDoubt = nil
                var again = doubt.waiting
                for index in again.indices { again[index].doubtDeadline = doubt.deadline }
                waitingWrites.insert(contentsOf: again, at: 0)
                waitingOps += again.reduce(0) { $0 + $1.write.ops.count }
                flushWrites()
            }
        } catch {
            guard !givesUp else {
                commitInDoubt = nil
                logger.error(
                    "could not find out whether a commit took effect; its writes are answered outcome-unknown",
                    metadata: ["tandem.error": "\(error)"])
                metrics.commitInDoubt(found: .unknown)
                var answers = doubt.answers
                for index in doubt.commit.requests {
                    answers[index] = .error(
                        WireError(
                            .outcomeUnknown,
                            "the server lost its database while committing this write and could not find out "
                                + "whether it was applied; resend it with the same idempotency keys",
                            request: doubt.waiting[index].write.request))
                }
                deliver(doubt.waiting, answers, nil)
                return flushWrites()
            }
            queue.asyncAfter(deadline: .now() + .milliseconds(100)) { [self] in resolveCommitInDoubt() }
        }
    }

    /// Notes what a connection's acknowledged write left, for its listeners that leave out
    /// their own writes: the versions, for the fan-out (a remembered resend's result counts
    /// too: the connection was answered with that version); the feed sequences, for catch-up
    /// pages, which read the rows from the store after the fan-out forgot them.
    private func noteOwnWrites(
        _ entry: WaitingWrite, _ results: [WriteResult], _ sequences: [Int64?],
        _ lastSequences: [CollectionPath: Int64]
    ) {
        let session = entry.session
        let ops = entry.write.ops
        if session.excludesOwnWrites {
            // (Not a delete's: its tombstone is never left out.)
            for (op, result) in zip(ops, results) where op.kind != .delete {
                guard let follower = followed[op.collection] else { continue }
                follower.ownWrites[result.id] = FeedFollower.OwnWrite(
                    version: result.version, session: session.id,
                    upTo: lastSequences[op.collection] ?? follower.head + 1)
            }
        }
        // The sequences, for the ops of one collection at a time (a write's ops are mostly in one).
        var start = 0
        while start < ops.count {
            let collection = ops[start].collection
            var end = start + 1
            while end < ops.count, ops[end].collection == collection { end += 1 }
            if session.notesAnswers(in: collection) { session.noteAnswered(sequences[start..<end], in: collection) }
            start = end
        }
    }

    /// The checks of a write that need no database: the op count, injected refusals, each
    /// document's size, and idempotency keys that repeat within the write.
    private func prepare(_ entry: WaitingWrite) -> Result<WriteRequest, WireError> {
        let write = entry.write
        let limits = configuration.limits
        guard write.ops.count <= limits.maxOpsPerWrite else {
            return .failure(
                WireError(
                    .tooLarge,
                    "a write may carry at most \(limits.maxOpsPerWrite) ops; this one has \(write.ops.count)",
                    request: write.request))
        }
        if let faults, faults.rejectsWrite() {
            logger.warning("injected fault: write refused", metadata: ["tandem.session": "\(entry.session.id)"])
            return .failure(
                WireError(
                    faults.plan.rejectedWriteCode, "injected fault: the write was refused and not applied",
                    request: write.request))
        }
        var fieldsJSON: [String] = []
        fieldsJSON.reserveCapacity(write.ops.count)
        var keys: [ClientName: Int] = [:]
        keys.reserveCapacity(write.ops.count)
        for (index, op) in write.ops.enumerated() {
            if let first = keys.updateValue(index, forKey: op.idempotencyKey) {
                return .failure(
                    WireError(
                        .badMessage,
                        "ops[\(index)].idempotencyKey: '\(op.idempotencyKey)' is also the key of ops[\(first)]; "
                            + "each op of a write needs its own key",
                        request: write.request, op: index))
            }
            // The text the decoder read straight from the message, or the tree encoded (a merge's,
            // or fields with what only the parser reads, such as escapes).
            let json =
                op.kind == .delete ? "{}" : String(decoding: op.canonicalFieldsJSON ?? Array("{}".utf8), as: UTF8.self)
            if json.utf8.count > limits.maxDocumentBytes {
                return .failure(
                    WireError(
                        .tooLarge,
                        "ops[\(index)].fields: the document is \(json.utf8.count) bytes; the limit is \(limits.maxDocumentBytes)",
                        request: write.request, op: index))
            }
            fieldsJSON.append(json)
        }
        return .success(
            WriteRequest(
                ops: write.ops, fieldsJSON: fieldsJSON, client: entry.clientId, identity: entry.session.identity))
    }
}
