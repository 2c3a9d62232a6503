import TandemWire

/// What the admin API does (docs/ADMIN.md), on the core queue like everything else that
/// touches sessions or the store. Each operation first applies the writes waiting for their
/// group commit, so that it sees every write acknowledged before it.
extension ServerCore {
    /// Removes the documents of one collection, or everything, and sends each listener of
    /// what was removed a `reset` followed by the (now empty) full snapshot. The feed round
    /// that does so also decides again the access of listeners whose rules looked at a
    /// removed document (the horizon moved: ``runFeedRound(_:measuring:)``).
    func reset(_ collection: CollectionPath?) throws -> Int {
        flushWrites()
        let removed = try store.reset(collection)
        logger.notice(
            "reset by the admin API",
            metadata: [
                "tandem.collection": "\(collection?.rawValue ?? "everything")", "tandem.documents": "\(removed)",
            ])
        runFeedRound(collection.map { Set([$0]) })
        return removed
    }

    /// The whole store in the export format, a line per document (see ``ExportFormat``).
    func export() throws -> [UInt8] {
        flushWrites()
        // A store read page by page (PostgreSQL, where other nodes write meanwhile) can show
        // a document twice, written again between two pages: the later one is kept.
        var lines: [[UInt8]?] = []
        var lineOf: [DocumentKey: Int] = [:]
        var collections: [CollectionPath] = []
        try store.forEachDocument { document in
            if collections.last != document.collection { collections.append(document.collection) }
            if let earlier = lineOf.updateValue(lines.count, forKey: document.key) { lines[earlier] = nil }
            lines.append(ExportFormat.line(document))
        }
        var output = ExportFormat.header(epoch: store.epoch, at: configuration.clock())
        for collection in Set(collections).sorted() {
            output += ExportFormat.line(collection, try store.feedBounds(of: collection))
        }
        for case let line? in lines { output += line }
        logger.info(
            "exported",
            metadata: ["tandem.documents": "\(lineOf.count)", "tandem.collections": "\(Set(collections).count)"])
        return output
    }

    /// Stores the documents of an export, all or none: a document that exists already (live
    /// or a tombstone) refuses the whole import, since an import never overwrites.
    ///
    /// Listeners of the collections hear of the documents as `added`, like any write.
    func importDocuments(_ bytes: [UInt8]) throws -> ImportSummary {
        Confinement.check(queue)
        let documents = try ExportFormat.parse(bytes, maxDocumentBytes: configuration.limits.maxDocumentBytes)
        guard !documents.isEmpty else { return ImportSummary(documents: 0, collections: 0) }
        flushWrites()
        let collections = Set(documents.map(\.collection))
        try store.write(locking: collections.sorted()) { transaction in
            let existing = try transaction.documents(documents.map(\.key))
            if let clash = documents.first(where: { existing[$0.key] != nil }) {
                throw ImportError(
                    line: nil,
                    "\(clash.key) exists on this server already (\(existing.count) of the file's documents do); "
                        + "an import never overwrites: reset the collection first, or import into an empty server",
                    reason: .exists)
            }
            var sequences: [CollectionPath: Int64] = [:]
            var stored: [StoredDocument] = []
            stored.reserveCapacity(documents.count)
            for var document in documents {
                let sequence =
                    try (sequences[document.collection] ?? transaction.lastSequence(of: document.collection)) + 1
                sequences[document.collection] = sequence
                document.sequence = sequence
                document.createSequence = sequence
                stored.append(document)
            }
            try transaction.save(stored, records: [], sequences: sequences)
        }
        logger.notice(
            "imported",
            metadata: ["tandem.documents": "\(documents.count)", "tandem.collections": "\(collections.count)"])
        runFeedRound(collections, measuring: false)
        return ImportSummary(documents: documents.count, collections: collections.count)
    }

    /// `{"clients":[…]}`: each connection, who it is, its listens and its send queue.
    func clientsJSON() -> [UInt8] {
        Confinement.check(queue)
        var writer = JSONWriter()
        writer.beginObject()
        writer.key("clients")
        writer.beginArray()
        for session in sessions.values.sorted(by: { $0.connection.id < $1.connection.id }) where !session.isClosed {
            writer.beginObject()
            writer.key("session")
            writer.string(session.id)
            writer.key("clientId")
            if let client = session.clientId { writer.string(client.rawValue) } else { writer.value(.null) }
            writer.key("user")
            if let user = session.user { writer.string(user) } else { writer.value(.null) }
            writer.key("peer")
            writer.string(session.connection.peer)
            writer.key("queuedBytes")
            writer.int(Int64(session.connection.queuedBytes))
            writer.key("listens")
            writer.beginArray()
            for listener in session.listeners.values.sorted(by: { $0.target < $1.target }) {
                writer.beginObject()
                writer.key("target")
                writer.string(listener.target)
                writer.key("collection")
                writer.string(listener.collection.rawValue)
                writer.key("live")
                writer.bool(listener.isLive)
                writer.key("position")
                writer.int(listener.position)
                writer.endObject()
            }
            writer.endArray()
            writer.endObject()
        }
        writer.endArray()
        writer.endObject()
        return writer.bytes
    }

    /// `{"collections":[{"path":"notes","documents":3},…]}`: collections with live documents.
    func collectionsJSON() throws -> [UInt8] {
        flushWrites()
        var writer = JSONWriter()
        writer.beginObject()
        writer.key("collections")
        writer.beginArray()
        for (path, documents) in try store.collections() {
            writer.beginObject()
            writer.key("path")
            writer.string(path.rawValue)
            writer.key("documents")
            writer.int(Int64(documents))
            writer.endObject()
        }
        writer.endArray()
        writer.endObject()
        return writer.bytes
    }

    /// What `/metrics` shows of this moment (connections, listeners, queues, store size).
    func metricsMoment() -> ServerMetrics.Moment {
        Confinement.check(queue)
        var moment = ServerMetrics.Moment()
        moment.connections = sessions.count
        for session in sessions.values {
            moment.queuedBytes.append(session.connection.queuedBytes)
            for listener in session.listeners.values { moment.listeners[listener.collection.group, default: 0] += 1 }
        }
        moment.storeBytes = try? store.sizeInBytes()
        moment.keySet = configuration.access?.jwt?.keys?.health
        return moment
    }
}

extension FaultPlan {
    /// The plan as the admin API shows it: `{"enabled":true,"seed":1,"lostAckRate":0.1,…}`,
    /// or `{"enabled":false}` for none.
    static func json(_ plan: FaultPlan?) -> [UInt8] {
        var writer = JSONWriter()
        writer.beginObject()
        writer.key("enabled")
        writer.bool(plan != nil)
        if let plan {
            writer.key("seed")
            writer.int(Int64(bitPattern: plan.seed))
            for (name, rate) in [
                ("lostAckRate", plan.lostAckRate), ("delayedDeliveryRate", plan.delayedDeliveryRate),
                ("dropConnectionRate", plan.dropConnectionRate), ("rejectedWriteRate", plan.rejectedWriteRate),
                ("failedListenRate", plan.failedListenRate),
            ] {
                writer.key(name)
                writer.value(.double(rate))
            }
            writer.key("deliveryDelayMs")
            writer.int(plan.deliveryDelay.milliseconds)
        }
        writer.endObject()
        return writer.bytes
    }

    /// Reads the admin API's JSON form; nil for `{"enabled":false}`.
    ///
    /// - Throws: ``ServerError`` `.invalidConfiguration` saying which member is wrong.
    static func fromJSON(_ bytes: [UInt8]) throws(ServerError) -> FaultPlan? {
        let object: JSONObject
        do {
            guard case .object(let parsed) = try Wire.parse(bytes) else {
                throw ServerError(
                    .invalidConfiguration, #"expected a JSON object like {"enabled":true,"lostAckRate":0.1}"#)
            }
            object = parsed
        } catch let error as ServerError {
            throw error
        } catch {
            throw ServerError(.invalidConfiguration, (error as? WireError)?.message ?? "\(error)")
        }
        let known: Set<String> = [
            "enabled", "seed", "lostAckRate", "delayedDeliveryRate", "dropConnectionRate", "rejectedWriteRate",
            "deliveryDelayMs", "failedListenRate",
        ]
        if let unknown = object.keys.sorted().first(where: { !known.contains($0) }) {
            throw ServerError(
                .invalidConfiguration, "unknown member '\(unknown)'; known: \(known.sorted().joined(separator: ", "))")
        }
        guard let enabled = object["enabled"]?.boolValue else {
            throw ServerError(.invalidConfiguration, "enabled: expected true or false")
        }
        guard enabled else { return nil }
        func rate(_ name: String) throws(ServerError) -> Double {
            guard let value = object[name] else { return 0 }
            guard let rate = value.doubleValue else {
                throw ServerError(.invalidConfiguration, "\(name): expected a number between 0 and 1")
            }
            return rate
        }
        var plan = FaultPlan(
            seed: 1, dropConnectionRate: try rate("dropConnectionRate"), lostAckRate: try rate("lostAckRate"),
            delayedDeliveryRate: try rate("delayedDeliveryRate"), rejectedWriteRate: try rate("rejectedWriteRate"),
            failedListenRate: try rate("failedListenRate"))
        if let seed = object["seed"] {
            guard let value = seed.intValue else {
                throw ServerError(.invalidConfiguration, "seed: expected an integer")
            }
            plan.seed = UInt64(bitPattern: value)
        }
        if let delay = object["deliveryDelayMs"] {
            guard let value = delay.intValue else {
                throw ServerError(.invalidConfiguration, "deliveryDelayMs: expected milliseconds")
            }
            plan.deliveryDelay = .milliseconds(value)
        }
        try plan.validate()
        return plan
    }
}
