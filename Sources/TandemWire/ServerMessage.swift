/// A message from the server to a client: a JSON object in a text frame, kind in `type`.
public enum ServerMessage: Sendable, Hashable {
    /// The answer to `hello`.
    case welcome(Welcome)
    /// Changes for a listener: the initial load (in pages), then every commit.
    case snapshot(Snapshot)
    /// The listener's resume token is too old or from another database; a full snapshot
    /// (`initial: true`) follows. The client should forget what it knows of the collection
    /// and take the snapshot as the whole truth.
    case reset(Reset)
    /// All ops of a write were applied.
    case ack(Ack)
    /// A precondition failed; nothing of the write was applied.
    case conflict(Conflict)
    /// The answer to `get`.
    case document(DocumentReply)
    /// Something was wrong; see ``ErrorCode``.
    case error(WireError)

    /// `{"type":"welcome","sessionId":"…","serverTime":1763683200000,"protocol":1,"limits":{…}}`
    public struct Welcome: Sendable, Hashable, Codable {
        public var sessionId: String
        public var serverTime: Int64
        public var protocolVersion: Int
        public var limits: Limits

        public init(sessionId: String, serverTime: Int64, protocolVersion: Int = Wire.protocolVersion, limits: Limits) {
            self.sessionId = sessionId
            self.serverTime = serverTime
            self.protocolVersion = protocolVersion
            self.limits = limits
        }

        private enum CodingKeys: String, CodingKey {
            case sessionId, serverTime, limits
            case protocolVersion = "protocol"
        }
    }

    /// `{"type":"snapshot","target":"t1","changes":[…],"resumeToken":"…","initial":true,"hasMore":false}`
    public struct Snapshot: Sendable, Hashable, Codable {
        public var target: String
        /// In the order the server committed them.
        public var changes: [Change]
        /// Store it with the changes; listen with it to resume after them.
        public var resumeToken: String
        /// True for the pages that bring the listener up to date after `listen`.
        public var initial: Bool
        /// True when more pages of the initial load follow.
        public var hasMore: Bool

        public init(target: String, changes: [Change], resumeToken: String, initial: Bool, hasMore: Bool = false) {
            self.target = target
            self.changes = changes
            self.resumeToken = resumeToken
            self.initial = initial
            self.hasMore = hasMore
        }
    }

    /// `{"type":"reset","target":"t1","reason":"…"}`
    public struct Reset: Sendable, Hashable, Codable {
        public var target: String
        public var reason: String

        public init(target: String, reason: String) {
            self.target = target
            self.reason = reason
        }
    }

    /// `{"type":"ack","request":"r1","results":[{"id":"…","version":1,"updateTime":…}]}`
    public struct Ack: Sendable, Hashable, Codable {
        public var request: String
        /// One per op, in order.
        public var results: [WriteResult]

        public init(request: String, results: [WriteResult]) {
            self.request = request
            self.results = results
        }
    }

    /// `{"type":"conflict","request":"r1","op":0,"server":{…document…}}`
    public struct Conflict: Sendable, Hashable, Codable {
        public var request: String
        /// The index of the op whose precondition failed.
        public var op: Int
        /// The server's current document (a tombstone when it was deleted).
        public var server: Document

        public init(request: String, op: Int, server: Document) {
            self.request = request
            self.op = op
            self.server = server
        }
    }

    /// `{"type":"document","request":"r2","document":{…}}`
    public struct DocumentReply: Sendable, Hashable, Codable {
        public var request: String
        public var document: Document

        public init(request: String, document: Document) {
            self.request = request
            self.document = document
        }
    }
}

/// The outcome of one write op.
public struct WriteResult: Sendable, Hashable, Codable {
    public var id: DocumentID
    /// The document's version after the op.
    public var version: Int64
    public var updateTime: Int64
    /// For a field-level merge: the document as stored, which may keep fields of other
    /// writers that were newer than the op's.
    public var document: Document?

    public init(id: DocumentID, version: Int64, updateTime: Int64, document: Document? = nil) {
        self.id = id
        self.version = version
        self.updateTime = updateTime
        self.document = document
    }
}

extension WireError: Codable {
    private enum CodingKeys: String, CodingKey {
        case code, message, request, target, op
    }

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.init(
            try container.decode(ErrorCode.self, forKey: .code),
            try container.decode(String.self, forKey: .message),
            request: try container.decodeIfPresent(String.self, forKey: .request),
            target: try container.decodeIfPresent(String.self, forKey: .target),
            op: try container.decodeIfPresent(Int.self, forKey: .op))
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(code, forKey: .code)
        try container.encode(message, forKey: .message)
        try container.encodeIfPresent(request, forKey: .request)
        try container.encodeIfPresent(target, forKey: .target)
        try container.encodeIfPresent(op, forKey: .op)
    }
}

extension ServerMessage: Codable {
    private enum TypeKey: String, CodingKey { case type }

    public init(from decoder: any Decoder) throws {
        let type = try decoder.container(keyedBy: TypeKey.self).decode(String.self, forKey: .type)
        switch type {
        case "welcome": self = .welcome(try Welcome(from: decoder))
        case "snapshot": self = .snapshot(try Snapshot(from: decoder))
        case "reset": self = .reset(try Reset(from: decoder))
        case "ack": self = .ack(try Ack(from: decoder))
        case "conflict": self = .conflict(try Conflict(from: decoder))
        case "document": self = .document(try DocumentReply(from: decoder))
        case "error": self = .error(try WireError(from: decoder))
        default: throw WireError(.badMessage, "unknown server message type '\(type.prefix(40))'")
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: TypeKey.self)
        switch self {
        case .welcome(let message):
            try container.encode("welcome", forKey: .type)
            try message.encode(to: encoder)
        case .snapshot(let message):
            try container.encode("snapshot", forKey: .type)
            try message.encode(to: encoder)
        case .reset(let message):
            try container.encode("reset", forKey: .type)
            try message.encode(to: encoder)
        case .ack(let message):
            try container.encode("ack", forKey: .type)
            try message.encode(to: encoder)
        case .conflict(let message):
            try container.encode("conflict", forKey: .type)
            try message.encode(to: encoder)
        case .document(let message):
            try container.encode("document", forKey: .type)
            try message.encode(to: encoder)
        case .error(let message):
            try container.encode("error", forKey: .type)
            try message.encode(to: encoder)
        }
    }
}
