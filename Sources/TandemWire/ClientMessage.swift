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
    /// `{"type":"auth","token":"…"}`: a fresh token for the open connection, before the one
    /// it has expires. Answered with `authenticated`.
    case auth(Auth)

    public struct Auth: Sendable, Hashable {
        public var token: String

        public init(token: String) { self.token = token }
    }

    public struct Hello: Sendable, Hashable {
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

    }

    public struct Listen: Sendable, Hashable {
        /// The client's name for this listener, unique on the connection; snapshots carry it.
        public var target: String
        public var collection: CollectionPath
        /// Where to resume: the `resumeToken` of the last snapshot applied. Absent: everything.
        public var resumeToken: String?
        /// Only the documents this query selects, in its order; nil for the whole collection.
        public var query: Query?
        /// For a query listener that resumes: the ids of the view its client holds, in order.
        /// The server then sends exactly what changed in it since the token.
        public var view: [DocumentID]?
        /// Snapshots leave out the changes this connection's own writes made, deletes
        /// excepted (`"excludeOwnWrites": true`): the writer knows them from its `ack`. Live
        /// snapshots leave out all of them; catch-up pages those the server kept track of; the
        /// full snapshot after a `reset` none. For a whole collection only; a query listener
        /// hears every write.
        public var excludesOwnWrites: Bool

        public init(
            target: String, collection: CollectionPath, resumeToken: String? = nil, query: Query? = nil,
            view: [DocumentID]? = nil, excludesOwnWrites: Bool = false
        ) {
            self.target = target
            self.collection = collection
            self.resumeToken = resumeToken
            self.query = query
            self.view = view
            self.excludesOwnWrites = excludesOwnWrites
        }

    }

    public struct Unlisten: Sendable, Hashable {
        public var target: String

        public init(target: String) { self.target = target }

    }

    public struct Write: Sendable, Hashable {
        /// The client's name for this write; the answer (`ack`, `conflict`, `error`) carries it.
        public var request: String
        /// Applied in order, all or nothing.
        public var ops: [WriteOp]

        public init(request: String, ops: [WriteOp]) {
            self.request = request
            self.ops = ops
        }

    }

    public struct Get: Sendable, Hashable {
        public var request: String
        public var collection: CollectionPath
        public var id: DocumentID

        public init(request: String, collection: CollectionPath, id: DocumentID) {
            self.request = request
            self.collection = collection
            self.id = id
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
public struct WriteOp: Sendable, Hashable {
    public enum Kind: String, Sendable, Hashable, Codable {
        case create, update, delete
    }

    public var kind: Kind
    public var collection: CollectionPath
    /// Required for update and delete; for create, a proposed id (else the server picks one).
    public var id: DocumentID?
    /// Required for create and update; absent for delete.
    public var fields: JSONObject? {
        get {
            switch content {
            case .tree(let fields): return fields
            case .canonical(let json):
                // The text CanonicalJSON read from a message: valid JSON, an object, within the
                // depth limit.
                guard let fields = try? Wire.decodeFields(json) else {
                    preconditionFailure(
                        "canonical fields that do not parse: \(String(decoding: json.prefix(80), as: UTF8.self))")
                }
                return fields
            case nil: return nil
            }
        }
        set { content = newValue.map(Content.tree) }
    }

    /// The fields as canonical JSON (sorted keys, no whitespace): as the message held them when
    /// it held them so, else encoded. nil for a delete.
    ///
    /// A decoded message keeps fields that arrived in that form (or nearly: whitespace and key
    /// order aside) as text, and parses them only when ``fields`` is read; the server stores the
    /// text and looks inside only for access rules and merges.
    public var canonicalFieldsJSON: [UInt8]? {
        switch content {
        case .tree(let fields): Wire.encodeCanonical(fields)
        case .canonical(let json): json
        case nil: nil
        }
    }

    /// The fields as given, or as canonical text read from a message (only ``CanonicalJSON``'s
    /// output belongs there: the `fields` getter must be able to parse it).
    enum Content: Sendable {
        case tree(JSONObject)
        case canonical([UInt8])
    }

    var content: Content?
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
        self.init(
            kind: kind, collection: collection, id: id, content: fields.map(Content.tree), baseVersion: baseVersion,
            idempotencyKey: idempotencyKey, fieldTimes: fieldTimes)
    }

    init(
        kind: Kind, collection: CollectionPath, id: DocumentID?, content: Content?, baseVersion: Int64?,
        idempotencyKey: ClientName, fieldTimes: [String: Int64]?
    ) {
        self.kind = kind
        self.collection = collection
        self.id = id
        self.content = content
        self.baseVersion = baseVersion
        self.idempotencyKey = idempotencyKey
        self.fieldTimes = fieldTimes
    }

    /// A create or update whose fields are already canonical text: what
    /// `JSONWriter(sortsKeys: true)` wrote for an object (the ``fields`` getter parses it back
    /// when asked). Tandem's push writes a row's fields so, straight from the row, instead of
    /// building a dictionary that the encoder then walks in sorted order.
    package init(
        kind: Kind, collection: CollectionPath, id: DocumentID?, canonicalFields: [UInt8], baseVersion: Int64?,
        idempotencyKey: ClientName
    ) {
        precondition(kind != .delete, "a delete has no fields")
        self.init(
            kind: kind, collection: collection, id: id, content: .canonical(canonicalFields), baseVersion: baseVersion,
            idempotencyKey: idempotencyKey, fieldTimes: nil)
    }

    /// Equal when they say the same: fields kept as text equal the same fields given as a tree.
    public static func == (left: WriteOp, right: WriteOp) -> Bool {
        left.kind == right.kind && left.collection == right.collection && left.id == right.id
            && left.baseVersion == right.baseVersion && left.idempotencyKey == right.idempotencyKey
            && left.fieldTimes == right.fieldTimes && left.fields == right.fields
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(kind)
        hasher.combine(collection)
        hasher.combine(id)
        hasher.combine(fields)
        hasher.combine(baseVersion)
        hasher.combine(idempotencyKey)
        hasher.combine(fieldTimes)
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

}
