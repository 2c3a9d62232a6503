import Foundation
import Synchronization
import TandemClient
import TandemServer
import TandemTesting
import TandemWire
import Testing

/// Query listeners held against a model: seeded random writes to one collection, random
/// queries listening to it, and after each commit every listener's changes compared with
/// what a plain model derives by running the query again over its own copy of the documents.
///
/// The model shares nothing with the server's `QueryView`: it sorts whole lists where the
/// server inserts by binary search, and it places each change as Firestore's SDK does
/// (`docChanges`: a sorted tracker that starts as the old view, removals, then additions,
/// then modifications). Every so often a listener closes, and resumes with its token and the
/// ids of its view ten commits later: the changes it then gets must turn its list into the
/// model's view.
@Suite("Query listeners against a model")
struct QueryModelTests {
    @Test("random writes against random queries: each listener's changes are the model's", arguments: [1, 2, 3])
    func randomWrites(seed: UInt64) async throws {
        var random = SeededGenerator(seed: seed)
        let server = try await TestServer()
        let writer = try await connect(server)
        let items = try path("items")
        var model = Model()
        var listeners: [ModelListener] = []
        for index in 0..<10 {
            let query = Model.randomQuery(&random)
            listeners.append(try await ModelListener.start(server, items, query, name: "q\(index)"))
        }
        var nextID = 0
        /// Listeners away: the step they come back after, and the documents written meanwhile.
        var away: [Int: (until: Int, written: Set<DocumentID>)] = [:]
        var resumed = 0
        for step in 0..<700 {
            // One commit of one to three ops on different documents.
            var ops: [WriteOp] = []
            var written: Set<DocumentID> = []
            var touched = model.live.keys.shuffled(using: &random).prefix(Int.random(in: 0...3, using: &random))
            if model.live.count < 8 || Bool.random(using: &random) { touched = touched.dropLast() }
            for id in touched {
                if Int.random(in: 0..<4, using: &random) == 0 {
                    ops.append(
                        .delete(in: items, id: id, baseVersion: model.versions[id]!, idempotencyKey: key()))
                } else {
                    ops.append(
                        .update(
                            in: items, id: id, fields: Model.randomFields(&random), baseVersion: model.versions[id]!,
                            idempotencyKey: key()))
                }
                written.insert(id)
            }
            if ops.isEmpty || model.live.count < 25 && Bool.random(using: &random) {
                let id = try DocumentID(String(format: "d%04d", nextID))
                nextID += 1
                ops.append(.create(in: items, id: id, fields: Model.randomFields(&random), idempotencyKey: key()))
                written.insert(id)
            }
            guard case .ack(let results) = try await writer.write(ops) else {
                throw TestFailure("seed \(seed) step \(step): the write was refused")
            }
            let before = listeners.map { model.view(of: $0.query) }
            for (op, result) in zip(ops, results) { model.apply(op, result) }
            for (index, listener) in listeners.enumerated() {
                if away[index] != nil {
                    away[index]!.written.formUnion(written)
                    continue
                }
                let expected = Model.changes(
                    listener.query, from: before[index], to: model.view(of: listener.query), written: written)
                try await listener.expect(expected, model, "seed \(seed) step \(step) \(listener.name)")
            }
            if step % 25 == 0 {
                // A listener goes away; ten commits later it resumes with its token and view,
                // and must get exactly what changed in its view meanwhile.
                let index = Int.random(in: 0..<listeners.count, using: &random)
                if away[index] == nil {
                    listeners[index].connection.close()
                    away[index] = (step + 10, [])
                }
            }
            for (index, (until, writtenMeanwhile)) in away where until == step {
                away[index] = nil
                listeners[index] = try await listeners[index].resume(
                    server, items, model, written: writtenMeanwhile, "seed \(seed) step \(step)")
                resumed += 1
            }
        }
        #expect(resumed >= 20)
        // A fresh listener on each query starts with the model's view.
        for listener in listeners {
            let fresh = try await ModelListener.start(server, items, listener.query, name: listener.name + "-fresh")
            #expect(fresh.list == model.view(of: listener.query).map(\.id), "seed \(seed) \(listener.name)")
        }
    }
}

/// The documents as the model holds them, and what it derives from them.
private struct Model {
    var live: [DocumentID: JSONObject] = [:]
    var versions: [DocumentID: Int64] = [:]

    mutating func apply(_ op: WriteOp, _ result: WriteResult) {
        let id = result.id
        versions[id] = result.version
        switch op.kind {
        case .create, .update: live[id] = op.fields ?? [:]
        case .delete: live[id] = nil
        }
    }

    /// The query run over the documents: matching, sorted, cut at the limit.
    func view(of query: Query) -> [Entry] {
        let sorted = live.filter { query.matches($0.value) }.map { Entry(id: $0.key, fields: $0.value) }
            .sorted { query.precedes(($0.id, $0.fields), ($1.id, $1.fields)) }
        return Array(sorted.prefix(query.limit ?? .max))
    }

    struct Entry: Equatable {
        var id: DocumentID
        var fields: JSONObject
    }

    /// `(kind id oldIndex newIndex)` of each change, as Firestore's SDK derives them: a
    /// tracker sorted by the query starts as the old view (old fields); removals, additions and
    /// modifications are applied to it in turn, each index read in the tracker as it stands.
    static func changes(_ query: Query, from old: [Entry], to new: [Entry], written: Set<DocumentID>) -> [String] {
        func sort(_ entries: inout [Entry]) {
            entries.sort { query.precedes(($0.id, $0.fields), ($1.id, $1.fields)) }
        }
        let oldIDs = Set(old.map(\.id))
        let newIDs = Set(new.map(\.id))
        var tracker = old
        var changes: [String] = []
        for entry in old where !newIDs.contains(entry.id) {
            let index = tracker.firstIndex { $0.id == entry.id }!
            tracker.remove(at: index)
            changes.append("removed \(entry.id) \(index) -1")
        }
        for entry in new where !oldIDs.contains(entry.id) {
            tracker.append(entry)
            sort(&tracker)
            changes.append("added \(entry.id) -1 \(tracker.firstIndex { $0.id == entry.id }!)")
        }
        for entry in new where oldIDs.contains(entry.id) && written.contains(entry.id) {
            let oldIndex = tracker.firstIndex { $0.id == entry.id }!
            tracker.remove(at: oldIndex)
            tracker.append(entry)
            sort(&tracker)
            changes.append("modified \(entry.id) \(oldIndex) \(tracker.firstIndex { $0.id == entry.id }!)")
        }
        precondition(tracker == new, "the model's own changes do not make its view")
        return changes
    }

    // MARK: - Random documents and queries

    static let groups: [JSONValue] = ["p", "q", "r"]
    static let tags: [JSONValue] = ["a", "b", "c"]

    /// Fields drawn from small sets, so that queries match, tie and reorder often; a field is
    /// sometimes missing, and `n` mixes integers, decimals, strings and null.
    static func randomFields(_ random: inout SeededGenerator) -> JSONObject {
        var fields: JSONObject = [:]
        if Int.random(in: 0..<6, using: &random) > 0 {
            fields["n"] =
                [.int(0), .int(1), .int(2), .double(1.5), .int(3), .string("x"), .null][
                    Int.random(in: 0..<7, using: &random)]
        }
        if Bool.random(using: &random) { fields["g"] = groups.randomElement(using: &random)! }
        if Int.random(in: 0..<3, using: &random) > 0 {
            fields["tags"] = .array(tags.filter { _ in Bool.random(using: &random) })
        }
        if Int.random(in: 0..<3, using: &random) == 0 {
            fields["address"] = ["city": groups.randomElement(using: &random)!]
        }
        return fields
    }

    static func randomQuery(_ random: inout SeededGenerator) -> Query {
        func number(_ random: inout SeededGenerator) -> JSONValue {
            [.int(0), .int(1), .double(1.5), .int(2), .int(3)].randomElement(using: &random)!
        }
        func clause(_ random: inout SeededGenerator) -> Query.Filter {
            let (g, n, tags, city) = (
                try! FieldPath("g"), try! FieldPath("n"), try! FieldPath("tags"), try! FieldPath("address.city")
            )
            switch Int.random(in: 0..<9, using: &random) {
            case 0: return .init(g, .equal, groups.randomElement(using: &random)!)
            case 1: return .init(g, .notEqual, groups.randomElement(using: &random)!)
            case 2: return .init(n, .less, number(&random))
            case 3: return .init(n, .greaterOrEqual, number(&random))
            case 4: return .init(n, .in, [number(&random), "x"])
            case 5: return .init(n, .notIn, [number(&random)])
            case 6: return .init(tags, .arrayContains, Self.tags.randomElement(using: &random)!)
            case 7: return .init(tags, .arrayContainsAny, ["a", "c"])
            default: return .init(city, .equal, groups.randomElement(using: &random)!)
            }
        }
        let filters = (0..<Int.random(in: 0...2, using: &random)).map { _ in clause(&random) }
        let orderBy = (0..<Int.random(in: 0...2, using: &random)).map { _ in
            Query.Order(
                try! FieldPath(["n", "g", "address.city"].randomElement(using: &random)!),
                descending: Bool.random(using: &random))
        }
        let limit = Bool.random(using: &random) ? Int.random(in: 1...5, using: &random) : nil
        return Query(filters: filters, orderBy: orderBy, limit: limit)
    }
}

/// One query listener and the list its client keeps by applying the positioned changes.
private final class ModelListener: Sendable {
    let name: String
    let query: Query
    let connection: ServerConnection
    let feed = Feed()
    private let applied = Mutex<Int>(0)
    private let held = Mutex<[DocumentID]>([])

    private init(name: String, query: Query, connection: ServerConnection) {
        self.name = name
        self.query = query
        self.connection = connection
    }

    /// The ids in the client's list, in order.
    var list: [DocumentID] { held.withLock { $0 } }

    static func start(
        _ server: TestServer, _ collection: CollectionPath, _ query: Query, name: String, resumeToken: String? = nil,
        view: [DocumentID]? = nil
    ) async throws -> ModelListener {
        let listener = ModelListener(name: name, query: query, connection: try await connect(server))
        if let view { listener.held.withLock { $0 = view } }
        listener.connection.listen(
            to: collection, resumeToken: resumeToken, query: query, view: view, handler: listener.feed.handler)
        try await waitUntil("\(name) is current") { listener.feed.isCurrent }
        #expect(listener.feed.resets.isEmpty, "\(name): \(listener.feed.resets)")
        try listener.takeChanges(listener.feed.changes.count)
        return listener
    }

    /// Applies the changes received beyond those applied so far to the client's list.
    private func takeChanges(_ count: Int) throws {
        let changes = feed.changes
        try applied.withLock { applied in
            try held.withLock { list in
                for change in changes[applied..<count] {
                    let (old, new) = (change.oldIndex ?? -9, change.newIndex ?? -9)
                    if old >= 0 {
                        guard old < list.count, list[old] == change.document.id else {
                            throw TestFailure("\(name): \(change.kind) \(change.document.id) at \(old) of \(list)")
                        }
                        list.remove(at: old)
                    }
                    if new >= 0 {
                        guard new <= list.count else { throw TestFailure("\(name): index \(new) past \(list)") }
                        list.insert(change.document.id, at: new)
                    }
                }
                applied = count
            }
        }
    }

    /// Waits for the changes the model expects (none: nothing is waited for; anything the
    /// server sent instead shows at the next expectation, or in the final check), compares
    /// them, and checks the client's list and documents against the model's view.
    func expect(_ expected: [String], _ model: Model, _ context: String) async throws {
        let start = applied.withLock { $0 }
        if !expected.isEmpty {
            try await waitUntil("\(context): \(expected.count) changes") {
                feed.changes.count >= start + expected.count
            }
        }
        let changes = Array(feed.changes[start...])
        let got = changes.map { "\($0.kind) \($0.document.id) \($0.oldIndex ?? -9) \($0.newIndex ?? -9)" }
        #expect(got == expected, "\(context)")
        guard got == expected else { throw TestFailure("\(context): got \(got), expected \(expected)") }
        try takeChanges(start + changes.count)
        let view = model.view(of: query)
        #expect(list == view.map(\.id), "\(context)")
        for change in changes where change.kind != .removed {
            #expect(change.document.fields == model.live[change.document.id], "\(context) \(change.document.id)")
        }
    }

    /// Resumes on a new connection (the old one closed) with the last token and the list:
    /// the changes must turn the list into the model's view, removing what left it, adding
    /// what came, and modifying only documents written meanwhile.
    func resume(
        _ server: TestServer, _ collection: CollectionPath, _ model: Model, written: Set<DocumentID>,
        _ context: String
    ) async throws -> ModelListener {
        let token = try #require(feed.lastToken)
        let old = list
        let resumed = try await ModelListener.start(
            server, collection, query, name: name, resumeToken: token, view: old)
        let new = model.view(of: query).map(\.id)
        #expect(resumed.list == new, "\(context): \(name) resumed")
        let changes = resumed.feed.changes
        let ids = { (kind: Change.Kind) in Set(changes.filter { $0.kind == kind }.map(\.document.id)) }
        #expect(ids(.removed) == Set(old).subtracting(new), "\(context): \(name) removals")
        #expect(ids(.added) == Set(new).subtracting(old), "\(context): \(name) additions")
        #expect(ids(.modified).isSubset(of: Set(old).intersection(new).intersection(written)), "\(context): \(name)")
        for change in changes where change.kind != .removed {
            #expect(change.document.fields == model.live[change.document.id], "\(context) \(change.document.id)")
        }
        return resumed
    }
}
