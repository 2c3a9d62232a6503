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
    /// The answer to `auth`: the new token was verified, and the listeners decided again.
    case authenticated(Authenticated)

    /// `{"type":"authenticated","user":"alice","expires":1764680000}`
    public struct Authenticated: Sendable, Hashable {
        public var user: String?
        /// The token's `exp`, in seconds since 1970; absent when it has none.
        public var expires: Int64?

        public init(user: String?, expires: Int64?) {
            self.user = user
            self.expires = expires
        }
    }

    /// `{"type":"welcome","sessionId":"…","serverTime":1763683200000,"protocol":1,"limits":{…}}`
    public struct Welcome: Sendable, Hashable {
        public var sessionId: String
        public var serverTime: Int64
        public var protocolVersion: Int
        public var limits: Limits
        /// The user the `hello` token names (absent for anonymous clients).
        public var user: String?
        /// A JWT's `exp`, in seconds since 1970: the connection is closed then (with the
        /// leeway) unless an `auth` brings a newer token. Absent for tokens that do not expire.
        public var expires: Int64?

        public init(
            sessionId: String, serverTime: Int64, protocolVersion: Int = Wire.protocolVersion, limits: Limits,
            user: String? = nil, expires: Int64? = nil
        ) {
            self.sessionId = sessionId
            self.serverTime = serverTime
            self.protocolVersion = protocolVersion
            self.limits = limits
            self.user = user
            self.expires = expires
        }

    }

    /// `{"type":"snapshot","target":"t1","changes":[…],"resumeToken":"…","initial":true,"hasMore":false}`
    public struct Snapshot: Sendable, Hashable {
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
    public struct Reset: Sendable, Hashable {
        public var target: String
        public var reason: String

        public init(target: String, reason: String) {
            self.target = target
            self.reason = reason
        }
    }

    /// `{"type":"ack","request":"r1","results":[{"id":"…","version":1,"updateTime":…}]}`
    public struct Ack: Sendable, Hashable {
        public var request: String
        /// One per op, in order.
        public var results: [WriteResult]

        public init(request: String, results: [WriteResult]) {
            self.request = request
            self.results = results
        }
    }

    /// `{"type":"conflict","request":"r1","op":0,"server":{…document…}}`
    public struct Conflict: Sendable, Hashable {
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
    public struct DocumentReply: Sendable, Hashable {
        public var request: String
        public var document: Document

        public init(request: String, document: Document) {
            self.request = request
            self.document = document
        }
    }
}

/// The outcome of one write op.
public struct WriteResult: Sendable, Hashable {
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
