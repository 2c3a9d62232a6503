import GRDB
import TandemWire

extension SyncService {
    /// One push: batches of filed deletes and dirty rows, each sent, answered and written back
    /// in order. Runs inside a barrier block of the sync queue.
    ///
    /// Up to ``SyncConfiguration/writesInFlight`` batches are on their way at once: the next
    /// is prepared and sent while the server applies the one before. A batch that creates rows
    /// others depend on (parents, reference targets) is answered before the next is prepared,
    /// since the next may need the server ids it brings.
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
        state.withLock { $0.pushDue = nil }
        // A push that ends early shows what it left; one that ends normally reads the counts
        // once, for its report and the status.
        var countsShown = false
        defer { if !countsShown { refreshStatus() } }
        guard
            let (connection, generation) = state.withLock({ state in
                state.running ? state.connection.map { ($0, state.generation) } : nil
            }), connection.isOpen
        else {
            throw TandemError(.disconnected, "not connected to \(serverURL)")
        }
        let limits = connection.welcome.limits
        let maxOps = max(1, min(configuration.maxBatchSize, limits.maxOpsPerWrite))
        let maxBytes = max(16 << 10, min(limits.maxMessageBytes / 2, 512 << 10))
        let depth = max(1, configuration.writesInFlight)
        let scopes = store.scopes(user: connection.welcome.user)
        var report = SyncReport()
        var newParents = false
        defer { if newParents { refreshListeners() } }

        var cursor = PushCursor()
        // Each batch on its way, with whether it creates rows others depend on (worked out once:
        // the loop below asks after every answer).
        var inFlight: [(batch: [PreparedPush], createsDependedOn: Bool, answer: ServerConnection.PendingWrite)] = []
        var exhausted = false
        // The last batch read every row there was when it was taken.
        var endReached = false
        var batches = 0
        var createsAcknowledged = 0
        // Ops of a refused or conflicting batch that were not applied, and must go out again.
        var leftBehind = false
        // An answer taken off `inFlight` and not yet written back.
        var answering = false
        // A push that stops with answers unread or not written back (a timeout, batches still
        // on their way, a write-back that failed): the server counts those writes as known to
        // this connection, and its listeners leave them out. A new connection hears them again,
        // and the recorded keys settle the rest.
        var finished = false
        defer { if !finished && (answering || !inFlight.isEmpty) { dropConnection(connection) } }
        while true {
            answering = false
            // A local commit since then queued another push, which waits behind this one: what
            // it filed goes out in this push instead, while it runs.
            if endReached, state.withLock({ $0.pushDue != nil }) {
                exhausted = false
                endReached = false
            }
            while !exhausted, inFlight.count < depth, inFlight.last?.createsDependedOn != true {
                if batches == 64 {
                    // Long enough: listener work waits behind this barrier. Another push is
                    // queued for the rest.
                    leftBehind = true
                    exhausted = true
                    break
                }
                let batch = try ownWrite { db in
                    try store.preparePush(maxOps: maxOps, maxBytes: maxBytes, after: &cursor, db)
                }
                if batch.isEmpty {
                    exhausted = true
                    break
                }
                // Nothing was left after this batch when it was taken: no need to look again
                // unless a local commit says so (above). Rows under or referring to the rows
                // this batch creates were not read at all (they wait for their server ids):
                // after its answer, the push looks again.
                let createsDependedOn = creates(dependedOn: batch)
                endReached = cursor.reachedEnd && !createsDependedOn
                exhausted = endReached
                batches += 1
                configuration.hooks.beforeSend?(batch.map(\.op))
                inFlight.append(
                    (
                        batch, createsDependedOn,
                        connection.startWrite(batch.map(\.op), timeout: configuration.requestTimeout)
                    ))
            }
            guard !inFlight.isEmpty else { break }
            let (batch, _, answer) = inFlight.removeFirst()
            answering = true

            switch answer.wait() {
            case .success(.ack(let results)):
                if configuration.hooks.dropAcknowledgement?() == true {
                    // As if the network failed before the answer: nothing that came after it on
                    // this connection (the listener's echo included) is seen either.
                    dropConnection(connection)
                    let error = TandemError(
                        .disconnected, "the connection dropped before the acknowledgement arrived")
                    try ownWrite { db in
                        try store.answeredOtherwise(batch, db)
                        try store.ledger.countFailedAttempt(
                            batch, error, maxAttempts: configuration.maxAttempts, db)
                    }
                    noteError(error)
                    throw error
                }
                configuration.hooks.afterAck?(results)
                let (duplicates, merged, leftScope) = try ownWrite { db in
                    // Noted before the write-back commits, so that an apply that runs beside
                    // it (`Serialization.unserialized`) and sees the rows written back sees
                    // them noted too.
                    noteAcknowledged(batch, arrival: answer.arrival, generation: generation)
                    return try store.recordAcknowledgement(batch, results, scopes: scopes, db)
                }
                configuration.hooks.afterWriteBack?(batch.map(\.op), results)
                for duplicate in duplicates { noteError(TandemError(.database, duplicate)) }
                report.conflicts += merged
                report.pushed += results.count
                // Rows that went may have had nested listeners open.
                newParents = newParents || (leftScope > 0 && !parentTables.isEmpty)
                for index in batch.indices where batch[index].op.kind == .create {
                    createsAcknowledged += 1
                    newParents = newParents || parentTables.contains(batch[index].table)
                }

            case .success(.conflict(let index, let server)):
                if try ownWrite({ db in
                    try store.answeredOtherwise(batch, db)
                    return try store.resolvePushConflict(batch[index], server: server, db)
                }) {
                    report.conflicts += 1
                }
                leftBehind = true

            case .failure(let error):
                let serverError = (error as? TandemError)?.serverError
                // The server's own answer: nothing of this batch was applied.
                if serverError != nil { answering = false }
                if let serverError, let index = serverError.op, batch.indices.contains(index) {
                    // One op was refused; the others were not applied and go out again.
                    let push = batch[index]
                    let refusal = TandemError(
                        .server, "\(push.table) row \(push.rowId): \(serverError.message)", serverError: serverError
                    )
                    try ownWrite { db in
                        try store.answeredOtherwise(batch, db)
                        if serverError.code == .notFound {
                            try store.recordNotFound(push, db)
                        } else if serverError.code.isRejection {
                            try store.ledger.fail(push.table, push.rowId, refusal, db)
                        } else {
                            try store.ledger.countFailedAttempt(
                                [push], refusal, maxAttempts: configuration.maxAttempts, db)
                        }
                    }
                    noteError(refusal)
                    leftBehind = true
                    continue
                }
                if let serverError, serverError.code.isRejection {
                    let refusal = TandemError(server: serverError)
                    try ownWrite { db in
                        try store.answeredOtherwise(batch, db)
                        for push in batch { try store.ledger.fail(push.table, push.rowId, refusal, db) }
                    }
                    noteError(refusal)
                    continue
                }
                let failure = TandemError("push failed", error, otherwise: .database)
                try ownWrite { db in
                    try store.answeredOtherwise(batch, db)
                    // Perhaps applied: the resend, under the same keys, is what finds out. It is
                    // not a failed attempt of the rows.
                    guard serverError?.code != .outcomeUnknown else { return }
                    try store.ledger.countFailedAttempt(batch, failure, maxAttempts: configuration.maxAttempts, db)
                }
                noteError(failure)
                // The server asks for the resend that finds out; it need not wait for the next
                // periodic push.
                if serverError?.code == .outcomeUnknown { schedulePush(after: configuration.reconnectDelay) }
                // The batches still on their way keep their keys; the next push sends them again.
                throw error
            }
        }
        finished = true
        if leftBehind || (cursor.passedOver && createsAcknowledged > 0) { schedulePush(after: .zero) }
        if report.conflicts > 0 { updateStatus { $0.resolvedConflicts += report.conflicts } }
        let counts = try showCurrentCounts()
        countsShown = true
        report.pending = counts.pending
        report.failed = counts.failed
        return report
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
