/// A document as the server holds it and sends it.
///
/// JSON form:
///
/// ```json
/// {"id":"a1B2c3D4e5F6g7H8i9J0","version":3,"fields":{"title":"Rent"},
///  "createTime":1763683200000,"updateTime":1763683260000,"deleted":false}
/// ```
///
/// Times are milliseconds since 1970 on the server's clock. `version` is 1 on create and grows
/// by one with every write, delete included. A deleted document (a tombstone) keeps its id
/// and version, with empty fields.
///
/// `createKey` is the idempotency key of the `create` op that made the document. It lets the
/// client that created it recognize the document as its own when the acknowledgement was
/// lost and the document reaches it through a listener first.
public struct Document: Sendable, Hashable {
    public var id: DocumentID
    public var version: Int64
    public var fields: JSONObject
    public var createTime: Int64
    public var updateTime: Int64
    public var deleted: Bool
    public var createKey: String?
    /// For documents written with field-level merging: when each field was last written, as
    /// hybrid logical clock values from the writing devices.
    public var fieldTimes: [String: Int64]?

    public init(
        id: DocumentID, version: Int64, fields: JSONObject, createTime: Int64, updateTime: Int64, deleted: Bool = false,
        createKey: String? = nil, fieldTimes: [String: Int64]? = nil
    ) {
        self.id = id
        self.version = version
        self.fields = fields
        self.createTime = createTime
        self.updateTime = updateTime
        self.deleted = deleted
        self.createKey = createKey
        self.fieldTimes = fieldTimes
    }

}

/// One entry of a snapshot: a document that appeared, changed or went away since the
/// listener's resume token.
///
/// JSON form: the document's fields with a `kind` beside them.
///
/// ```json
/// {"kind":"modified","id":"a1B2c3D4e5F6g7H8i9J0","version":4,"fields":{"title":"Rent"},
///  "createTime":1763683200000,"updateTime":1763683320000,"deleted":false}
/// ```
public struct Change: Sendable, Hashable {
    public enum Kind: String, Sendable, Hashable, Codable {
        /// The document was created after the resume token (or this is the initial snapshot).
        case added
        /// The document existed at the resume token and was written since.
        case modified
        /// The document existed at the resume token and was deleted since.
        case deleted
        /// For a query listener: the document left the view (it no longer matches, was pushed
        /// out by the limit, or was deleted, with `deleted` true).
        case removed
    }

    public var kind: Kind
    public var document: Document
    /// For a query listener: the document's place in the view before this change (-1 when
    /// added) and after it (-1 when removed), each counted in the view as it stands after
    /// the changes listed before this one.
    public var oldIndex: Int?
    public var newIndex: Int?

    public init(_ kind: Kind, _ document: Document) {
        self.kind = kind
        self.document = document
    }

}
