import TandemWire

/// A `write` message waiting for the next group commit.
struct WaitingWrite {
    var session: Session
    var clientId: ClientName
    var write: ClientMessage.Write
}

extension ServerCore {
    /// Past this many ops waiting, the group commits at once instead of waiting for the queue
    /// to run its flush.
    static let groupCommitOps = 5000

    /// Queues a write for the next group commit, which runs once the messages already on the
    /// core queue have been taken in (they may be writes that join the group).
    func enqueue(_ write: ClientMessage.Write, from session: Session, _ clientId: ClientName) {
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
    /// its write returned, so an acknowledged write is durable.
    func flushWrites() {
        flushScheduled = false
        guard !waitingWrites.isEmpty, !isStopped else { return }
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

        var written: Set<CollectionPath> = []
        var lastSequences: [CollectionPath: Int64] = [:]
        if !requests.isEmpty {
            let collections = Set(requests.flatMap { $0.request.ops.map(\.collection) }).sorted()
            do {
                let outcomes = try store.write(locking: collections) { transaction in
                    let group = try WriteGroup(
                        transaction, requests: requests.map(\.request), access: configuration.access,
                        now: configuration.clock(), maxDocumentBytes: configuration.limits.maxDocumentBytes)
                    let outcomes = try requests.map { try group.apply($0.request) }
                    try group.save()
                    written = group.writtenCollections
                    for collection in written { lastSequences[collection] = group.lastSequence(in: collection) }
                    configuration.hooks.beforeCommit?()
                    return outcomes
                }
                for ((index, _), outcome) in zip(requests, outcomes) {
                    let request = waiting[index].write.request
                    switch outcome {
                    case .applied(let results, let sequences):
                        answers[index] = .ack(.init(request: request, results: results))
                        noteOwnWrites(waiting[index], results, sequences, lastSequences)
                    case .conflict(let op, let server):
                        answers[index] = .conflict(.init(request: request, op: op, server: server))
                    case .refused(var error):
                        error.request = request
                        answers[index] = .error(error)
                    }
                }
            } catch {
                let failure = internalError(error)
                for (index, _) in requests {
                    var answer = failure
                    answer.request = waiting[index].write.request
                    answers[index] = .error(answer)
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
        if !written.isEmpty { runFeedRound(written) }
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
            WriteRequest(ops: write.ops, fieldsJSON: fieldsJSON, client: entry.clientId, user: entry.session.user))
    }
}
