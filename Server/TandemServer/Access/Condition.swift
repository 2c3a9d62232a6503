import TandemWire

/// A condition of an access rule, parsed from text such as
/// `user == doc(accounts/{account}).owner || user in doc(accounts/{account}).members`.
///
/// The language, in full:
///
/// - `true`, `false`; `!c`, `a && b`, `a || b`, parentheses.
/// - `x == y`, `x != y`: JSON equality. `x in y`: `y` is an array holding `x`.
/// - Values: `user` (the caller's user id, `null` without a token), `token.claim` (a claim of
///   the caller's verified JWT: `token.role`, `token.org.id`; `null` without one, and with a
///   token from the token file), `{name}` (a variable of the rule's path pattern), `'text'` or
///   `"text"`, integers, `true`, `false`, `null`,
///   `resource.field` (the stored document: for read, update and delete), `request.field` (the
///   fields written, for create and update), `doc(path).field` (another document, its path
///   written with the pattern's variables, like `doc(accounts/{account})`). Fields nest with
///   dots; a missing one is `null`.
indirect enum Condition: Sendable, Equatable {
    case constant(Bool)
    case not(Condition)
    case and(Condition, Condition)
    case or(Condition, Condition)
    case equal(Operand, Operand)
    case contains(element: Operand, array: Operand)

    enum Operand: Sendable, Equatable {
        case user
        /// A claim of the caller's verified JWT, by its path.
        case token([String])
        case variable(String)
        case literal(JSONValue)
        case resource([String])
        case request([String])
        /// `doc(a/{x}/b/{y}).field`: the path's segments (a `{name}` segment is a variable).
        case document([String], field: [String])
    }

    /// What a condition may read when it is evaluated.
    struct Context {
        var user: String?
        /// The caller's verified JWT's claims; nil without one.
        var token: JSONObject?
        var variables: [String: String]
        var resource: JSONObject?
        var request: JSONObject?
        /// Reads another document's fields (nil when it does not exist), by collection and id.
        var document: (CollectionPath, DocumentID) throws -> JSONObject?
    }

    func evaluate(_ context: Context) throws -> Bool {
        switch self {
        case .constant(let value): return value
        case .not(let condition): return try !condition.evaluate(context)
        case .and(let left, let right): return try left.evaluate(context) && right.evaluate(context)
        case .or(let left, let right): return try left.evaluate(context) || right.evaluate(context)
        case .equal(let left, let right): return try Self.value(left, context) == Self.value(right, context)
        case .contains(let element, let array):
            guard let items = try Self.value(array, context).arrayValue else { return false }
            return items.contains(try Self.value(element, context))
        }
    }

    private static func value(_ operand: Operand, _ context: Context) throws -> JSONValue {
        switch operand {
        case .user: return context.user.map(JSONValue.string) ?? .null
        case .token(let claim): return lookup(claim, in: context.token)
        case .variable(let name): return context.variables[name].map(JSONValue.string) ?? .null
        case .literal(let value): return value
        case .resource(let field): return lookup(field, in: context.resource)
        case .request(let field): return lookup(field, in: context.request)
        case .document(let segments, let field):
            // A variable that makes no valid path names no document: the value is null.
            guard let (collection, id) = document(segments, context.variables) else { return .null }
            return lookup(field, in: try context.document(collection, id))
        }
    }

    private static func lookup(_ field: [String], in object: JSONObject?) -> JSONValue {
        guard var value = object.map(JSONValue.object) else { return .null }
        for name in field {
            guard let next = value.objectValue?[name] else { return .null }
            value = next
        }
        return value
    }

    /// The documents the condition reads with `doc(…)`, with the rule's variables filled in.
    func documents(_ variables: [String: String]) -> [(CollectionPath, DocumentID)] {
        switch self {
        case .constant: []
        case .not(let condition): condition.documents(variables)
        case .and(let left, let right), .or(let left, let right): left.documents(variables) + right.documents(variables)
        case .equal(let left, let right), .contains(let left, let right):
            [left, right].compactMap { operand in
                guard case .document(let segments, _) = operand else { return nil }
                return Self.document(segments, variables)
            }
        }
    }

    /// The document `doc(…)` names, or nil when a variable makes no valid path.
    private static func document(_ segments: [String], _ variables: [String: String]) -> (CollectionPath, DocumentID)? {
        let path = segments.map { segment in
            segment.hasPrefix("{") ? variables[String(segment.dropFirst().dropLast())] ?? "" : segment
        }
        guard let collection = try? CollectionPath(path.dropLast().joined(separator: "/")),
            let id = try? DocumentID(path.last ?? "")
        else { return nil }
        return (collection, id)
    }

    /// Whether the condition reads the document it decides on (`resource.…`).
    var readsResource: Bool {
        uses {
            if case .resource = $0 { true } else { false }
        }
    }

    /// Whether the condition reads the fields written (`request.…`).
    var readsRequest: Bool {
        uses {
            if case .request = $0 { true } else { false }
        }
    }

    private func uses(_ kind: (Operand) -> Bool) -> Bool {
        switch self {
        case .constant: false
        case .not(let condition): condition.uses(kind)
        case .and(let left, let right), .or(let left, let right): left.uses(kind) || right.uses(kind)
        case .equal(let left, let right), .contains(let left, let right): kind(left) || kind(right)
        }
    }

    /// The variables the condition uses, to check them against the rule's pattern.
    var variables: Set<String> {
        switch self {
        case .constant: []
        case .not(let condition): condition.variables
        case .and(let left, let right), .or(let left, let right): left.variables.union(right.variables)
        case .equal(let left, let right), .contains(let left, let right):
            Set(
                [left, right].flatMap { operand -> [String] in
                    switch operand {
                    case .variable(let name): [name]
                    case .document(let segments, _):
                        segments.filter { $0.hasPrefix("{") }.map { String($0.dropFirst().dropLast()) }
                    default: []
                    }
                })
        }
    }
}

// MARK: - Parsing

extension Condition {
    /// Why a condition's text is not a condition, and where.
    struct ParseError: Error, CustomStringConvertible {
        var message: String
        /// The character offset in the text.
        var offset: Int
        var description: String { "\(message) (at character \(offset + 1))" }
    }

    init(parsing text: String) throws(ParseError) {
        var parser = Parser(Array(text.unicodeScalars))
        let condition = try parser.parseOr()
        parser.skipSpace()
        guard parser.atEnd else { throw parser.error("unexpected '\(parser.rest)'") }
        self = condition
    }

    private struct Parser {
        let text: [Unicode.Scalar]
        var index = 0

        init(_ text: [Unicode.Scalar]) { self.text = text }

        var atEnd: Bool { index >= text.count }
        var rest: String { String(String.UnicodeScalarView(text[index...].prefix(20))) }

        func error(_ message: String) -> ParseError { ParseError(message: message, offset: index) }

        mutating func skipSpace() {
            while !atEnd, text[index].properties.isWhitespace { index += 1 }
        }

        /// Consumes `token` (after spaces) when it comes next.
        mutating func take(_ token: String) -> Bool {
            skipSpace()
            let scalars = Array(token.unicodeScalars)
            guard index + scalars.count <= text.count, Array(text[index..<index + scalars.count]) == scalars else {
                return false
            }
            // A word must not run on into a longer word (`in` is not the start of `index`).
            if let last = scalars.last, Self.isWordScalar(last), index + scalars.count < text.count,
                Self.isWordScalar(text[index + scalars.count])
            {
                return false
            }
            index += scalars.count
            return true
        }

        /// Whether a comparison (`==`, `!=`, `in`) comes next, without taking it: `true` alone
        /// is a condition, `true == x` a comparison of a value.
        var comparesNext: Bool {
            var probe = self
            return probe.take("==") || probe.take("!=") || probe.take("in")
        }

        static func isWordScalar(_ scalar: Unicode.Scalar) -> Bool {
            scalar == "_" || scalar.properties.isAlphabetic || ("0"..."9").contains(scalar)
        }

        mutating func parseOr() throws(ParseError) -> Condition {
            var condition = try parseAnd()
            while take("||") { condition = .or(condition, try parseAnd()) }
            return condition
        }

        mutating func parseAnd() throws(ParseError) -> Condition {
            var condition = try parseUnary()
            while take("&&") { condition = .and(condition, try parseUnary()) }
            return condition
        }

        mutating func parseUnary() throws(ParseError) -> Condition {
            if take("!") {
                if take("=") { throw error("'!=' needs a value on its left") }
                return .not(try parseUnary())
            }
            if take("(") {
                let condition = try parseOr()
                guard take(")") else { throw error("expected ')'") }
                return condition
            }
            let left: Operand
            if take("true") {
                guard comparesNext else { return .constant(true) }
                left = .literal(.bool(true))
            } else if take("false") {
                guard comparesNext else { return .constant(false) }
                left = .literal(.bool(false))
            } else {
                left = try parseOperand()
            }
            if take("==") { return .equal(left, try parseOperand()) }
            if take("!=") { return .not(.equal(left, try parseOperand())) }
            if take("in") { return .contains(element: left, array: try parseOperand()) }
            throw error("expected ==, != or in after a value")
        }

        mutating func parseOperand() throws(ParseError) -> Operand {
            skipSpace()
            guard !atEnd else { throw error("expected a value, found the end") }
            let start = text[index]
            if start == "'" || start == "\"" { return .literal(.string(try parseString())) }
            if start == "-" || ("0"..."9").contains(start) { return .literal(.int(try parseInteger())) }
            if start == "{" {
                let name = try parseVariable()
                return .variable(name)
            }
            if take("null") { return .literal(.null) }
            if take("true") { return .literal(.bool(true)) }
            if take("false") { return .literal(.bool(false)) }
            if take("user") { return .user }
            if take("token") { return .token(try parseFields(required: true)) }
            if take("resource") { return .resource(try parseFields(required: true)) }
            if take("request") { return .request(try parseFields(required: true)) }
            if take("doc") {
                guard take("(") else { throw error("expected '(' after doc") }
                skipSpace()
                let pathStart = index
                while !atEnd, text[index] != ")" { index += 1 }
                guard !atEnd else { throw error("expected ')' to close doc(") }
                let path = String(String.UnicodeScalarView(text[pathStart..<index])).filter { $0 != " " }
                index += 1
                let segments = path.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
                guard segments.count >= 2, segments.count % 2 == 0 else {
                    throw ParseError(
                        message: "doc(\(path)) needs a document path: collection/id pairs, like accounts/{account}",
                        offset: pathStart)
                }
                for segment in segments where !segment.hasPrefix("{") {
                    do { _ = try DocumentID(segment) } catch {
                        throw ParseError(message: "doc(\(path)): \(error.message)", offset: pathStart)
                    }
                }
                for segment in segments where segment.hasPrefix("{") {
                    guard segment.hasSuffix("}"), segment.count > 2 else {
                        throw ParseError(message: "doc(\(path)): '\(segment)' is not a {variable}", offset: pathStart)
                    }
                }
                return .document(segments, field: try parseFields(required: true))
            }
            throw error(
                "expected a value (user, token.…, {variable}, 'text', a number, true, false, null, resource.…, "
                    + "request.… or doc(…).…)")
        }

        mutating func parseFields(required: Bool) throws(ParseError) -> [String] {
            var fields: [String] = []
            while !atEnd, text[index] == "." {
                index += 1
                let start = index
                while !atEnd, Self.isWordScalar(text[index]) || text[index] == "-" { index += 1 }
                guard index > start else { throw error("expected a field name after '.'") }
                fields.append(String(String.UnicodeScalarView(text[start..<index])))
            }
            if required && fields.isEmpty { throw error("expected .field") }
            return fields
        }

        mutating func parseVariable() throws(ParseError) -> String {
            index += 1
            let start = index
            while !atEnd, Self.isWordScalar(text[index]) { index += 1 }
            guard index > start, !atEnd, text[index] == "}" else { throw error("expected {name}") }
            defer { index += 1 }
            return String(String.UnicodeScalarView(text[start..<index]))
        }

        mutating func parseString() throws(ParseError) -> String {
            let quote = text[index]
            index += 1
            var scalars = String.UnicodeScalarView()
            while !atEnd, text[index] != quote {
                if text[index] == "\\", index + 1 < text.count { index += 1 }
                scalars.append(text[index])
                index += 1
            }
            guard !atEnd else { throw error("the text is not closed with \(quote)") }
            index += 1
            return String(scalars)
        }

        mutating func parseInteger() throws(ParseError) -> Int64 {
            let start = index
            if text[index] == "-" { index += 1 }
            while !atEnd, ("0"..."9").contains(text[index]) { index += 1 }
            guard let value = Int64(String(String.UnicodeScalarView(text[start..<index]))) else {
                throw ParseError(message: "not an integer", offset: start)
            }
            return value
        }
    }
}
