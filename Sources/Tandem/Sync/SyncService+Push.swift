import GRDB
import TandemWire

extension SyncService {
    /// One push: batches of dirty rows and filed deletes, each sent, answered and written back
    /// before the next. Runs inside a barrier block of the sync queue.
    ///
    /// - Throws: ``TandemError`` when not connected or when the connection fails mid-push
    ///   (the rows stay pending, their idempotency keys kept for the resend).
    @discardableResult
    func push() throws -> SyncReport {
        state.withLock { $0.pushScheduled = false }
        defer { refreshStatus() }
        guard let connection = state.withLock({ $0.running ? $0.connection : nil }), connection.isOpen else {
            throw TandemError(.disconnected, "not connected to \(serverURL)")
        }
        let limits = connection.welcome.limits
        let maxOps = max(1, min(configuration.maxBatchSize, limits.maxOpsPerWrite))
        let maxBytes = max(16 << 10, min(limits.maxMessageBytes / 2, 512 << 10))
        var report = SyncReport()
        var newParents = false
        defer { if newParents { refreshListeners() } }

        // Each batch makes progress (acknowledged, resolved or failed rows leave the set); a
        // push ends after 64 batches so that listener work is not held up behind it for long.
        // What the server acknowledged in this push, by row and revision: a batch of nothing but
        // rows already acknowledged unchanged (a reference still waiting for its target) ends
        // the push. Ops of a refused batch were not applied, so they may go out again.
        var sent: Set<String> = []
        for round in 0... {
            let batch = try ownWrite { db in try store.preparePush(maxOps: maxOps, maxBytes: maxBytes, db) }
            let signatures = batch.map { "\($0.table)#\($0.rowId)#\($0.op.kind)#\($0.revision)" }
            if batch.isEmpty || signatures.allSatisfy(sent.contains) { break }
            if round == 64 {
                // Long enough: the sync queue has other work (listeners) waiting behind this
                // barrier. Another push is queued for the rest.
                schedulePush(after: .zero)
                break
            }
            configuration.hooks.beforeSend?(batch.map(\.op))
            switch connection.writeAndWait(batch.map(\.op), timeout: configuration.requestTimeout) {
            case .success(.ack(let results)):
                if configuration.hooks.dropAcknowledgement?() == true {
                    // As if the network failed before the answer: nothing that came after it on
                    // this connection (the listener's echo included) is seen either.
                    dropConnection(connection)
                    try ownWrite { db in
                        try store.countFailedAttempt(
                            batch, "the acknowledgement was lost", maxAttempts: configuration.maxAttempts, db)
                    }
                    throw TandemError(.disconnected, "the connection dropped before the acknowledgement arrived")
                }
                configuration.hooks.afterAck?(results)
                sent.formUnion(signatures)
                let (duplicates, merged) = try ownWrite { db in try store.recordAcknowledgement(batch, results, db) }
                for duplicate in duplicates { noteError(duplicate) }
                report.conflicts += merged
                report.pushed += results.count
                newParents =
                    newParents || batch.contains { $0.op.kind == .create && parentTables.contains($0.table) }

            case .success(.conflict(let index, let server)):
                if try ownWrite({ db in try store.resolvePushConflict(batch[index], server: server, db) }) {
                    report.conflicts += 1
                }

            case .failure(let error):
                let serverError = (error as? TandemError)?.serverError
                if let serverError, let index = serverError.op, batch.indices.contains(index) {
                    // One op was refused; the others were not applied and go out again.
                    let push = batch[index]
                    try ownWrite { db in
                        if serverError.code == .notFound {
                            try store.recordNotFound(push, db)
                        } else if serverError.code.isRejection {
                            try store.fail(push.table, push.rowId, serverError.message, db)
                        } else {
                            try store.countFailedAttempt(
                                [push], serverError.message, maxAttempts: configuration.maxAttempts, db)
                        }
                    }
                    noteError("\(push.table) row \(push.rowId): \(serverError.message)")
                    continue
                }
                if let serverError, serverError.code.isRejection {
                    try ownWrite { db in
                        for push in batch { try store.fail(push.table, push.rowId, serverError.message, db) }
                    }
                    noteError(serverError.message)
                    continue
                }
                try ownWrite { db in
                    try store.countFailedAttempt(batch, "\(error)", maxAttempts: configuration.maxAttempts, db)
                }
                noteError("push failed: \(error)")
                throw error
            }
        }
        let (pending, failed) = try readState { db in (try store.pendingCount(db), try store.failedCount(db)) }
        report.pending = pending
        report.failed = failed
        if report.conflicts > 0 { updateStatus { $0.resolvedConflicts += report.conflicts } }
        return report
    }
}
