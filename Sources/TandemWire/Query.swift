/// A listener's query: which documents of the collection it sees (`where`), in which order
/// (`orderBy`, the document id last), and how many (`limit`).
///
/// JSON form (the `query` of a `listen`):
///
/// ```json
/// {"where": [{"field": "members", "op": "array-contains", "value": "alice"},
///            {"field": "amount", "op": "<", "value": 0}],
///  "orderBy": [{"field": "date", "direction": "desc"}],
///  "limit": 20}
/// ```
///
/// Values are compared in one total order across JSON types (``JSONValue/queryOrder(_:_:)``):
/// null < booleans < numbers < strings < arrays < objects. A document without a filtered
/// field matches no filter on it (`!=` and `not-in` included), and a document without an
/// `orderBy` field is not in the view. `in`, `not-in` and `array-contains-any` take any
/// number of values (at least one).
public struct Query: Sendable, Hashable {
    public var filters: [Filter]
    public var orderBy: [Order]
    public var limit: Int?

    public init(filters: [Filter] = [], orderBy: [Order] = [], limit: Int? = nil) {
        self.filters = filters
        self.orderBy = orderBy
        self.limit = limit
    }

    public struct Filter: Sendable, Hashable {
        public enum Operator: String, Sendable, Hashable, CaseIterable {
            case equal = "=="
            case notEqual = "!="
            case less = "<"
            case lessOrEqual = "<="
            case greater = ">"
            case greaterOrEqual = ">="
            case `in` = "in"
            case notIn = "not-in"
            case arrayContains = "array-contains"
            case arrayContainsAny = "array-contains-any"

            /// Whether the operator takes a list of values.
            public var takesList: Bool { self == .in || self == .notIn || self == .arrayContainsAny }
        }

        public var field: FieldPath
        public var op: Operator
        /// The operand; an array for `in`, `not-in` and `array-contains-any`.
        public var value: JSONValue

        public init(_ field: FieldPath, _ op: Operator, _ value: JSONValue) {
            self.field = field
            self.op = op
            self.value = value
        }

        /// Whether a document's fields pass this filter.
        public func matches(_ fields: JSONObject) -> Bool {
            guard let actual = field.value(in: fields) else { return false }
            switch op {
            case .equal: return JSONValue.queryOrder(actual, value) == 0
            case .notEqual: return JSONValue.queryOrder(actual, value) != 0
            case .less: return JSONValue.queryOrder(actual, value) < 0
            case .lessOrEqual: return JSONValue.queryOrder(actual, value) <= 0
            case .greater: return JSONValue.queryOrder(actual, value) > 0
            case .greaterOrEqual: return JSONValue.queryOrder(actual, value) >= 0
            case .in: return list.contains { JSONValue.queryOrder(actual, $0) == 0 }
            case .notIn: return !list.contains { JSONValue.queryOrder(actual, $0) == 0 }
            case .arrayContains:
                guard case .array(let elements) = actual else { return false }
                return elements.contains { JSONValue.queryOrder($0, value) == 0 }
            case .arrayContainsAny:
                guard case .array(let elements) = actual else { return false }
                return elements.contains { element in list.contains { JSONValue.queryOrder(element, $0) == 0 } }
            }
        }

        private var list: [JSONValue] {
            if case .array(let values) = value { values } else { [value] }
        }
    }

    public struct Order: Sendable, Hashable {
        public var field: FieldPath
        public var descending: Bool

        public init(_ field: FieldPath, descending: Bool = false) {
            self.field = field
            self.descending = descending
        }
    }

    /// Whether a live document is in the query's result (before the limit).
    public func matches(_ fields: JSONObject) -> Bool {
        filters.allSatisfy { $0.matches(fields) } && orderBy.allSatisfy { $0.field.value(in: fields) != nil }
    }

    /// Whether the document `a` comes before `b` in the query's order (the id breaks ties).
    public func precedes(_ a: (id: DocumentID, fields: JSONObject), _ b: (id: DocumentID, fields: JSONObject)) -> Bool {
        for order in orderBy {
            let left = order.field.value(in: a.fields) ?? .null
            let right = order.field.value(in: b.fields) ?? .null
            let comparison = JSONValue.queryOrder(left, right)
            if comparison != 0 { return order.descending ? comparison > 0 : comparison < 0 }
        }
        return a.id < b.id
    }
}

/// A dot-separated path to a field inside a document (`address.city`).
public struct FieldPath: Sendable, Hashable, CustomStringConvertible {
    public let segments: [String]

    /// - Throws: ``WireError`` `.badMessage` for an empty path or an empty segment.
    public init(_ text: String) throws(WireError) {
        let segments = text.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        guard !text.isEmpty, !segments.contains(where: \.isEmpty) else {
            throw WireError(.badMessage, "'\(text.prefix(80))' is not a field path (names separated by dots)")
        }
        self.segments = segments
    }

    public var description: String { segments.joined(separator: ".") }

    /// The value at this path, or nil when a segment is missing or not an object.
    public func value(in fields: JSONObject) -> JSONValue? {
        var current: JSONObject = fields
        for (index, segment) in segments.enumerated() {
            guard let value = current[segment] else { return nil }
            if index == segments.count - 1 { return value }
            guard case .object(let inner) = value else { return nil }
            current = inner
        }
        return nil
    }
}

extension JSONValue {
    /// Queries' total order across JSON types: null < booleans (false < true) < numbers (by
    /// value, integers and decimals together) < strings (by UTF-8 bytes) < arrays (element by
    /// element, then the shorter first) < objects (by their keys in order, each key then its
    /// value, then the smaller first).
    ///
    /// - Returns: Negative, zero or positive, as `a` comes before, with or after `b`.
    public static func queryOrder(_ a: JSONValue, _ b: JSONValue) -> Int {
        let (left, right) = (a.typeRank, b.typeRank)
        if left != right { return left < right ? -1 : 1 }
        switch (a, b) {
        case (.bool(let x), .bool(let y)): return x == y ? 0 : (x ? 1 : -1)
        case (.int(let x), .int(let y)): return x == y ? 0 : (x < y ? -1 : 1)
        case (.double(let x), .double(let y)): return x == y ? 0 : (x < y ? -1 : 1)
        case (.int(let x), .double(let y)): return compare(x, y)
        case (.double(let x), .int(let y)): return -compare(y, x)
        case (.string(let x), .string(let y)):
            // By bytes, not by Swift's `==`, which takes canonically equivalent strings ("é"
            // and "e" + combining accent) for equal: the order must be total and consistent.
            if x.utf8.elementsEqual(y.utf8) { return 0 }
            return x.utf8.lexicographicallyPrecedes(y.utf8) ? -1 : 1
        case (.array(let x), .array(let y)):
            for (p, q) in zip(x, y) {
                let order = queryOrder(p, q)
                if order != 0 { return order }
            }
            return x.count == y.count ? 0 : (x.count < y.count ? -1 : 1)
        case (.object(let x), .object(let y)):
            let xKeys = x.keys.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
            let yKeys = y.keys.sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
            for (p, q) in zip(xKeys, yKeys) {
                let keyOrder = queryOrder(.string(p), .string(q))
                if keyOrder != 0 { return keyOrder }
                let valueOrder = queryOrder(x[p]!, y[q]!)
                if valueOrder != 0 { return valueOrder }
            }
            return xKeys.count == yKeys.count ? 0 : (xKeys.count < yKeys.count ? -1 : 1)
        default:
            return 0  // the same rank and none of the above: both null
        }
    }

    /// An integer and a decimal compared exactly (through `Double`, 2^53 + 1 would equal 2^53).
    private static func compare(_ integer: Int64, _ decimal: Double) -> Int {
        if decimal < -9_223_372_036_854_775_808.0 { return 1 }
        if decimal >= 9_223_372_036_854_775_808.0 { return -1 }
        let whole = decimal.rounded(.down)
        let truncated = Int64(whole)
        if integer != truncated { return integer < truncated ? -1 : 1 }
        return decimal > whole ? -1 : 0
    }

    private var typeRank: Int {
        switch self {
        case .null: 0
        case .bool: 1
        case .int, .double: 2
        case .string: 3
        case .array: 4
        case .object: 5
        }
    }
}

extension Query: WireCodable {
    public init(json: JSONValue, path: String) throws(WireError) {
        let reader = try ObjectReader(json, path: path)
        var filters: [Filter] = []
        if reader.has("where") {
            for (index, value) in try reader.array("where").enumerated() {
                let name = "\(reader.name("where"))[\(index)]"
                let clause = try ObjectReader(value, path: name)
                let field = try Self.fieldPath(clause, name)
                let opName = try clause.string("op")
                guard let op = Filter.Operator(rawValue: opName) else {
                    throw WireError(
                        .badMessage,
                        "\(clause.name("op")): unknown operator '\(opName.prefix(40))'; expected "
                            + Filter.Operator.allCases.map(\.rawValue).joined(separator: ", "))
                }
                let operand = try clause.required("value")
                if op.takesList {
                    guard case .array(let values) = operand, !values.isEmpty else {
                        throw WireError(
                            .badMessage, "\(clause.name("value")): '\(op.rawValue)' takes a non-empty array")
                    }
                }
                filters.append(Filter(field, op, operand))
            }
        }
        var orderBy: [Order] = []
        if reader.has("orderBy") {
            for (index, value) in try reader.array("orderBy").enumerated() {
                let name = "\(reader.name("orderBy"))[\(index)]"
                let clause = try ObjectReader(value, path: name)
                let direction = try clause.optionalString("direction") ?? "asc"
                guard direction == "asc" || direction == "desc" else {
                    throw WireError(.badMessage, "\(clause.name("direction")): expected asc or desc")
                }
                orderBy.append(Order(try Self.fieldPath(clause, name), descending: direction == "desc"))
            }
        }
        let limit = try reader.optionalInt("limit")
        if let limit, limit < 1 {
            throw WireError(.badMessage, "\(reader.name("limit")): expected 1 or more, not \(limit)")
        }
        self.init(filters: filters, orderBy: orderBy, limit: limit.map { Int(clamping: $0) })
    }

    private static func fieldPath(_ clause: ObjectReader, _ name: String) throws(WireError) -> FieldPath {
        do { return try FieldPath(try clause.string("field")) } catch { throw error.at(clause.name("field")) }
    }

    public func write(to writer: inout JSONWriter) {
        writer.beginObject()
        if !filters.isEmpty {
            writer.key("where")
            writer.beginArray()
            for filter in filters {
                writer.beginObject()
                writer.key("field")
                writer.string(filter.field.description)
                writer.key("op")
                writer.string(filter.op.rawValue)
                writer.key("value")
                writer.value(filter.value)
                writer.endObject()
            }
            writer.endArray()
        }
        if !orderBy.isEmpty {
            writer.key("orderBy")
            writer.beginArray()
            for order in orderBy {
                writer.beginObject()
                writer.key("field")
                writer.string(order.field.description)
                writer.key("direction")
                writer.string(order.descending ? "desc" : "asc")
                writer.endObject()
            }
            writer.endArray()
        }
        if let limit {
            writer.key("limit")
            writer.int(Int64(limit))
        }
        writer.endObject()
    }
}
