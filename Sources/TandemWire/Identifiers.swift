/// The naming rules shared by path segments, document ids, client ids and idempotency keys.
///
/// A name is 1 to 256 bytes of ASCII letters, digits and `- _ . ~ : @ +`, and is neither `.`
/// nor `..`. The set is small on purpose: names travel in paths, in logs and in SQL parameters,
/// and nothing in it needs escaping anywhere.
enum Name {
    static let maxBytes = 256

    /// Whether `name` keeps every rule, in one pass over its bytes (names arrive with every
    /// op and every change); ``problem(with:)`` says which rule a name breaks.
    static func isValid(_ name: String) -> Bool {
        var length = 0
        var dots = 0
        for byte in name.utf8 {
            guard isAllowed(byte) else { return false }
            length += 1
            if byte == UInt8(ascii: ".") { dots += 1 }
        }
        return length > 0 && length <= maxBytes && !(dots == length && length <= 2)
    }

    static func problem(with name: Substring) -> String? {
        if name.isEmpty { return "is empty" }
        if name.utf8.count > maxBytes { return "is longer than \(maxBytes) bytes" }
        if name == "." || name == ".." { return "may not be '.' or '..'" }
        for byte in name.utf8 where !isAllowed(byte) {
            let shown =
                byte < 0x20 || byte >= 0x7F
                ? "byte 0x\(String(byte, radix: 16))" : "'\(Character(Unicode.Scalar(byte)))'"
            return "contains \(shown); allowed are letters, digits and - _ . ~ : @ +"
        }
        return nil
    }

    static func isAllowed(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"):
            true
        case UInt8(ascii: "-"), UInt8(ascii: "_"), UInt8(ascii: "."), UInt8(ascii: "~"), UInt8(ascii: ":"),
            UInt8(ascii: "@"), UInt8(ascii: "+"):
            true
        default:
            false
        }
    }
}

/// A collection path: slash-separated names, an odd number of them
/// (`accounts`, `accounts/7Hq2…/transactions`).
///
/// Even segments name collections and odd ones documents, as in Firestore: the path
/// `accounts/A1/transactions` is the `transactions` collection under the document `A1` of
/// `accounts`. At most 15 segments.
///
/// For example:
///
/// ```swift
/// let path = try CollectionPath("accounts/\(account.serverId)/transactions")
/// path.parent  // "accounts/…" document: (collection: "accounts", id: "…")
/// ```
public struct CollectionPath: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let rawValue: String

    public static let maxSegments = 15

    /// - Throws: ``WireError`` with code ``ErrorCode/invalidPath`` saying which rule broke.
    public init(_ rawValue: String) throws(WireError) {
        if let problem = Self.problem(with: rawValue) {
            throw WireError(.invalidPath, "collection path '\(rawValue.prefix(300))' \(problem)")
        }
        self.rawValue = rawValue
    }

    static func problem(with path: String) -> String? {
        if isValid(path) { return nil }
        if path.isEmpty { return "is empty" }
        let segments = path.split(separator: "/", omittingEmptySubsequences: false)
        if segments.count > maxSegments { return "has more than \(maxSegments) segments" }
        if segments.count % 2 == 0 {
            return "has an even number of segments; a collection path has an odd number (a/b/c)"
        }
        for (index, segment) in segments.enumerated() {
            if let problem = Name.problem(with: segment) { return "has a segment \(index + 1) that \(problem)" }
        }
        return nil
    }

    /// Whether the path keeps every rule, in one pass over its bytes that allocates nothing
    /// (paths arrive with every op); ``problem(with:)`` says which rule a path breaks.
    static func isValid(_ path: String) -> Bool {
        var segments = 1
        var length = 0
        var dots = 0
        func segmentIsValid() -> Bool { length > 0 && length <= Name.maxBytes && !(dots == length && length <= 2) }
        for byte in path.utf8 {
            if byte == UInt8(ascii: "/") {
                guard segmentIsValid() else { return false }
                segments += 1
                length = 0
                dots = 0
                continue
            }
            guard Name.isAllowed(byte) else { return false }
            length += 1
            if byte == UInt8(ascii: ".") { dots += 1 }
        }
        return segmentIsValid() && segments <= maxSegments && segments % 2 == 1
    }

    /// The path's segments.
    public var segments: [Substring] { rawValue.split(separator: "/") }

    /// The document this collection belongs to, for nested collections.
    public var parent: (collection: CollectionPath, id: DocumentID)? {
        let segments = self.segments
        guard segments.count >= 3 else { return nil }
        let collection = segments.dropLast(2).joined(separator: "/")
        return (CollectionPath(unchecked: collection), DocumentID(unchecked: String(segments[segments.count - 2])))
    }

    init(unchecked rawValue: String) { self.rawValue = rawValue }

    public var description: String { rawValue }
    public static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// A document id: one name (see the rules on ``CollectionPath``).
///
/// The server assigns 20 random letters and digits unless the client proposes an id.
public struct DocumentID: Hashable, Sendable, Comparable, CustomStringConvertible {
    public let rawValue: String

    /// - Throws: ``WireError`` with code ``ErrorCode/invalidPath``.
    public init(_ rawValue: String) throws(WireError) {
        if !Name.isValid(rawValue), let problem = Name.problem(with: Substring(rawValue)) {
            throw WireError(.invalidPath, "document id '\(rawValue.prefix(300))' \(problem)")
        }
        self.rawValue = rawValue
    }

    init(unchecked rawValue: String) { self.rawValue = rawValue }

    /// A new random id: 20 characters from `A-Za-z0-9` (about 119 bits), from the system's
    /// cryptographic generator.
    public static func random() -> DocumentID {
        var generator = RandomPool()
        return random(using: &generator)
    }

    public static func random(using generator: inout some RandomNumberGenerator) -> DocumentID {
        DocumentID(unchecked: randomName(using: &generator))
    }

    /// A new id that sorts after the ids of earlier milliseconds: 8 characters of time, then
    /// 12 random ones (about 71 bits), 20 in all, from `0-9A-Za-z`.
    ///
    /// The server assigns these. New documents then land at the end of every index keyed by
    /// id (the server's, and each client's `serverId` index) instead of at random places,
    /// which spares SQLite from rewriting a different index page for every insert. The id
    /// does tell roughly when the document was created.
    public static func timeOrdered(milliseconds: Int64) -> DocumentID {
        var generator = RandomPool()
        // Written in place: built from arrays and an intermediate string, an id cost more than
        // the server's index insert of the document (1.5 % of the throughput run).
        let id = String(unsafeUninitializedCapacity: 20) { bytes in
            var time = UInt64(max(0, milliseconds))
            for index in (0..<8).reversed() {
                bytes[index] = sortedAlphabet[Int(time % 62)]
                time /= 62
            }
            fillRandom(bytes[8..<20], using: &generator)
            return 20
        }
        return DocumentID(unchecked: id)
    }

    /// The alphabet in ASCII order, so that ids sort as their times do.
    private static let sortedAlphabet = Array("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz".utf8)

    /// 20 characters from `A-Za-z0-9`: a valid name of about 119 random bits.
    static func randomName(using generator: inout some RandomNumberGenerator) -> String {
        String(unsafeUninitializedCapacity: 20) { bytes in
            fillRandom(bytes[...], using: &generator)
            return 20
        }
    }

    /// Fills `bytes` with random characters of `A-Za-z0-9`. Eight random bytes give eight
    /// characters: a byte below 248 (4 × 62) maps to the alphabet without bias; the rare byte
    /// above is drawn again.
    private static func fillRandom(
        _ bytes: Slice<UnsafeMutableBufferPointer<UInt8>>, using generator: inout some RandomNumberGenerator
    ) {
        var index = bytes.startIndex
        while index < bytes.endIndex {
            var word = generator.next()
            for _ in 0..<8 where index < bytes.endIndex {
                let byte = UInt8(truncatingIfNeeded: word)
                word >>= 8
                if byte < 248 {
                    bytes.base[index] = alphabet[Int(byte % 62)]
                    index += 1
                }
            }
        }
    }

    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789".utf8)

    public var description: String { rawValue }
    public static func < (lhs: Self, rhs: Self) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// A name given by a client: a `clientId` or an `idempotencyKey` (same rules as a path segment).
public struct ClientName: Hashable, Sendable, CustomStringConvertible {
    public let rawValue: String

    /// A new random name of 20 letters and digits (about 119 bits).
    public static func random() -> ClientName {
        var generator = RandomPool()
        return ClientName(unchecked: DocumentID.randomName(using: &generator))
    }

    /// A new idempotency key: 20 letters and digits that sort by the time they were made (as
    /// ``DocumentID/timeOrdered(milliseconds:)``), so that the keys a device sends land
    /// together in the server's index of keys instead of all over it.
    public static func key(milliseconds: Int64) -> ClientName {
        ClientName(unchecked: DocumentID.timeOrdered(milliseconds: milliseconds).rawValue)
    }

    init(unchecked rawValue: String) { self.rawValue = rawValue }

    /// This name, a dash and `number` (a batch's key and a row id): a name when it fits the
    /// length limit, since a dash and digits are allowed characters. Not checked again byte by
    /// byte: a push names each create of its batch so.
    package func suffixed(_ number: Int64) throws(WireError) -> ClientName {
        // Made at its final size (concatenated, the name was built three times).
        var name = rawValue
        name.reserveCapacity(rawValue.utf8.count + 21)
        name += "-"
        name += String(number)
        guard name.utf8.count <= Name.maxBytes else { return try ClientName(name) }
        return ClientName(unchecked: name)
    }

    public init(_ rawValue: String, field: String = "name") throws(WireError) {
        if !Name.isValid(rawValue), let problem = Name.problem(with: Substring(rawValue)) {
            throw WireError(.badMessage, "\(field) '\(rawValue.prefix(300))' \(problem)")
        }
        self.rawValue = rawValue
    }

    public var description: String { rawValue }
}

/// A string checked against naming rules on the way in, and written as a plain string.
protocol ValidatedString: Codable {
    var rawValue: String { get }
    /// Checks `string`; `field` names the field it came from, for the error message.
    init(validating string: String, field: String) throws(WireError)
}

extension ValidatedString {
    public init(from decoder: any Decoder) throws {
        let string = try decoder.singleValueContainer().decode(String.self)
        let field = decoder.codingPath.last?.stringValue ?? "name"
        do { try self.init(validating: string, field: field) } catch { throw error.at(decoder.codingPath) }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(rawValue)
    }
}

extension CollectionPath: ValidatedString {
    init(validating string: String, field: String) throws(WireError) { try self.init(string) }
}

extension DocumentID: ValidatedString {
    init(validating string: String, field: String) throws(WireError) { try self.init(string) }
}

extension ClientName: ValidatedString {
    init(validating string: String, field: String) throws(WireError) { try self.init(string, field: field) }
}

extension WireError {
    /// The same error, its message prefixed with the field it is about (`ops[2].collection: …`).
    func at(_ codingPath: [any CodingKey]) -> WireError {
        at(codingPath.fieldName)
    }

    /// The same error, its message prefixed with the field it is about.
    func at(_ field: String) -> WireError {
        guard !field.isEmpty else { return self }
        var copy = self
        copy.message = "\(field): \(message)"
        return copy
    }
}

extension [any CodingKey] {
    /// `ops[2].collection` for the coding path ops → 2 → collection.
    var fieldName: String {
        var name = ""
        for key in self {
            if let index = key.intValue {
                name += "[\(index)]"
            } else {
                name += name.isEmpty ? key.stringValue : ".\(key.stringValue)"
            }
        }
        return name
    }
}
