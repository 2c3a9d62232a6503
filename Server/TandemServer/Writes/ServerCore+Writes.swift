import TandemWire

extension ServerCore {
    /// Checks a write against the limits, applies it in one transaction, answers, then fans
    /// the committed changes out.
    func write(_ session: Session, _ clientId: ClientName, _ write: ClientMessage.Write) {
        let limits = configuration.limits
        guard write.ops.count <= limits.maxOpsPerWrite else {
            session.send(
                WireError(
                    .tooLarge,
                    "a write may carry at most \(limits.maxOpsPerWrite) ops; this one has \(write.ops.count)",
                    request: write.request))
            return
        }
        if let faults, faults.rejectsWrite() {
            logger.warning("injected fault: write refused", metadata: ["tandem.session": "\(session.id)"])
            session.send(
                WireError(
                    faults.plan.rejectedWriteCode, "injected fault: the write was refused and not applied",
                    request: write.request))
            return
        }
        var prepared: [PreparedOp] = []
        prepared.reserveCapacity(write.ops.count)
        for (index, op) in write.ops.enumerated() {
            let fieldsJSON = String(decoding: Wire.encodeCanonical(op.fields ?? [:]), as: UTF8.self)
            if fieldsJSON.utf8.count > limits.maxDocumentBytes {
                session.send(
                    WireError(
                        .tooLarge,
                        "ops[\(index)].fields: the document is \(fieldsJSON.utf8.count) bytes; the limit is \(limits.maxDocumentBytes)",
                        request: write.request, op: index))
                return
            }
            prepared.append(PreparedOp(op: op, fieldsJSON: fieldsJSON))
        }

        let outcome: WriteOutcome
        do {
            outcome = try store.apply(
                prepared, clientId: clientId, now: configuration.clock(), maxDocumentBytes: limits.maxDocumentBytes,
                authorize: writeAuthorization(for: session))
        } catch var error as WireError {
            error.request = write.request
            session.send(error)
            return
        } catch {
            session.send(internalError(error, request: write.request))
            return
        }
        switch outcome {
        case .conflict(let op, let server):
            session.send(.conflict(.init(request: write.request, op: op, server: server)))
        case .applied(let results, let changes):
            if let faults, faults.losesAck() {
                // Committed, but the answer is lost with the connection.
                drop(session, "injected fault: acknowledgement lost")
            } else {
                session.send(.ack(.init(request: write.request, results: results)))
            }
            recheckAccess(after: changes)
            fanOut(changes)
        }
    }
}
