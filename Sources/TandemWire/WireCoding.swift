/// The JSON form of every protocol type, read and written by hand.
///
/// Decoding works on a parsed ``JSONValue`` and names the field at fault in every error
/// (`ops[2].fields: expected an object`); encoding writes straight into a byte buffer. The
/// types' `Codable` conformances go through the same code (``WireCodable``), so there is one
/// definition of each JSON form.

/// A protocol type that reads itself from its JSON form.
public protocol JSONReadable {
    /// - Parameter path: Where the value sits in the message (`ops[2]`), for error messages.
    init(json: JSONValue, path: String) throws(WireError)

    /// The deepest nesting ``Wire/decode(_:from:)`` accepts for it.
    static var maxNestingDepth: Int { get }
}

extension JSONReadable {
    public static var maxNestingDepth: Int { Wire.maxNestingDepth }
}

/// A protocol type whose `Codable` conformance is its JSON form.
public protocol WireCodable: JSONReadable, JSONWritable, Codable {}

extension WireCodable {
    public init(from decoder: any Decoder) throws {
        try self.init(json: try JSONValue(from: decoder), path: decoder.codingPath.fieldName)
    }

    public func encode(to encoder: any Encoder) throws {
        try Wire.value(of: self).encode(to: encoder)
    }
}

/// Reads the fields of a JSON object, naming each in errors.
struct ObjectReader {
    private let members: Members
    private let location: Location

    /// Where the object sits in the message (`ops[2]`), for error messages.
    var path: String {
        switch location {
        case .path(let path): path
        case .element(let list, let index): "\(list)[\(index)]"
        }
    }

    /// The object's place, made into text only for an error: most objects of a message are the
    /// elements of its one long list, and writing `changes[417]` out for each of them, and
    /// `changes[417].id` for each id read, was about 3 % of the throughput benchmark's CPU.
    private enum Location {
        case path(String)
        case element(of: String, Int)
    }

    /// A dictionary, or the members in order (a message's small objects, read once each:
    /// looking through ten members costs less than hashing them into a dictionary).
    private enum Members {
        case dictionary(JSONObject)
        case list(JSONMembers)
    }

    init(_ value: JSONValue, path: String) throws(WireError) {
        guard case .object(let object) = value else {
            throw WireError(.badMessage, "\(path.isEmpty ? "the message" : path): expected an object")
        }
        self.members = .dictionary(object)
        self.location = .path(path)
    }

    /// Element `index` of the list `list` (a top-level member of the message).
    init(_ value: JSONValue, element index: Int, of list: String) throws(WireError) {
        guard case .object(let object) = value else {
            throw WireError(.badMessage, "\(list)[\(index)]: expected an object")
        }
        self.members = .dictionary(object)
        self.location = .element(of: list, index)
    }

    /// An object read as its members (``JSONParser/parseMessage(_:maxDepth:listKey:canonicalKey:)``).
    init(members: JSONMembers, path: String) {
        self.members = .list(members)
        self.location = .path(path)
    }

    /// Element `index` of the list `list`, read as its members.
    init(members: JSONMembers, element index: Int, of list: String) {
        self.members = .list(members)
        self.location = .element(of: list, index)
    }

    func name(_ key: String) -> String {
        let path = self.path
        return path.isEmpty ? key : "\(path).\(key)"
    }

    /// Whether the member is there (and not null).
    func has(_ key: String) -> Bool { present(key) != nil }

    private func present(_ key: String) -> JSONValue? {
        let value: JSONValue? =
            switch members {
            case .dictionary(let object): object[key]
            case .list(let list): list.first { $0.key == key }?.value
            }
        guard let value else { return nil }
        if case .null = value { return nil }
        return value
    }

    func required(_ key: String) throws(WireError) -> JSONValue {
        guard let value = present(key) else { throw WireError(.badMessage, "\(name(key)): missing") }
        return value
    }

    func string(_ key: String) throws(WireError) -> String {
        guard case .string(let string) = try required(key) else { throw mistyped(key, "a string") }
        return string
    }

    func optionalString(_ key: String) throws(WireError) -> String? {
        guard let value = present(key) else { return nil }
        guard case .string(let string) = value else { throw mistyped(key, "a string") }
        return string
    }

    func int(_ key: String) throws(WireError) -> Int64 {
        guard let value = Self.integer(try required(key)) else { throw mistyped(key, "an integer") }
        return value
    }

    func optionalInt(_ key: String) throws(WireError) -> Int64? {
        guard let value = present(key) else { return nil }
        guard let integer = Self.integer(value) else { throw mistyped(key, "an integer") }
        return integer
    }

    func optionalBool(_ key: String) throws(WireError) -> Bool? {
        guard let value = present(key) else { return nil }
        guard case .bool(let bool) = value else { throw mistyped(key, "true or false") }
        return bool
    }

    func object(_ key: String) throws(WireError) -> JSONObject {
        guard case .object(let object) = try required(key) else { throw mistyped(key, "an object") }
        return object
    }

    func optionalObject(_ key: String) throws(WireError) -> JSONObject? {
        guard let value = present(key) else { return nil }
        guard case .object(let object) = value else { throw mistyped(key, "an object") }
        return object
    }

    func array(_ key: String) throws(WireError) -> [JSONValue] {
        guard case .array(let array) = try required(key) else { throw mistyped(key, "an array") }
        return array
    }

    func optionalTimes(_ key: String) throws(WireError) -> [String: Int64]? {
        guard let object = try optionalObject(key) else { return nil }
        var times: [String: Int64] = [:]
        for (field, value) in object {
            guard let time = Self.integer(value) else { throw mistyped("\(key).\(field)", "an integer") }
            times[field] = time
        }
        return times
    }

    func read<T: JSONReadable>(_ key: String, as type: T.Type) throws(WireError) -> T {
        try T(json: try required(key), path: name(key))
    }

    func optionalRead<T: JSONReadable>(_ key: String, as type: T.Type) throws(WireError) -> T? {
        guard let value = present(key) else { return nil }
        return try T(json: value, path: name(key))
    }

    /// A name (an id, a path, a key), with the member's name written out only when it is wrong.
    func read<T: WireName>(_ key: String, as type: T.Type) throws(WireError) -> T {
        let value = try required(key)
        if case .string(let string) = value, let valid = T(valid: string) { return valid }
        return try T(json: value, path: name(key))
    }

    func optionalRead<T: WireName>(_ key: String, as type: T.Type) throws(WireError) -> T? {
        guard let value = present(key) else { return nil }
        if case .string(let string) = value, let valid = T(valid: string) { return valid }
        return try T(json: value, path: name(key))
    }

    /// A client-chosen label (`request`, `target`): 1 to 128 bytes, no control characters.
    func label(_ key: String) throws(WireError) -> String {
        let label = try string(key)
        if label.isEmpty || label.utf8.count > Wire.maxLabelBytes {
            throw WireError(.badMessage, "\(name(key)): must be 1 to \(Wire.maxLabelBytes) bytes long")
        }
        if label.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) {
            throw WireError(.badMessage, "\(name(key)): may not contain control characters")
        }
        return label
    }

    private func mistyped(_ key: String, _ expected: String) -> WireError {
        WireError(.badMessage, "\(name(key)): expected \(expected)")
    }

    private static func integer(_ value: JSONValue) -> Int64? {
        switch value {
        case .int(let int): int
        case .double(let double) where double.rounded() == double && abs(double) < 9.2e18: Int64(double)
        default: nil
        }
    }
}

// MARK: - Names

/// A string type with naming rules, read from a message's string when it keeps them.
protocol WireName: JSONReadable {
    /// The name, or nil when `string` breaks a rule (then ``JSONReadable/init(json:path:)``
    /// says which).
    init?(valid string: String)
}

extension CollectionPath: WireName {
    init?(valid string: String) {
        guard Self.isValid(string) else { return nil }
        self.init(unchecked: string)
    }

    public init(json: JSONValue, path: String) throws(WireError) {
        guard case .string(let string) = json else { throw WireError(.badMessage, "\(path): expected a string") }
        do { try self.init(string) } catch { throw error.at(path) }
    }
}

extension DocumentID: WireName {
    init?(valid string: String) {
        guard Name.isValid(string) else { return nil }
        self.init(unchecked: string)
    }

    public init(json: JSONValue, path: String) throws(WireError) {
        guard case .string(let string) = json else { throw WireError(.badMessage, "\(path): expected a string") }
        do { try self.init(string) } catch { throw error.at(path) }
    }
}

extension ClientName: WireName {
    init?(valid string: String) {
        guard Name.isValid(string) else { return nil }
        self.init(unchecked: string)
    }

    public init(json: JSONValue, path: String) throws(WireError) {
        guard case .string(let string) = json else { throw WireError(.badMessage, "\(path): expected a string") }
        let field = path.split(separator: ".").last.map(String.init) ?? "name"
        do { try self.init(string, field: field) } catch { throw error.at(path) }
    }
}

// MARK: - Documents

extension Document: WireCodable {
    public init(json: JSONValue, path: String) throws(WireError) {
        let reader = try ObjectReader(json, path: path)
        try self.init(reader)
    }

    init(_ reader: ObjectReader) throws(WireError) {
        self.init(
            id: try reader.read("id", as: DocumentID.self), version: try reader.int("version"),
            fields: try reader.optionalObject("fields") ?? [:], createTime: try reader.optionalInt("createTime") ?? 0,
            updateTime: try reader.optionalInt("updateTime") ?? 0, deleted: try reader.optionalBool("deleted") ?? false,
            createKey: try reader.optionalString("createKey"), fieldTimes: try reader.optionalTimes("fieldTimes"))
    }

    public func write(to writer: inout JSONWriter) {
        writer.beginObject()
        writeMembers(to: &writer)
        writer.endObject()
    }

    func writeMembers(to writer: inout JSONWriter) {
        writer.key("id")
        writer.string(id.rawValue)
        writer.key("version")
        writer.int(version)
        writer.key("fields")
        // In canonical order (sorted keys, at every level), as the server stores them and
        // splices them into snapshots and exports: a document reads the same in every message.
        let sorts = writer.sortsKeys
        writer.sortsKeys = true
        writer.object(fields)
        writer.sortsKeys = sorts
        writer.key("createTime")
        writer.int(createTime)
        writer.key("updateTime")
        writer.int(updateTime)
        writer.key("deleted")
        writer.bool(deleted)
        if let createKey {
            writer.key("createKey")
            writer.string(createKey)
        }
        if let fieldTimes {
            writer.key("fieldTimes")
            writer.beginObject()
            for field in fieldTimes.keys.sorted() {
                writer.key(field)
                writer.int(fieldTimes[field]!)
            }
            writer.endObject()
        }
    }
}

extension Change: WireCodable {
    public init(json: JSONValue, path: String) throws(WireError) {
        try self.init(try ObjectReader(json, path: path))
    }

    init(_ reader: ObjectReader) throws(WireError) {
        let name = try reader.string("kind")
        guard let kind = Kind(rawValue: name) else {
            throw WireError(.badMessage, "\(reader.name("kind")): unknown kind '\(name.prefix(40))'")
        }
        self.init(kind, try Document(reader))
        oldIndex = try reader.optionalInt("oldIndex").map { Int(clamping: $0) }
        newIndex = try reader.optionalInt("newIndex").map { Int(clamping: $0) }
    }

    public func write(to writer: inout JSONWriter) {
        writer.beginObject()
        writer.key("kind")
        writer.string(kind.rawValue)
        if let oldIndex, let newIndex {
            writer.key("oldIndex")
            writer.int(Int64(oldIndex))
            writer.key("newIndex")
            writer.int(Int64(newIndex))
        }
        document.writeMembers(to: &writer)
        writer.endObject()
    }
}

extension Limits: WireCodable {
    public init(json: JSONValue, path: String) throws(WireError) {
        let reader = try ObjectReader(json, path: path)
        self.init(
            maxMessageBytes: Int(try reader.int("maxMessageBytes")),
            maxOpsPerWrite: Int(try reader.int("maxOpsPerWrite")),
            maxListenersPerConnection: Int(try reader.int("maxListenersPerConnection")),
            maxDocumentBytes: Int(try reader.int("maxDocumentBytes")))
    }

    public func write(to writer: inout JSONWriter) {
        writer.beginObject()
        writer.key("maxMessageBytes")
        writer.int(Int64(maxMessageBytes))
        writer.key("maxOpsPerWrite")
        writer.int(Int64(maxOpsPerWrite))
        writer.key("maxListenersPerConnection")
        writer.int(Int64(maxListenersPerConnection))
        writer.key("maxDocumentBytes")
        writer.int(Int64(maxDocumentBytes))
        writer.endObject()
    }
}

// MARK: - Client messages

extension WriteOp: WireCodable {
    public init(json: JSONValue, path: String) throws(WireError) {
        try self.init(ObjectReader(json, path: path))
    }

    /// - Parameter canonicalFields: The canonical text of the op's `fields`, when the parser
    ///   read them that way (the reader then holds an empty object in their place).
    init(_ reader: ObjectReader, canonicalFields: [UInt8]? = nil) throws(WireError) {
        let name = try reader.string("op")
        guard let kind = Kind(rawValue: name) else {
            throw WireError(
                .badMessage, "\(reader.name("op")): unknown op '\(name.prefix(40))'; expected create, update or delete")
        }
        let collection = try reader.read("collection", as: CollectionPath.self)
        let id = try reader.optionalRead("id", as: DocumentID.self)
        // A placeholder (an empty object) where the parser read the fields as text.
        let readFields = try reader.optionalObject("fields")
        let baseVersion = try reader.optionalInt("baseVersion")
        let idempotencyKey = try reader.read("idempotencyKey", as: ClientName.self)
        let fieldTimes = try reader.optionalTimes("fieldTimes")
        // A merge reads the fields (here, to check the times' names, and on the server), so its
        // fields are parsed once and kept as a tree.
        let content: Content? =
            if let canonicalFields {
                fieldTimes == nil ? .canonical(canonicalFields) : .tree(try Wire.decodeFields(canonicalFields))
            } else {
                readFields.map(Content.tree)
            }
        self.init(
            kind: kind, collection: collection, id: id, content: content, baseVersion: baseVersion,
            idempotencyKey: idempotencyKey, fieldTimes: fieldTimes)
        // Whether there are fields, without parsing fields kept as text.
        let hasFields = content != nil
        switch kind {
        case .create:
            if !hasFields { throw WireError(.badMessage, "\(reader.path): a create needs fields") }
            if baseVersion != nil { throw WireError(.badMessage, "\(reader.path): a create takes no baseVersion") }
        case .update:
            if id == nil { throw WireError(.badMessage, "\(reader.path): an update needs an id") }
            if !hasFields { throw WireError(.badMessage, "\(reader.path): an update needs fields") }
        case .delete:
            if id == nil { throw WireError(.badMessage, "\(reader.path): a delete needs an id") }
            if hasFields { throw WireError(.badMessage, "\(reader.path): a delete takes no fields") }
            if fieldTimes != nil { throw WireError(.badMessage, "\(reader.path): a delete takes no fieldTimes") }
        }
        if let fieldTimes, let fields, let unknown = fieldTimes.keys.first(where: { fields[$0] == nil }) {
            throw WireError(.badMessage, "\(reader.path).fieldTimes: '\(unknown.prefix(40))' is not one of the fields")
        }
        if let baseVersion, baseVersion < 1 {
            throw WireError(.badMessage, "\(reader.path).baseVersion: must be 1 or more, not \(baseVersion)")
        }
    }

    public func write(to writer: inout JSONWriter) {
        writer.beginObject()
        writer.key("op")
        writer.string(kind.rawValue)
        writer.key("collection")
        writer.string(collection.rawValue)
        if let id {
            writer.key("id")
            writer.string(id.rawValue)
        }
        switch content {
        case .tree(let fields):
            writer.key("fields")
            writer.object(fields)
        case .canonical(let json):
            writer.key("fields")
            writer.raw(json)
        case nil:
            break
        }
        if let baseVersion {
            writer.key("baseVersion")
            writer.int(baseVersion)
        }
        writer.key("idempotencyKey")
        writer.string(idempotencyKey.rawValue)
        if let fieldTimes {
            writer.key("fieldTimes")
            writer.beginObject()
            for (field, time) in fieldTimes {
                writer.key(field)
                writer.int(time)
            }
            writer.endObject()
        }
        writer.endObject()
    }
}

extension ClientMessage: WireCodable {
    public static let typeNames = ["hello", "listen", "unlisten", "write", "get", "auth"]

    public init(json: JSONValue, path: String) throws(WireError) {
        try self.init(try ObjectReader(json, path: path), ops: nil)
    }

    /// - Parameter ops: A write's ops as ``JSONParser/parseMessage(_:maxDepth:listKey:canonicalKey:)``
    ///   read them; nil to read them from `reader`.
    init(_ reader: ObjectReader, ops listed: [JSONElement]?) throws(WireError) {
        let type = try reader.string("type")
        switch type {
        case "hello":
            self = .hello(
                Hello(
                    protocolVersion: Int(try reader.int("protocol")),
                    clientId: try reader.read("clientId", as: ClientName.self),
                    token: try reader.optionalString("token")))
        case "listen":
            var listen = Listen(
                target: try reader.label("target"),
                collection: try reader.read("collection", as: CollectionPath.self),
                resumeToken: try reader.optionalString("resumeToken"),
                query: try reader.optionalRead("query", as: Query.self),
                excludesOwnWrites: try reader.optionalBool("excludeOwnWrites") ?? false)
            do throws(WireError) {
                if reader.has("view") { listen.view = try Self.view(reader, listen) }
            } catch {
                throw WireError(error.code, error.message, target: listen.target)
            }
            self = .listen(listen)
        case "unlisten":
            self = .unlisten(Unlisten(target: try reader.label("target")))
        case "write":
            let request = try reader.label("request")
            let elements: [JSONElement]
            if let listed {
                elements = listed
            } else {
                elements = try reader.array("ops").map { .value($0) }
            }
            if elements.isEmpty { throw WireError(.badMessage, "ops: a write needs at least one op", request: request) }
            var ops: [WriteOp] = []
            ops.reserveCapacity(elements.count)
            let list = reader.name("ops")
            for (index, element) in elements.enumerated() {
                switch element {
                case .members(let members, let canonical):
                    ops.append(
                        try WriteOp(
                            ObjectReader(members: members, element: index, of: list), canonicalFields: canonical))
                case .value(let value):
                    ops.append(try WriteOp(ObjectReader(value, element: index, of: list)))
                }
            }
            self = .write(Write(request: request, ops: ops))
        case "get":
            self = .get(
                Get(
                    request: try reader.label("request"),
                    collection: try reader.read("collection", as: CollectionPath.self),
                    id: try reader.read("id", as: DocumentID.self)))
        case "auth":
            self = .auth(Auth(token: try reader.string("token")))
        default:
            throw WireError(
                .badMessage,
                "unknown message type '\(type.prefix(40))'; expected \(Self.typeNames.joined(separator: ", "))")
        }
    }

    /// A resuming query listener's `view`: the ids its client holds, in order, each once.
    private static func view(_ reader: ObjectReader, _ listen: Listen) throws(WireError) -> [DocumentID] {
        guard let query = listen.query, listen.resumeToken != nil else {
            throw WireError(
                .badMessage,
                "\(reader.name("view")): only a query listener that resumes (with query and resumeToken) sends its view"
            )
        }
        let values = try reader.array("view")
        if let limit = query.limit, values.count > limit {
            throw WireError(
                .badMessage, "\(reader.name("view")): \(values.count) ids, more than the query's limit of \(limit)")
        }
        var ids: [DocumentID] = []
        var seen: Set<DocumentID> = []
        for (index, value) in values.enumerated() {
            let id = try DocumentID(json: value, path: "\(reader.name("view"))[\(index)]")
            guard seen.insert(id).inserted else {
                throw WireError(.badMessage, "\(reader.name("view"))[\(index)]: '\(id)' appears twice")
            }
            ids.append(id)
        }
        return ids
    }

    public func write(to writer: inout JSONWriter) {
        writer.beginObject()
        writer.key("type")
        switch self {
        case .hello(let hello):
            writer.string("hello")
            writer.key("protocol")
            writer.int(Int64(hello.protocolVersion))
            writer.key("clientId")
            writer.string(hello.clientId.rawValue)
            if let token = hello.token {
                writer.key("token")
                writer.string(token)
            }
        case .listen(let listen):
            writer.string("listen")
            writer.key("target")
            writer.string(listen.target)
            writer.key("collection")
            writer.string(listen.collection.rawValue)
            if let token = listen.resumeToken {
                writer.key("resumeToken")
                writer.string(token)
            }
            if let query = listen.query {
                writer.key("query")
                query.write(to: &writer)
            }
            if let view = listen.view {
                writer.key("view")
                writer.beginArray()
                for id in view { writer.string(id.rawValue) }
                writer.endArray()
            }
            if listen.excludesOwnWrites {
                writer.key("excludeOwnWrites")
                writer.bool(true)
            }
        case .unlisten(let unlisten):
            writer.string("unlisten")
            writer.key("target")
            writer.string(unlisten.target)
        case .write(let write):
            writer.string("write")
            writer.key("request")
            writer.string(write.request)
            writer.key("ops")
            writer.beginArray()
            for op in write.ops { op.write(to: &writer) }
            writer.endArray()
        case .get(let get):
            writer.string("get")
            writer.key("request")
            writer.string(get.request)
            writer.key("collection")
            writer.string(get.collection.rawValue)
            writer.key("id")
            writer.string(get.id.rawValue)
        case .auth(let auth):
            writer.string("auth")
            writer.key("token")
            writer.string(auth.token)
        }
        writer.endObject()
    }
}

// MARK: - Server messages

extension WriteResult: WireCodable {
    public init(json: JSONValue, path: String) throws(WireError) {
        try self.init(ObjectReader(json, path: path))
    }

    init(_ reader: ObjectReader) throws(WireError) {
        self.init(
            id: try reader.read("id", as: DocumentID.self), version: try reader.int("version"),
            updateTime: try reader.optionalInt("updateTime") ?? 0,
            document: try reader.optionalRead("document", as: Document.self))
    }

    public func write(to writer: inout JSONWriter) {
        writer.beginObject()
        writer.key("id")
        writer.string(id.rawValue)
        writer.key("version")
        writer.int(version)
        writer.key("updateTime")
        writer.int(updateTime)
        if let document {
            writer.key("document")
            document.write(to: &writer)
        }
        writer.endObject()
    }
}

extension WireError: WireCodable {
    public init(json: JSONValue, path: String) throws(WireError) {
        try self.init(try ObjectReader(json, path: path))
    }

    init(_ reader: ObjectReader) throws(WireError) {
        self.init(
            ErrorCode(rawValue: try reader.string("code")), try reader.string("message"),
            request: try reader.optionalString("request"), target: try reader.optionalString("target"),
            op: try reader.optionalInt("op").map(Int.init))
    }

    public func write(to writer: inout JSONWriter) {
        writer.beginObject()
        writeMembers(to: &writer)
        writer.endObject()
    }

    func writeMembers(to writer: inout JSONWriter) {
        writer.key("code")
        writer.string(code.rawValue)
        writer.key("message")
        writer.string(message)
        if let request {
            writer.key("request")
            writer.string(request)
        }
        if let target {
            writer.key("target")
            writer.string(target)
        }
        if let op {
            writer.key("op")
            writer.int(Int64(op))
        }
    }
}

extension ServerMessage: WireCodable {
    /// The `type` of each kind of message this version's server sends.
    public static let kinds: Set<String> = [
        "welcome", "snapshot", "reset", "ack", "conflict", "document", "error", "authenticated",
    ]

    public static var maxNestingDepth: Int { Wire.maxServerNestingDepth }

    public init(json: JSONValue, path: String) throws(WireError) {
        try self.init(try ObjectReader(json, path: path), changes: nil)
    }

    /// - Parameter changes: A snapshot's changes as ``JSONParser/parseMessage(_:maxDepth:listKey:canonicalKey:)``
    ///   read them; nil to read them from `reader`.
    init(_ reader: ObjectReader, changes listed: [JSONElement]?) throws(WireError) {
        let type = try reader.string("type")
        switch type {
        case "welcome":
            self = .welcome(
                Welcome(
                    sessionId: try reader.string("sessionId"), serverTime: try reader.int("serverTime"),
                    protocolVersion: Int(try reader.int("protocol")),
                    limits: try reader.read("limits", as: Limits.self),
                    user: try reader.optionalString("user"), expires: try reader.optionalInt("expires")))
        case "snapshot":
            let elements: [JSONElement]
            if let listed {
                elements = listed
            } else {
                elements = try reader.array("changes").map { .value($0) }
            }
            var changes: [Change] = []
            changes.reserveCapacity(elements.count)
            for (index, element) in elements.enumerated() {
                switch element {
                case .members(let members, _):
                    changes.append(try Change(ObjectReader(members: members, element: index, of: "changes")))
                case .value(let value): changes.append(try Change(ObjectReader(value, element: index, of: "changes")))
                }
            }
            self = .snapshot(
                Snapshot(
                    target: try reader.string("target"), changes: changes,
                    resumeToken: try reader.string("resumeToken"),
                    initial: try reader.optionalBool("initial") ?? false,
                    hasMore: try reader.optionalBool("hasMore") ?? false))
        case "reset":
            self = .reset(Reset(target: try reader.string("target"), reason: try reader.string("reason")))
        case "ack":
            let values = try reader.array("results")
            var results: [WriteResult] = []
            for (index, value) in values.enumerated() {
                results.append(try WriteResult(ObjectReader(value, element: index, of: "results")))
            }
            self = .ack(Ack(request: try reader.string("request"), results: results))
        case "conflict":
            self = .conflict(
                Conflict(
                    request: try reader.string("request"), op: Int(try reader.int("op")),
                    server: try reader.read("server", as: Document.self)))
        case "document":
            self = .document(
                DocumentReply(
                    request: try reader.string("request"), document: try reader.read("document", as: Document.self)))
        case "error":
            self = .error(try WireError(reader))
        case "authenticated":
            self = .authenticated(
                Authenticated(user: try reader.optionalString("user"), expires: try reader.optionalInt("expires")))
        default:
            throw WireError(.badMessage, "unknown server message type '\(type.prefix(40))'")
        }
    }

    public func write(to writer: inout JSONWriter) {
        writer.beginObject()
        writer.key("type")
        switch self {
        case .welcome(let welcome):
            writer.string("welcome")
            writer.key("sessionId")
            writer.string(welcome.sessionId)
            writer.key("serverTime")
            writer.int(welcome.serverTime)
            writer.key("protocol")
            writer.int(Int64(welcome.protocolVersion))
            writer.key("limits")
            welcome.limits.write(to: &writer)
            if let user = welcome.user {
                writer.key("user")
                writer.string(user)
            }
            if let expires = welcome.expires {
                writer.key("expires")
                writer.int(expires)
            }
        case .snapshot(let snapshot):
            writer.string("snapshot")
            writer.key("target")
            writer.string(snapshot.target)
            writer.key("changes")
            writer.beginArray()
            for change in snapshot.changes { change.write(to: &writer) }
            writer.endArray()
            writer.key("resumeToken")
            writer.string(snapshot.resumeToken)
            writer.key("initial")
            writer.bool(snapshot.initial)
            writer.key("hasMore")
            writer.bool(snapshot.hasMore)
        case .reset(let reset):
            writer.string("reset")
            writer.key("target")
            writer.string(reset.target)
            writer.key("reason")
            writer.string(reset.reason)
        case .ack(let ack):
            writer.string("ack")
            writer.key("request")
            writer.string(ack.request)
            writer.key("results")
            writer.beginArray()
            for result in ack.results { result.write(to: &writer) }
            writer.endArray()
        case .conflict(let conflict):
            writer.string("conflict")
            writer.key("request")
            writer.string(conflict.request)
            writer.key("op")
            writer.int(Int64(conflict.op))
            writer.key("server")
            conflict.server.write(to: &writer)
        case .document(let reply):
            writer.string("document")
            writer.key("request")
            writer.string(reply.request)
            writer.key("document")
            reply.document.write(to: &writer)
        case .error(let error):
            writer.string("error")
            error.writeMembers(to: &writer)
        case .authenticated(let authenticated):
            writer.string("authenticated")
            if let user = authenticated.user {
                writer.key("user")
                writer.string(user)
            }
            if let expires = authenticated.expires {
                writer.key("expires")
                writer.int(expires)
            }
        }
        writer.endObject()
    }
}

// MARK: - Plain values

extension JSONValue: JSONWritable {
    public func write(to writer: inout JSONWriter) { writer.value(self) }
}

extension Dictionary: JSONWritable where Key == String, Value == JSONValue {
    public func write(to writer: inout JSONWriter) { writer.object(self) }
}

extension Array: JSONWritable where Element: JSONWritable {
    public func write(to writer: inout JSONWriter) {
        writer.beginArray()
        for element in self { element.write(to: &writer) }
        writer.endArray()
    }
}

extension String: JSONWritable {
    public func write(to writer: inout JSONWriter) { writer.string(self) }
}
