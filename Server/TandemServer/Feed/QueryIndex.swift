import TandemWire

/// The query listeners of one collection, indexed so that a write is matched only against
/// the queries it may concern, not against every listener.
///
/// A query with an equality clause (`==`, `in`) is found by the value its field has in the
/// written document, one with a membership clause (`array-contains`, `array-contains-any`)
/// by the elements of its array; a document already in a view (``holders``) concerns that
/// view whatever its new value, since it may leave it. Queries with neither kind of clause
/// see every write. The index may name more listeners than a write concerns (values that are
/// equal as Swift strings but not byte for byte share a key), never fewer: each candidate
/// still matches the documents itself. Confined to the core queue.
final class QueryIndex {
    private typealias Listeners = [ObjectIdentifier: Listener]

    /// Listeners by the field and value their equality clause selects.
    private var equality: [FieldPath: [IndexKey: Listeners]] = [:]
    /// Listeners by the field and element their membership clause selects.
    private var membership: [FieldPath: [IndexKey: Listeners]] = [:]
    /// Listeners whose query has no clause the index can use.
    private var unindexed: Listeners = [:]
    /// Listeners by the documents their query matches now, and the other way round.
    private var holders: [DocumentID: Listeners] = [:]
    private var held: [ObjectIdentifier: Set<DocumentID>] = [:]

    var isEmpty: Bool { unindexed.isEmpty && equality.isEmpty && membership.isEmpty }

    func add(_ listener: Listener, _ view: QueryView) {
        let id = ObjectIdentifier(listener)
        view.membershipChanged = { [unowned self, unowned listener] document, isMember in
            if isMember {
                holders[document, default: [:]][id] = listener
                held[id, default: []].insert(document)
            } else {
                release(document, from: id)
            }
        }
        switch Self.clause(of: view.query) {
        case (let field, .equality, let values)?:
            for value in values { equality[field, default: [:]][IndexKey(value), default: [:]][id] = listener }
        case (let field, .membership, let values)?:
            for value in values { membership[field, default: [:]][IndexKey(value), default: [:]][id] = listener }
        case nil:
            unindexed[id] = listener
        }
    }

    func remove(_ listener: Listener, _ view: QueryView) {
        let id = ObjectIdentifier(listener)
        for document in held[id] ?? [] { release(document, from: id) }
        view.membershipChanged = nil
        func drop(_ index: inout [FieldPath: [IndexKey: Listeners]], _ field: FieldPath, _ values: [JSONValue]) {
            for key in values.map(IndexKey.init) {
                index[field]?[key]?[id] = nil
                if index[field]?[key]?.isEmpty == true { index[field]?[key] = nil }
            }
            if index[field]?.isEmpty == true { index[field] = nil }
        }
        switch Self.clause(of: view.query) {
        case (let field, .equality, let values)?: drop(&equality, field, values)
        case (let field, .membership, let values)?: drop(&membership, field, values)
        case nil: unindexed[id] = nil
        }
    }

    private func release(_ document: DocumentID, from id: ObjectIdentifier) {
        holders[document]?[id] = nil
        if holders[document]?.isEmpty == true { holders[document] = nil }
        held[id]?.remove(document)
        if held[id]?.isEmpty == true { held[id] = nil }
    }

    /// The listeners `rows` may concern, each with the rows that concern it, in feed order.
    func candidates(for rows: [FeedRow]) -> [(Listener, [FeedRow])] {
        var found: [ObjectIdentifier: (listener: Listener, rows: [Int])] = [:]
        func take(_ listeners: Listeners?, _ row: Int) {
            for (id, listener) in listeners ?? [:] where found[id]?.rows.last != row {
                found[id, default: (listener, [])].rows.append(row)
            }
        }
        for (index, row) in rows.enumerated() {
            take(unindexed, index)
            take(holders[row.id], index)
            guard let fields = row.fields else { continue }
            for (field, byValue) in equality {
                if let value = field.value(in: fields) { take(byValue[IndexKey(value)], index) }
            }
            for (field, byElement) in membership {
                guard case .array(let elements)? = field.value(in: fields) else { continue }
                for element in elements { take(byElement[IndexKey(element)], index) }
            }
        }
        return found.values.map { candidate in (candidate.listener, candidate.rows.map { rows[$0] }) }
    }

    private enum ClauseKind { case equality, membership }

    /// The clause the index files a query under: its first `==` or `in`, else its first
    /// `array-contains` or `array-contains-any`; nil when it has neither.
    private static func clause(of query: Query) -> (FieldPath, ClauseKind, [JSONValue])? {
        func list(_ value: JSONValue) -> [JSONValue] {
            if case .array(let values) = value { values } else { [value] }
        }
        if let filter = query.filters.first(where: { $0.op == .equal || $0.op == .in }) {
            return (filter.field, .equality, filter.op == .in ? list(filter.value) : [filter.value])
        }
        if let filter = query.filters.first(where: { $0.op == .arrayContains || $0.op == .arrayContainsAny }) {
            return (filter.field, .membership, filter.op == .arrayContainsAny ? list(filter.value) : [filter.value])
        }
        return nil
    }
}

/// A value as an index key: values equal in the query order have equal keys (an integral
/// decimal is keyed as the integer it equals, at any depth).
struct IndexKey: Hashable {
    let value: JSONValue

    init(_ value: JSONValue) { self.value = Self.normalized(value) }

    private static func normalized(_ value: JSONValue) -> JSONValue {
        switch value {
        case .double(let number):
            if let integer = Int64(exactly: number) { return .int(integer) }
            return value
        case .array(let elements): return .array(elements.map(normalized))
        case .object(let object): return .object(object.mapValues(normalized))
        default: return value
        }
    }
}
