/// A message from a client to the server. Every message is a JSON object in a text frame,
/// with its kind in `type`.
///
/// For example:
///
/// ```swift
/// let write = ClientMessage.write(.init(request: "r1", ops: [
///     .create(in: try CollectionPath("accounts"), fields: ["name": "Household"], idempotencyKey: key),
/// ]))
/// try connection.send(OutboundMessage(text: Wire.encode(write)))
/// ```
public enum ClientMessage: Sendable, Hashable {
    /// `{"type":"hello","protocol":1,"clientId":"device-7","token":"…"}`: must come first.
    case hello(Hello)
    /// `{"type":"listen","target":"t1","collection":"accounts","resumeToken":"…"}`.
    case listen(Listen)
    /// `{"type":"unlisten","target":"t1"}`.
    case unlisten(Unlisten)
    /// `{"type":"write","request":"r1","ops":[…]}`.
    case write(Write)
    /// `{"type":"get","request":"r2","collection":"accounts","id":"…"}`.
    case get(Get)

    public struct Hello: Sendable, Hashable, Codable {
        /// The protocol version the client speaks; this one is ``Wire/protocolVersion``.
        public var protocolVersion: Int
        /// Names the client (one per device and app install). Idempotency keys are remembered
        /// per client id, so it must be stable across reconnects.
        public var clientId: ClientName
        /// A bearer token, for servers with access control.
        public var token: String?

        public init(protocolVersion: Int = Wire.protocolVersion, clientId: ClientName, token: String? = nil) {
            self.protocolVersion = protocolVersion
            self.clientId = clientId
            self.token = token
        }

        private enum CodingKeys: String, CodingKey {
            case protocolVersion = "protocol"
            case clientId, token
        }
    }

    public struct Listen: Sendable, Hashable, Codable {
        /// The client's name for this listener, unique on the connection; snapshots carry it.
        public var target: String
        public var collection: CollectionPath
        /// Where to resume: the `resumeToken` of the last snapshot applied. Absent: everything.
        public var resumeToken: String?

        public init(target: String, collection: CollectionPath, resumeToken: String? = nil) {
            self.target = target
            self.collection = collection
            self.resumeToken = resumeToken
        }

        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            target = try container.decodeLabel(forKey: .target)
            collection = try container.decode(CollectionPath.self, forKey: .collection)
            resumeToken = try container.decodeIfPresent(String.self, forKey: .resumeToken)
        }
    }

    public struct Unlisten: Sendable, Hashable, Codable {
        public var target: String

        public init(target: String) { self.target = target }

        public init(from decoder: any Decoder) throws {
            target = try decoder.container(keyedBy: CodingKeys.self).decodeLabel(forKey: .target)
        }
    }

    public struct Write: Sendable, Hashable, Codable {
        /// The client's name for this write; the answer (`ack`, `conflict`, `error`) carries it.
        public var request: String
        /// Applied in order, all or nothing.
        public var ops: [WriteOp]

        public init(request: String, ops: [WriteOp]) {
            self.request = request
            self.ops = ops
        }

        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            request = try container.decodeLabel(forKey: .request)
            ops = try container.decode([WriteOp].self, forKey: .ops)
            if ops.isEmpty { throw WireError(.badMessage, "ops: a write needs at least one op", request: request) }
        }
    }

    public struct Get: Sendable, Hashable, Codable {
        public var request: String
        public var collection: CollectionPath
        public var id: DocumentID

        public init(request: String, collection: CollectionPath, id: DocumentID) {
            self.request = request
            self.collection = collection
            self.id = id
        }

        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            request = try container.decodeLabel(forKey: .request)
            collection = try container.decode(CollectionPath.self, forKey: .collection)
            id = try container.decode(DocumentID.self, forKey: .id)
        }
    }
}

/// One operation of a `write`.
///
/// JSON forms:
///
/// ```json
/// {"op":"create","collection":"accounts","fields":{"name":"Household"},"idempotencyKey":"k1"}
/// {"op":"create","collection":"accounts","id":"my-own-id","fields":{},"idempotencyKey":"k2"}
/// {"op":"update","collection":"accounts","id":"a1B2…","fields":{"name":"Home"},"baseVersion":3,"idempotencyKey":"k3"}
/// {"op":"delete","collection":"accounts","id":"a1B2…","baseVersion":4,"idempotencyKey":"k4"}
/// ```
///
/// `update` replaces all fields, or with `fieldTimes` merges them field by field. `baseVersion`
/// is the version the client last saw; when the server's document has another version the
/// write is refused with `conflict`. Without `baseVersion` the update or delete is
/// unconditional.
public struct WriteOp: Sendable, Hashable, Codable {
    public enum Kind: String, Sendable, Hashable, Codable {
        case create, update, delete
    }

    public var kind: Kind
    public var collection: CollectionPath
    /// Required for update and delete; for create, a proposed id (else the server picks one).
    public var id: DocumentID?
    /// Required for create and update; absent for delete.
    public var fields: JSONObject?
    public var baseVersion: Int64?
    /// Unique per client and operation: a resend with the same key gets the first answer.
    public var idempotencyKey: ClientName
    /// When present, the write merges field by field: each field keeps the value with the
    /// later time, the stored one or this one (see docs/PROTOCOL.md, "Field-level merge").
    public var fieldTimes: [String: Int64]?

    public init(
        kind: Kind, collection: CollectionPath, id: DocumentID?, fields: JSONObject?, baseVersion: Int64?,
        idempotencyKey: ClientName, fieldTimes: [String: Int64]? = nil
    ) {
        self.kind = kind
        self.collection = collection
        self.id = id
        self.fields = fields
        self.baseVersion = baseVersion
        self.idempotencyKey = idempotencyKey
        self.fieldTimes = fieldTimes
    }

    public static func create(
        in collection: CollectionPath, id: DocumentID? = nil, fields: JSONObject, idempotencyKey: ClientName
    ) -> WriteOp {
        WriteOp(
            kind: .create, collection: collection, id: id, fields: fields, baseVersion: nil,
            idempotencyKey: idempotencyKey)
    }

    public static func update(
        in collection: CollectionPath, id: DocumentID, fields: JSONObject, baseVersion: Int64?,
        idempotencyKey: ClientName
    ) -> WriteOp {
        WriteOp(
            kind: .update, collection: collection, id: id, fields: fields, baseVersion: baseVersion,
            idempotencyKey: idempotencyKey)
    }

    public static func delete(
        in collection: CollectionPath, id: DocumentID, baseVersion: Int64?, idempotencyKey: ClientName
    ) -> WriteOp {
        WriteOp(
            kind: .delete, collection: collection, id: id, fields: nil, baseVersion: baseVersion,
            idempotencyKey: idempotencyKey)
    }

    private enum CodingKeys: String, CodingKey {
        case kind = "op"
        case collection, id, fields, baseVersion, idempotencyKey, fieldTimes
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let name = try container.decode(String.self, forKey: .kind)
        guard let kind = Kind(rawValue: name) else {
            throw WireError(
                .badMessage,
                "\((decoder.codingPath + [CodingKeys.kind]).fieldName): unknown op '\(name.prefix(40))'; expected create, update or delete"
            )
        }
        self.kind = kind
        collection = try container.decode(CollectionPath.self, forKey: .collection)
        id = try container.decodeIfPresent(DocumentID.self, forKey: .id)
        fields = try container.decodeIfPresent(JSONObject.self, forKey: .fields)
        baseVersion = try container.decodeIfPresent(Int64.self, forKey: .baseVersion)
        idempotencyKey = try container.decode(ClientName.self, forKey: .idempotencyKey)
        fieldTimes = try container.decodeIfPresent([String: Int64].self, forKey: .fieldTimes)

        let at = decoder.codingPath.fieldName
        switch kind {
        case .create:
            if fields == nil { throw WireError(.badMessage, "\(at): a create needs fields") }
            if baseVersion != nil { throw WireError(.badMessage, "\(at): a create takes no baseVersion") }
        case .update:
            if id == nil { throw WireError(.badMessage, "\(at): an update needs an id") }
            if fields == nil { throw WireError(.badMessage, "\(at): an update needs fields") }
        case .delete:
            if id == nil { throw WireError(.badMessage, "\(at): a delete needs an id") }
            if fields != nil { throw WireError(.badMessage, "\(at): a delete takes no fields") }
            if fieldTimes != nil { throw WireError(.badMessage, "\(at): a delete takes no fieldTimes") }
        }
        if let fieldTimes, let fields, let unknown = fieldTimes.keys.first(where: { fields[$0] == nil }) {
            throw WireError(.badMessage, "\(at).fieldTimes: '\(unknown.prefix(40))' is not one of the fields")
        }
        if let baseVersion, baseVersion < 1 {
            throw WireError(.badMessage, "\(at).baseVersion: must be 1 or more, not \(baseVersion)")
        }
    }
}

extension ClientMessage: Codable {
    private enum TypeKey: String, CodingKey { case type }

    public static let typeNames = ["hello", "listen", "unlisten", "write", "get"]

    public init(from decoder: any Decoder) throws {
        let type = try decoder.container(keyedBy: TypeKey.self).decode(String.self, forKey: .type)
        switch type {
        case "hello": self = .hello(try Hello(from: decoder))
        case "listen": self = .listen(try Listen(from: decoder))
        case "unlisten": self = .unlisten(try Unlisten(from: decoder))
        case "write": self = .write(try Write(from: decoder))
        case "get": self = .get(try Get(from: decoder))
        default:
            throw WireError(
                .badMessage,
                "unknown message type '\(type.prefix(40))'; expected \(Self.typeNames.joined(separator: ", "))")
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: TypeKey.self)
        switch self {
        case .hello(let message):
            try container.encode("hello", forKey: .type)
            try message.encode(to: encoder)
        case .listen(let message):
            try container.encode("listen", forKey: .type)
            try message.encode(to: encoder)
        case .unlisten(let message):
            try container.encode("unlisten", forKey: .type)
            try message.encode(to: encoder)
        case .write(let message):
            try container.encode("write", forKey: .type)
            try message.encode(to: encoder)
        case .get(let message):
            try container.encode("get", forKey: .type)
            try message.encode(to: encoder)
        }
    }
}

extension KeyedDecodingContainer {
    /// A client-chosen label (`request`, `target`): 1 to 128 bytes, no control characters.
    func decodeLabel(forKey key: Key) throws -> String {
        let label = try decode(String.self, forKey: key)
        let field = (codingPath + [key]).fieldName
        if label.isEmpty || label.utf8.count > 128 {
            throw WireError(.badMessage, "\(field): must be 1 to 128 bytes long")
        }
        if label.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) {
            throw WireError(.badMessage, "\(field): may not contain control characters")
        }
        return label
    }
}
