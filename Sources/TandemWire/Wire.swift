/// Encoding and decoding of protocol messages: the one place where JSON is read and written.
///
/// Decoding never crashes and never accepts half a message: it returns a whole, validated
/// message or throws a ``WireError`` whose message names the field at fault.
///
/// For example:
///
/// ```swift
/// do {
///     let message = try Wire.decode(ClientMessage.self, from: frame.bytes)
/// } catch {
///     send(.error(error))  // e.g. bad-message: "ops[0].fields: missing"
/// }
/// ```
public enum Wire {
    /// The protocol version of this package.
    public static let protocolVersion = 1

    /// The deepest nesting of arrays and objects accepted in a message, so that a hostile
    /// `[[[[…]]]]` cannot exhaust the parser's stack.
    public static let maxNestingDepth = 64

    /// The deepest nesting accepted in a message from the server: one level more, since an
    /// `ack`'s merged document carries the write's fields one level below where the write
    /// carried them.
    public static let maxServerNestingDepth = maxNestingDepth + 1

    /// The deepest nesting of an exported document's line: its `fields` are at level 2 there,
    /// and at level 4 in a write, which must be able to carry them.
    public static let maxExportedNestingDepth = maxNestingDepth - 2

    /// The longest label a client may choose (`request`, `target`), in bytes.
    public static let maxLabelBytes = 128

    /// The UTF-8 bytes of a value's JSON, after `prefix` zero bytes: room that a transport fills
    /// in front of the payload (a WebSocket frame's header), so that it sends them without
    /// another copy.
    public static func encode(_ value: some JSONWritable, after prefix: Int = 0) -> [UInt8] {
        var writer = JSONWriter(prefix: prefix)
        value.write(to: &writer)
        return writer.bytes
    }

    /// A value's JSON as a string.
    public static func encodeString(_ value: some JSONWritable) -> String {
        String(decoding: encode(value), as: UTF8.self)
    }

    /// The JSON of a value with sorted keys: the same value always gives the same bytes.
    public static func encodeCanonical(_ value: some JSONWritable) -> [UInt8] {
        var writer = JSONWriter(sortsKeys: true)
        value.write(to: &writer)
        return writer.bytes
    }

    /// Field times as a JSON object with sorted keys.
    public static func encodeTimes(_ times: [String: Int64]) -> [UInt8] {
        var writer = JSONWriter(sortsKeys: true)
        writer.beginObject()
        for field in times.keys.sorted() {
            writer.key(field)
            writer.int(times[field]!)
        }
        writer.endObject()
        return writer.bytes
    }

    /// Parses JSON.
    ///
    /// - Throws: ``WireError`` `.badMessage`: "not valid JSON: …" with what was wrong and where.
    public static func parse(_ bytes: some Collection<UInt8>, maxDepth: Int = maxNestingDepth) throws(WireError)
        -> JSONValue
    {
        let result: Result<JSONValue, JSONError>? = bytes.withContiguousStorageIfAvailable { buffer in
            Result { () throws(JSONError) in try JSONParser.parse(buffer, maxDepth: maxDepth) }
        }
        let parsed =
            result
            ?? Array(bytes).withUnsafeBufferPointer { buffer in
                Result { () throws(JSONError) in try JSONParser.parse(buffer, maxDepth: maxDepth) }
            }
        switch parsed {
        case .success(let value): return value
        case .failure(let error): throw Self.invalid(error)
        }
    }

    private static func invalid(_ error: JSONError) -> WireError {
        if error.message.hasPrefix("JSON nested deeper") { return WireError(.badMessage, error.message) }
        return WireError(.badMessage, "not valid JSON: \(error.message) at byte \(error.offset)")
    }

    /// Decodes and validates a message.
    ///
    /// - Throws: ``WireError``: `.badMessage` for anything malformed, `.invalidPath` for a
    ///   collection path or document id that breaks the naming rules. The error carries the
    ///   message's `request` or `target` when they could be read.
    public static func decode<Message: JSONReadable>(
        _ type: Message.Type, from bytes: some Collection<UInt8>
    ) throws(WireError) -> Message {
        let value = try parse(bytes, maxDepth: Message.maxNestingDepth)
        do {
            return try Message(json: value, path: "")
        } catch {
            guard let reader = try? ObjectReader(value, path: "") else { throw error }
            throw naming(error, after: reader)
        }
    }

    /// `error`, with the `request` and `target` of the message it is about when it names none.
    private static func naming(_ error: WireError, after reader: ObjectReader) -> WireError {
        var error = error
        if error.request == nil { error.request = (try? reader.optionalString("request")) ?? nil }
        if error.target == nil { error.target = (try? reader.optionalString("target")) ?? nil }
        return error
    }

    /// Decodes and validates a message from the server: as the generic `decode(_:from:)`, with
    /// the same result and the same errors, but the message object and a snapshot's changes
    /// are read as lists of members instead of dictionaries (a snapshot's decoding is most of
    /// what a device spends on receiving it), and it may nest to ``maxServerNestingDepth``.
    public static func decode(_ type: ServerMessage.Type, from bytes: some Collection<UInt8>) throws(WireError)
        -> ServerMessage
    {
        try decodeListed(bytes, listKey: "changes") { reader, list throws(WireError) in
            try ServerMessage(reader, changes: list)
        }
    }

    /// Decodes and validates a message from a client: as the generic `decode(_:from:)`, with
    /// the same result and the same errors, but the message object and a write's ops are read
    /// as lists of members, and each op's `fields` straight into canonical text when they can
    /// be (``WriteOp/canonicalFieldsJSON``): the server stores that text, and builds the fields'
    /// tree only when access rules or a merge read it.
    public static func decode(_ type: ClientMessage.Type, from bytes: some Collection<UInt8>) throws(WireError)
        -> ClientMessage
    {
        try decodeListed(bytes, listKey: "ops", canonicalKey: "fields") { reader, list throws(WireError) in
            try ClientMessage(reader, ops: list)
        }
    }

    /// A message read by ``JSONParser/parseMessage(_:maxDepth:listKey:canonicalKey:)`` and made
    /// by `make` (with nil for a message that is not an object, which `make`'s type refuses).
    private static func decodeListed<Message: JSONReadable>(
        _ bytes: some Collection<UInt8>, listKey: String, canonicalKey: String? = nil,
        _ make: (ObjectReader, [JSONElement]?) throws(WireError) -> Message
    ) throws(WireError) -> Message {
        typealias Parsed = (members: JSONMembers, list: [JSONElement]?)?
        let read: (UnsafeBufferPointer<UInt8>) -> Result<Parsed, JSONError> = { buffer in
            Result { () throws(JSONError) in
                try JSONParser.parseMessage(
                    buffer, maxDepth: Message.maxNestingDepth, listKey: listKey, canonicalKey: canonicalKey)
            }
        }
        let parsed = bytes.withContiguousStorageIfAvailable(read) ?? Array(bytes).withUnsafeBufferPointer(read)
        let message: (members: JSONMembers, list: [JSONElement]?)
        switch parsed {
        case .failure(let error): throw invalid(error)
        case .success(nil):  // not an object: refused
            return try Message(json: parse(bytes, maxDepth: Message.maxNestingDepth), path: "")
        case .success(let read?): message = read
        }
        let reader = ObjectReader(members: message.members, path: "")
        do {
            return try make(reader, message.list)
        } catch {
            throw naming(error, after: reader)
        }
    }

    /// Decodes a JSON object of document fields.
    public static func decodeFields(_ bytes: some Collection<UInt8>) throws(WireError) -> JSONObject {
        guard case .object(let object) = try parse(bytes) else {
            throw WireError(.badMessage, "the fields: expected an object")
        }
        return object
    }

    /// Decodes a JSON object of field times.
    public static func decodeTimes(_ bytes: some Collection<UInt8>) throws(WireError) -> [String: Int64] {
        try ObjectReader(.object(["times": try parse(bytes)]), path: "").optionalTimes("times") ?? [:]
    }

    /// Decodes a JSON array of strings.
    public static func decodeStrings(_ bytes: some Collection<UInt8>) throws(WireError) -> [String] {
        guard case .array(let values) = try parse(bytes) else { throw WireError(.badMessage, "expected an array") }
        return try values.map { (value: JSONValue) throws(WireError) -> String in
            guard case .string(let string) = value else { throw WireError(.badMessage, "expected strings") }
            return string
        }
    }

    /// The JSON value of a protocol value (for `Codable`).
    static func value(of writable: some JSONWritable) -> JSONValue {
        (try? parse(encode(writable))) ?? .null
    }
}
