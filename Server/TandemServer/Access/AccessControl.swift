import Foundation
import TandemWire

/// Who may connect, and who may read and write what: the server's token file and rules file.
///
/// The token file maps bearer tokens to user ids:
///
/// ```json
/// {"tokens": {"c2VjcmV0LWFsaWNl": "alice", "c2VjcmV0LWJvYg": "bob"}}
/// ```
///
/// The rules file says, per collection path pattern, who may read (`listen`, `get`) and who
/// may write (`create`, `update`, `delete`; `write` stands for all three):
///
/// ```json
/// {"rules": [
///   {"match": "users/{uid}/notes", "read": "user == {uid}", "write": "user == {uid}"},
///   {"match": "accounts", "create": "request.owner == user",
///    "update": "resource.owner == user", "delete": "resource.owner == user"},
///   {"match": "accounts/{account}/transactions",
///    "read": "user == doc(accounts/{account}).owner || user in doc(accounts/{account}).members",
///    "write": "user == doc(accounts/{account}).owner || user in doc(accounts/{account}).members"}
/// ]}
/// ```
///
/// With either file, everything no rule allows is denied. A pattern matches a collection path
/// of as many segments, `{name}` matching any one segment; when several rules match, one that
/// allows is enough. The condition language is described on ``Condition``.
///
/// A read condition may look at the document read (`resource.members`): such a rule allows
/// one document at a time, so it lets a user `get` the documents it allows and listen with a
/// query, which then sees only those (``readScope(in:user:document:)``). Read conditions cannot
/// use `request`.
public struct AccessControl: Sendable {
    /// Bearer token → user id; nil without a token file.
    let tokens: [String: String]?
    /// How JWTs are verified; nil when they are not.
    public var jwt: JWTAuthentication?
    let rules: [Rule]

    public enum Operation: String, Sendable, CaseIterable {
        case read, create, update, delete
    }

    struct Rule: Sendable {
        /// The pattern's segments; `{name}` segments are variables.
        var pattern: [String]
        var conditions: [Operation: Condition]
    }

    /// Reads the token file and the rules file (either may be nil, not both unless `jwt` is given).
    public static func load(tokensFile: URL?, rulesFile: URL?, jwt: JWTAuthentication? = nil) throws(AccessError)
        -> AccessControl
    {
        func read(_ url: URL?) throws(AccessError) -> (text: String, source: String)? {
            guard let url else { return nil }
            do {
                return (try String(contentsOf: url, encoding: .utf8), url.path)
            } catch {
                throw AccessError("cannot read \(url.path): \(error.localizedDescription)")
            }
        }
        return try AccessControl(tokens: try read(tokensFile), rules: try read(rulesFile), jwt: jwt)
    }

    /// Parses the files' texts; `source` names each in error messages.
    public init(
        tokens: (text: String, source: String)?, rules: (text: String, source: String)?,
        jwt: JWTAuthentication? = nil
    ) throws(AccessError) {
        guard tokens != nil || rules != nil || jwt != nil else {
            throw AccessError("access control needs a token file, a rules file, JWT verification, or some of them")
        }
        self.tokens = try tokens.map { text, source throws(AccessError) in try Self.parseTokens(text, source) }
        self.rules = try rules.map { text, source throws(AccessError) in try Self.parseRules(text, source) } ?? []
        self.jwt = jwt
    }

    /// Why a token was refused: what the client is told, and, for a JWT, the reason counted.
    struct Refusal: Error {
        var error: WireError
        /// Why a JWT was refused; nil for a token the token file does not know, or none.
        var reason: TokenRefusal?
        /// As `/metrics` counts it.
        var label: String

        init(error: WireError, reason: TokenRefusal? = nil, label: String? = nil) {
            self.error = error
            self.reason = reason
            self.label = label ?? reason?.rawValue ?? "not_valid"
        }
    }

    /// Whether a client must present a token: with a token file or JWT verification.
    var requiresToken: Bool { tokens != nil || jwt != nil }

    /// Who a `hello` or `auth` token names: anonymous for a client of a server that needs no
    /// token. A token shaped as a JWT (three base64url parts) is verified as one when the
    /// server verifies JWTs; any other is looked up in the token file.
    ///
    /// - Throws: ``Refusal`` (`unauthenticated`) when a token is needed and missing, unknown,
    ///   or fails verification.
    func identify(_ token: String?, now: Date = Date()) throws(Refusal) -> Identity {
        guard requiresToken else { return .anonymous }
        guard let token, !token.isEmpty else {
            throw Refusal(
                error: WireError(.unauthenticated, "this server requires a token: send it in hello as \"token\""),
                label: "missing")
        }
        if let jwt, token.utf8.lazy.filter({ $0 == UInt8(ascii: ".") }).count == 2 {
            do {
                let verified = try jwt.verifier.verify(token, keys: jwt.keys?.keys() ?? .empty, now: now)
                return Identity(user: verified.user, token: verified.claims, expires: verified.expires)
            } catch {
                throw Refusal(
                    error: WireError(.unauthenticated, "the token was refused: \(Self.explain(error))"), reason: error)
            }
        }
        if token.utf8.count > TokenVerifier.maxTokenBytes {
            throw Refusal(
                error: WireError(.unauthenticated, "the token was refused: \(Self.explain(.malformed))"),
                reason: .malformed)
        }
        guard let user = tokens?[token] else {
            throw Refusal(error: WireError(.unauthenticated, "the token is not valid on this server"))
        }
        return Identity(user: user)
    }

    static func explain(_ refusal: TokenRefusal) -> String {
        switch refusal {
        case .malformed: "it is not a well-formed JWT of at most \(TokenVerifier.maxTokenBytes) bytes (malformed)"
        case .expired: "it has expired (expired)"
        case .notYetValid: "it is not valid yet: its nbf is still to come (not_yet_valid)"
        case .badSignature: "its signature does not verify (bad_signature)"
        case .unknownKey: "its kid names no key of this server's key set (unknown_key)"
        case .algorithm: "its alg is not one its key verifies (algorithm)"
        case .wrongIssuer: "its iss is not this server's issuer (wrong_issuer)"
        case .wrongAudience: "its aud does not name this server's audience (wrong_audience)"
        case .noUser: "it has no user claim (no_user)"
        }
    }

    /// Whether `user` may do `operation` in `collection`.
    ///
    /// - Parameters:
    ///   - resource: The stored document (update, delete).
    ///   - request: The fields written (create, update).
    ///   - document: Reads another document's fields for `doc(…)`.
    func allows(
        _ operation: Operation, in collection: CollectionPath, identity: Identity, resource: JSONObject? = nil,
        request: JSONObject? = nil, document: (CollectionPath, DocumentID) throws -> JSONObject?
    ) throws -> Bool {
        let segments = collection.rawValue.split(separator: "/").map(String.init)
        return try withoutActuallyEscaping(document) { document in
            for rule in rules {
                guard let condition = rule.conditions[operation], let variables = Self.match(rule.pattern, segments)
                else { continue }
                let context = Condition.Context(
                    user: identity.user, token: identity.token, variables: variables, resource: resource,
                    request: request, document: document)
                if try condition.evaluate(context) { return true }
            }
            return false
        }
    }

    /// How much of a collection a user may read.
    enum ReadScope: Sendable {
        /// Nothing: no rule allows it.
        case none
        /// Every document: a rule allows it without looking at the documents.
        case all
        /// The documents a rule that looks at each one (`resource.…`) allows.
        case perDocument
    }

    /// How much of `collection` `user` may read: decided by the rules that do not look at
    /// documents first (one that allows is enough), then by whether any rule that does
    /// matches the collection.
    func readScope(
        in collection: CollectionPath, identity: Identity,
        document: (CollectionPath, DocumentID) throws -> JSONObject?
    ) throws -> ReadScope {
        let segments = collection.rawValue.split(separator: "/").map(String.init)
        var perDocument = false
        let allowed = try withoutActuallyEscaping(document) { document in
            for rule in rules {
                guard let condition = rule.conditions[.read], let variables = Self.match(rule.pattern, segments)
                else { continue }
                if condition.readsResource {
                    perDocument = true
                    continue
                }
                let context = Condition.Context(
                    user: identity.user, token: identity.token, variables: variables, resource: nil, request: nil,
                    document: document)
                if try condition.evaluate(context) { return true }
            }
            return false
        }
        return allowed ? .all : perDocument ? .perDocument : .none
    }

    /// The documents the read rules of `collection` that look at each document read besides
    /// it (`doc(…)`).
    func documentsRead(byPerDocumentRulesOf collection: CollectionPath) -> [(CollectionPath, DocumentID)] {
        let segments = collection.rawValue.split(separator: "/").map(String.init)
        return rules.flatMap { rule -> [(CollectionPath, DocumentID)] in
            guard let condition = rule.conditions[.read], condition.readsResource,
                let variables = Self.match(rule.pattern, segments)
            else { return [] }
            return condition.documents(variables)
        }
    }

    /// How messages name a caller: `user 'alice'`, or `an anonymous client`.
    static func describe(_ user: String?) -> String {
        user.map { "user '\($0)'" } ?? "an anonymous client"
    }

    private static func match(_ pattern: [String], _ segments: [String]) -> [String: String]? {
        guard pattern.count == segments.count else { return nil }
        var variables: [String: String] = [:]
        for (part, segment) in zip(pattern, segments) {
            if part.hasPrefix("{") {
                variables[String(part.dropFirst().dropLast())] = segment
            } else if part != segment {
                return nil
            }
        }
        return variables
    }

    // MARK: - Files

    private static func parseTokens(_ text: String, _ source: String) throws(AccessError) -> [String: String] {
        let value: JSONValue
        do { value = try Wire.parse(Array(text.utf8)) } catch {
            throw AccessError("\(source): not JSON: \(error.message)")
        }
        guard let object = value.objectValue, let tokens = object["tokens"]?.objectValue,
            object.keys.allSatisfy({ $0 == "tokens" })
        else {
            throw AccessError(#"\#(source): expected {"tokens": {"TOKEN": "USER", …}}"#)
        }
        var result: [String: String] = [:]
        for (token, user) in tokens {
            guard !token.isEmpty else { throw AccessError("\(source): a token is empty") }
            guard let user = user.stringValue, !user.isEmpty else {
                throw AccessError("\(source): the user of token '\(token.prefix(4))…' must be a non-empty string")
            }
            result[token] = user
        }
        return result
    }

    private static func parseRules(_ text: String, _ source: String) throws(AccessError) -> [Rule] {
        let value: JSONValue
        do { value = try Wire.parse(Array(text.utf8)) } catch {
            throw AccessError("\(source): not JSON: \(error.message)")
        }
        guard let object = value.objectValue, let rules = object["rules"]?.arrayValue,
            object.keys.allSatisfy({ $0 == "rules" })
        else {
            throw AccessError(#"\#(source): expected {"rules": [{"match": "PATTERN", "read": "…", …}, …]}"#)
        }
        return try rules.enumerated().map { index, rule throws(AccessError) in
            try parseRule(rule, "\(source): rules[\(index)]")
        }
    }

    private static func parseRule(_ value: JSONValue, _ place: String) throws(AccessError) -> Rule {
        guard let object = value.objectValue else { throw AccessError("\(place): expected an object") }
        let known: Set<String> = ["match", "read", "write", "create", "update", "delete"]
        if let unknown = object.keys.sorted().first(where: { !known.contains($0) }) {
            throw AccessError(
                "\(place): unknown key '\(unknown)'; a rule has match and any of read, write, create, update, delete")
        }
        guard let match = object["match"]?.stringValue else {
            throw AccessError(
                "\(place): \"match\" must be a collection path pattern, like \"accounts/{account}/entries\"")
        }
        let pattern = match.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        guard pattern.count % 2 == 1 else {
            throw AccessError("\(place).match '\(match)' has an even number of segments; it must name a collection")
        }
        var names: Set<String> = []
        for part in pattern {
            if part.hasPrefix("{") {
                let name = String(part.dropFirst().dropLast())
                guard part.hasSuffix("}"), !name.isEmpty,
                    name.unicodeScalars.allSatisfy({
                        $0 == "_" || $0.properties.isAlphabetic || ("0"..."9").contains($0)
                    })
                else { throw AccessError("\(place).match '\(match)': '\(part)' is not a {variable}") }
                guard names.insert(name).inserted else {
                    throw AccessError("\(place).match '\(match)': {\(name)} appears twice")
                }
            } else {
                do { _ = try DocumentID(part) } catch {
                    throw AccessError("\(place).match '\(match)': \(error.message)")
                }
            }
        }

        var conditions: [Operation: Condition] = [:]
        func condition(_ key: String) throws(AccessError) -> Condition? {
            guard let value = object[key] else { return nil }
            if let constant = value.boolValue { return .constant(constant) }
            guard let text = value.stringValue else {
                throw AccessError("\(place).\(key) must be a condition (a string) or true/false")
            }
            let condition: Condition
            do { condition = try Condition(parsing: text) } catch {
                throw AccessError("\(place).\(key) '\(text)': \(error)")
            }
            if let unknown = condition.variables.subtracting(names).sorted().first {
                throw AccessError("\(place).\(key) uses {\(unknown)}, which \(match) does not define")
            }
            return condition
        }
        if let write = try condition("write") {
            for operation in [Operation.create, .update, .delete] { conditions[operation] = write }
        }
        for operation in Operation.allCases {
            if let specific = try condition(operation.rawValue) { conditions[operation] = specific }
        }
        if let read = conditions[.read], read.readsRequest {
            throw AccessError("\(place).read cannot use request: a read writes nothing (resource is the document read)")
        }
        return Rule(pattern: pattern, conditions: conditions)
    }
}

/// Why the token or rules file cannot be used.
public struct AccessError: Error, Sendable, CustomStringConvertible {
    public var message: String
    init(_ message: String) { self.message = message }
    public var description: String { message }
}

/// Who a caller is, as the rules see it: the user its token names (nil for an anonymous
/// client), and the claims of its verified JWT (nil with a token from the token file).
package struct Identity: Sendable, Equatable {
    package var user: String?
    package var token: JSONObject?
    /// The JWT's `exp`, in seconds since 1970.
    package var expires: Int64?

    package static let anonymous = Identity(user: nil)

    package init(user: String?, token: JSONObject? = nil, expires: Int64? = nil) {
        self.user = user
        self.token = token
        self.expires = expires
    }
}

/// JSON Web Tokens as a server takes them: the verifier (issuer, audience, user claim,
/// leeway, HMAC secret) and the key set it verifies with (nil: HS256 with the secret only).
public struct JWTAuthentication: Sendable {
    public var verifier: TokenVerifier
    public var keys: KeySetSource?

    public init(verifier: TokenVerifier, keys: KeySetSource?) {
        self.verifier = verifier
        self.keys = keys
    }
}
