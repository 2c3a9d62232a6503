import GRDB
import TandemWire

extension SyncService {
    /// One push: batches of filed deletes and dirty rows, each sent, answered and written back
    /// in order. Runs inside a barrier block of the sync queue.
    ///
    /// Up to ``SyncConfiguration/writesInFlight`` batches are on their way at once: the next
    /// is prepared and sent while the server applies the one before. ``PushCycle`` decides
    /// each step (when to prepare, when to wait, what an answer means, whether another push
    /// must follow); this performs them.
    ///
    /// Each batch starts after the rows of the batches before it (``PushCursor``), so a row goes
    /// out at most once per push. Rows passed over (their parent or target had no server id
    /// yet, or a refused batch left them unsent) go out in another push, queued at the end of
    /// this one when it made progress that can help them.
    ///
    /// - Throws: ``TandemError`` when not connected or when the connection fails mid-push
    ///   (the rows stay pending, their idempotency keys kept for the resend).
    @discardableResult
    func push() throws -> SyncReport {
        Confinement.check(queue.isInBarrier, "a push outside a barrier block of the sync queue \(queue.label)")
        state.withLock { $0.pushDue = nil }
        // A push that ends early shows what it left; one that ends normally reads the counts
        // once, for its report and the status.
        var countsShown = false
        defer { if !countsShown { refreshStatus() } }
        var run = try PushRun(self)
        var cycle = PushCycle(depth: configuration.writesInFlight)
        // Run in reverse: the connection goes before the listeners are refreshed, which then
        // find none to refresh on.
        defer { if run.newParents { refreshListeners() } }
        defer { if cycle.leavesAnswersUnread { dropConnection(run.connection) } }
        var cursor = PushCursor()
        var onTheirWay: [(batch: [PreparedPush], answer: ServerConnection.PendingWrite)] = []
        steps: while true {
            switch cycle.next(localCommitQueued: state.withLock { $0.pushDue != nil }) {
            case .prepare:
                let batch = try ownWrite { db in
                    try reconciler.preparePush(maxOps: run.maxOps, maxBytes: run.maxBytes, after: &cursor, db)
                }
                let shape = PushCycle.Batch(
                    createsDependedOn: creates(dependedOn: batch), reachedEnd: cursor.reachedEnd)
                guard cycle.prepared(batch.isEmpty ? nil : shape, passedOver: cursor.passedOver) else { continue }
                configuration.hooks.beforeSend?(batch.map(\.op))
                onTheirWay.append(
                    (batch, run.connection.startWrite(batch.map(\.op), timeout: configuration.requestTimeout)))
            case .awaitOldest:
                let (batch, answer) = onTheirWay.removeFirst()
                try settle(answer, of: batch, in: &cycle, &run)
            case .finish(let pushAgain):
                if pushAgain { schedulePush(after: .zero) }
                break steps
            }
        }
        if run.report.conflicts > 0 { updateStatus { $0.resolvedConflicts += run.report.conflicts } }
        let counts = try showCurrentCounts()
        countsShown = true
        run.report.pending = counts.pending
        run.report.failed = counts.failed
        return run.report
    }

    /// Waits for a batch's answer and settles it as the cycle says: writes the acknowledgement
    /// back, resolves a conflict, fails or retries what was refused, or throws.
    private func settle(
        _ answer: ServerConnection.PendingWrite, of batch: [PreparedPush], in cycle: inout PushCycle,
        _ run: inout PushRun
    ) throws {
        let result = answer.wait()
        let settlement = cycle.answered(Self.classify(result, of: batch), batchSize: batch.count)
        switch (settlement, result) {
        case (.writeBack, .success(.ack(let results))):
            try writeBack(batch, results, arrival: answer.arrival, &run)
        case (.resolveConflict(let index), .success(.conflict(_, let server))):
            if try ownWrite({ db in
                try reconciler.answeredOtherwise(batch, db)
                return try reconciler.resolvePushConflict(batch[index], server: server, db)
            }) {
                run.report.conflicts += 1
            }
        case (.refuseOne(let index, let refusal), .failure(let error)):
            let push = batch[index]
            let serverError = (error as? TandemError)?.serverError
            let failure = TandemError(
                .server, "\(push.table) row \(push.rowId): \(serverError?.message ?? "\(error)")",
                serverError: serverError)
            try ownWrite { db in
                try reconciler.answeredOtherwise(batch, db)
                switch refusal {
                case .notFound: try reconciler.recordNotFound(push, db)
                case .reject: try reconciler.ledger.fail(push.table, push.rowId, failure, db)
                case .countAttempt:
                    try reconciler.ledger.countFailedAttempt(
                        [push], failure, maxAttempts: configuration.maxAttempts, db)
                }
            }
            noteError(failure)
        case (.rejectAll, .failure(let error)):
            let refusal =
                (error as? TandemError)?.serverError.map { TandemError(server: $0) }
                ?? TandemError("push refused", error, otherwise: .server)
            try ownWrite { db in
                try reconciler.answeredOtherwise(batch, db)
                for push in batch { try reconciler.ledger.fail(push.table, push.rowId, refusal, db) }
            }
            noteError(refusal)
        case (.stop(let countsAttempt, let resendSoon), .failure(let error)):
            let failure = TandemError("push failed", error, otherwise: .database)
            try ownWrite { db in
                try reconciler.answeredOtherwise(batch, db)
                if countsAttempt {
                    try reconciler.ledger.countFailedAttempt(batch, failure, maxAttempts: configuration.maxAttempts, db)
                }
            }
            noteError(failure)
            // The server asks for the resend that finds out; it need not wait for the next
            // periodic push.
            if resendSoon { schedulePush(after: configuration.reconnectDelay) }
            // The batches still on their way keep their keys; the next push sends them again.
            throw error
        default:
            preconditionFailure("the push cycle settled \(settlement) for an answer it does not fit")
        }
    }

    /// What an answer means to the cycle.
    private static func classify(_ result: Result<ServerConnection.WriteReply, any Error>, of batch: [PreparedPush])
        -> PushCycle.Answer
    {
        switch result {
        case .success(.ack):
            return .acknowledged(creates: batch.indices.count { batch[$0].op.kind == .create })
        case .success(.conflict(let index, _)):
            return .conflict(op: index)
        case .failure(let error):
            guard let serverError = (error as? TandemError)?.serverError else { return .lost }
            return .refused(serverError.code, op: serverError.op)
        }
    }

    /// Writes an acknowledgement back (or, under the test hook that drops it, treats it as lost
    /// with the connection).
    private func writeBack(_ batch: [PreparedPush], _ results: [WriteResult], arrival: Int, _ run: inout PushRun)
        throws
    {
        if configuration.hooks.dropAcknowledgement?() == true {
            // As if the network failed before the answer: nothing that came after it on this
            // connection (the listener's echo included) is seen either.
            dropConnection(run.connection)
            let error = TandemError(.disconnected, "the connection dropped before the acknowledgement arrived")
            try ownWrite { db in
                try reconciler.answeredOtherwise(batch, db)
                try reconciler.ledger.countFailedAttempt(batch, error, maxAttempts: configuration.maxAttempts, db)
            }
            noteError(error)
            throw error
        }
        configuration.hooks.afterAck?(results)
        let generation = run.generation, scopes = run.scopes
        let (duplicates, merged, leftScope) = try ownWrite { db in
            // Noted before the write-back commits, so that an apply that runs beside it
            // (`Serialization.unserialized`) and sees the rows written back sees them noted too.
            noteAcknowledged(batch, arrival: arrival, generation: generation)
            return try reconciler.recordAcknowledgement(batch, results, scopes: scopes, db)
        }
        configuration.hooks.afterWriteBack?(batch.map(\.op), results)
        for duplicate in duplicates { noteError(TandemError(.database, duplicate)) }
        run.report.conflicts += merged
        run.report.pushed += results.count
        // Rows that went may have had nested listeners open; new parents open new ones.
        run.newParents =
            run.newParents || (leftScope > 0 && !parentTables.isEmpty)
            || batch.contains { $0.op.kind == .create && parentTables.contains($0.table) }
    }

    /// Notes the rows an acknowledgement wrote back, while a reset's full snapshot may still
    /// end on this connection (see ``ResetWindow``).
    private func noteAcknowledged(_ batch: [PreparedPush], arrival: Int, generation: Int) {
        state.withLock { state in
            guard state.generation == generation, !state.resets.isEmpty else { return }
            for (table, pushes) in Dictionary(grouping: batch.lazy.filter { $0.op.kind != .delete }, by: \.table) {
                state.resets.acknowledged(pushes.map(\.rowId), of: table, arrival: arrival)
            }
        }
    }

    /// Whether a batch creates rows of a table that others nest under or reference: the next
    /// batch waits for its answer, which brings their server ids.
    ///
    /// By index, each op read in place: a closure over the elements (`contains(where:)`) got a
    /// copy of each push, its op's strings and fields retained and released.
    private func creates(dependedOn batch: [PreparedPush]) -> Bool {
        batch.indices.contains { batch[$0].op.kind == .create && dependedOnTables.contains(batch[$0].table) }
    }
}

/// What one push works with and what it has done so far.
struct PushRun {
    let connection: ServerConnection
    /// The connection's generation: an acknowledgement noted for a reset window must belong
    /// to the connection that opened it.
    let generation: Int
    let maxOps: Int
    let maxBytes: Int
    /// The scope of each scoped table, as its listener asks for it.
    let scopes: [String: Query]
    var report = SyncReport()
    /// Rows of parent tables were created, or rows left their scope: the listeners change.
    var newParents = false

    /// - Throws: ``TandemError`` (`disconnected`) when the service has no open connection.
    init(_ service: SyncService) throws {
        guard
            let (connection, generation) = service.state.withLock({ state in
                state.running ? state.connection.map { ($0, state.generation) } : nil
            }), connection.isOpen
        else {
            throw TandemError(.disconnected, "not connected to \(service.serverURL)")
        }
        self.connection = connection
        self.generation = generation
        let limits = connection.welcome.limits
        maxOps = max(1, min(service.configuration.maxBatchSize, limits.maxOpsPerWrite))
        maxBytes = max(16 << 10, min(limits.maxMessageBytes / 2, 512 << 10))
        scopes = service.reconciler.scopes(user: connection.welcome.user)
    }
}
