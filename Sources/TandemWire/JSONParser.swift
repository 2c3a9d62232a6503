/// A JSON parser into ``JSONValue``: RFC 8259, with a depth limit, strict UTF-8 and numbers
/// that keep 64-bit integers exact.
///
/// It reads the bytes once, without building intermediate strings for keys and values that
/// need no unescaping. Errors name the byte offset and what was expected.
struct JSONParser {
    private let bytes: UnsafeBufferPointer<UInt8>
    private var index = 0
    private var depth = 0
    private let maxDepth: Int
    /// The members of the objects being read, innermost last (see ``object()``).
    private var members: [(key: String, value: JSONValue, offset: Int)] = []

    /// Parses one JSON value that makes up the whole of `bytes` (surrounding whitespace aside).
    static func parse(_ bytes: UnsafeBufferPointer<UInt8>, maxDepth: Int) throws(JSONError) -> JSONValue {
        var parser = JSONParser(bytes: bytes, maxDepth: maxDepth)
        parser.skipWhitespace()
        let value = try parser.value()
        parser.skipWhitespace()
        guard parser.index == bytes.count else { throw parser.error("unexpected content after the JSON value") }
        return value
    }

    /// Parses a message object, with the object itself and the objects in its array under
    /// `listKey` read as member lists rather than dictionaries: a snapshot's changes are read
    /// once each, field by field, and a dictionary for each cost more than reading it. The
    /// array's place among the members holds an empty array; what it held is `list` (nil when
    /// the member is missing or not an array, which the members then show as it is).
    ///
    /// The same input is accepted or refused as by ``parse(_:maxDepth:)``, with the same error.
    ///
    /// - Returns: nil when `bytes` do not start with an object (``parse(_:maxDepth:)`` then says
    ///   what they are).
    ///
    /// - Parameter canonicalKey: A member of the listed objects whose object value is read
    ///   straight into canonical JSON (``CanonicalJSON``) when it can be, and then stands among
    ///   the members as an empty object, its text beside them (a write's `fields`, which the
    ///   server stores as that text).
    static func parseMessage(
        _ bytes: UnsafeBufferPointer<UInt8>, maxDepth: Int, listKey: String, canonicalKey: String? = nil
    ) throws(JSONError) -> (members: JSONMembers, list: [JSONElement]?)? {
        var parser = JSONParser(bytes: bytes, maxDepth: maxDepth)
        parser.skipWhitespace()
        guard parser.index < bytes.count, bytes[parser.index] == UInt8(ascii: "{") else { return nil }
        var list: [JSONElement]?
        let members = try parser.memberList { parser, key throws(JSONError) in
            guard key == listKey, parser.index < parser.bytes.count, parser.bytes[parser.index] == UInt8(ascii: "[")
            else { return nil }
            list = try parser.listedElements(canonicalKey: canonicalKey)
            return .array([])
        }
        parser.skipWhitespace()
        guard parser.index == bytes.count else { throw parser.error("unexpected content after the JSON value") }
        return (members, list)
    }

    /// An object as its members in order, refused on a key that appears twice as
    /// ``object()`` refuses it (see ``pushMembers(_:)`` for `special`).
    private mutating func memberList(
        _ special: (inout JSONParser, String) throws(JSONError) -> JSONValue? = { _, _ in nil }
    ) throws(JSONError) -> JSONMembers {
        let first = try pushMembers(special)
        defer { members.removeSubrange(first...) }
        // The first key that came before, as ``object()`` finds it: by looking back while the
        // object is small, through a set past that (a hostile frame of many keys stays linear).
        var keys: Set<String> = []
        for position in first..<members.count {
            let key = members[position].key
            let repeated =
                position - first <= 16
                ? members[first..<position].contains { $0.key == key } : !keys.insert(key).inserted
            if repeated { throw duplicate(key, at: members[position].offset) }
            if position - first == 16 { keys = Set(members[first...position].map(\.key)) }
        }
        return members[first...].map { ($0.key, $0.value) }
    }

    /// An array whose objects are read as member lists, its other values as values.
    private mutating func listedElements(canonicalKey: String?) throws(JSONError) -> [JSONElement] {
        try elements { parser throws(JSONError) in
            guard parser.index < parser.bytes.count && parser.bytes[parser.index] == UInt8(ascii: "{") else {
                return .value(try parser.value())
            }
            guard let canonicalKey else { return .members(try parser.memberList(), canonical: nil) }
            var canonical: [UInt8]?
            let members = try parser.memberList { parser, key in
                guard key == canonicalKey, parser.index < parser.bytes.count,
                    parser.bytes[parser.index] == UInt8(ascii: "{"),
                    let read = CanonicalJSON.read(
                        parser.bytes, from: parser.index, depthLeft: parser.maxDepth - parser.depth)
                else { return nil }
                parser.index = read.end
                canonical = read.json
                return .object([:])
            }
            return .members(members, canonical: canonical)
        }
    }

    private init(bytes: UnsafeBufferPointer<UInt8>, maxDepth: Int) {
        self.bytes = bytes
        self.maxDepth = maxDepth
    }

    private func error(_ message: String) -> JSONError {
        JSONError(message: message, offset: index)
    }

    private mutating func skipWhitespace() {
        index = Self.whitespaceEnd(bytes, from: index)
    }

    /// The index of the first byte at or after `start` that is not JSON whitespace.
    static func whitespaceEnd(_ bytes: UnsafeBufferPointer<UInt8>, from start: Int) -> Int {
        var index = start
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x0A, 0x0D, 0x09: index += 1
            default: return index
            }
        }
        return index
    }

    private mutating func value() throws(JSONError) -> JSONValue {
        guard index < bytes.count else { throw error("unexpected end of input") }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try object()
        case UInt8(ascii: "["): return try array()
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "t"):
            try literal("true")
            return .bool(true)
        case UInt8(ascii: "f"):
            try literal("false")
            return .bool(false)
        case UInt8(ascii: "n"):
            try literal("null")
            return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return try number()
        default:
            throw error("unexpected character '\(Self.describe(bytes[index]))'")
        }
    }

    private mutating func literal(_ word: StaticString) throws(JSONError) {
        let count = word.utf8CodeUnitCount
        guard index + count <= bytes.count else { throw error("unexpected end of input") }
        for offset in 0..<count where bytes[index + offset] != word.utf8Start[offset] {
            throw error("invalid literal, expected \(word)")
        }
        index += count
    }

    private mutating func enter() throws(JSONError) {
        depth += 1
        if depth > maxDepth { throw error("JSON nested deeper than \(maxDepth) levels") }
    }

    private mutating func object() throws(JSONError) -> JSONValue {
        // The members go on the shared stack first, so that the dictionary is made once at its
        // final size instead of growing member by member.
        let first = try pushMembers()
        var object = JSONObject(minimumCapacity: members.count - first)
        for position in first..<members.count {
            let (key, value, keyStart) = members[position]
            if object.updateValue(value, forKey: key) != nil {
                // RFC 8259 leaves duplicate names undefined; two readers of one message must
                // never disagree on what it says.
                throw duplicate(key, at: keyStart)
            }
        }
        members.removeSubrange(first...)
        return .object(object)
    }

    /// Reads an object onto the shared stack of members; returns where its members start.
    /// `special` may read a member's value itself (returning what the member holds), or
    /// return nil to leave it to ``value()``.
    private mutating func pushMembers(
        _ special: (inout JSONParser, String) throws(JSONError) -> JSONValue? = { _, _ in nil }
    ) throws(JSONError) -> Int {
        try enter()
        index += 1
        let first = members.count
        skipWhitespace()
        if index < bytes.count && bytes[index] == UInt8(ascii: "}") {
            index += 1
            depth -= 1
            return first
        }
        while true {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw error("expected a string key") }
            let keyStart = index
            let key = try string()
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else {
                throw error("expected ':' after a key")
            }
            index += 1
            skipWhitespace()
            if let special = try special(&self, key) {
                members.append((key, special, keyStart))
            } else {
                members.append((key, try value(), keyStart))
            }
            skipWhitespace()
            guard index < bytes.count else { throw error("unexpected end of input in an object") }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
                continue
            }
            guard bytes[index] == UInt8(ascii: "}") else { throw error("expected ',' or '}' in an object") }
            index += 1
            depth -= 1
            return first
        }
    }

    private mutating func duplicate(_ key: String, at keyStart: Int) -> JSONError {
        index = keyStart
        return error("the key '\(key.prefix(40))' appears twice in one object")
    }

    private mutating func array() throws(JSONError) -> JSONValue {
        .array(try elements { parser throws(JSONError) in try parser.value() })
    }

    /// An array, each element read by `element`.
    private mutating func elements<Element>(_ element: (inout JSONParser) throws(JSONError) -> Element)
        throws(JSONError) -> [Element]
    {
        try enter()
        index += 1
        var array: [Element] = []
        skipWhitespace()
        if index < bytes.count && bytes[index] == UInt8(ascii: "]") {
            index += 1
            depth -= 1
            return array
        }
        while true {
            skipWhitespace()
            array.append(try element(&self))
            skipWhitespace()
            guard index < bytes.count else { throw error("unexpected end of input in an array") }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
                continue
            }
            guard bytes[index] == UInt8(ascii: "]") else { throw error("expected ',' or ']' in an array") }
            index += 1
            depth -= 1
            return array
        }
    }

    /// The index of the first byte at or after `start` that ends a string's plain run: a
    /// quote, a backslash or a control character (`bytes.count` if none does), with the bits
    /// of the bytes before it or'ed into `highBits` (its top bit tells whether any was past
    /// ASCII).
    ///
    /// Eight bytes at a time: a document's long strings (notes, descriptions) made the
    /// byte-at-a-time loop the largest single cost of decoding them.
    static func plainRunEnd(_ bytes: UnsafeBufferPointer<UInt8>, from start: Int, highBits: inout UInt8) -> Int {
        var index = start
        if let base = UnsafeRawPointer(bytes.baseAddress) {
            let ones: UInt64 = 0x0101_0101_0101_0101
            let tops: UInt64 = 0x8080_8080_8080_8080
            var high: UInt64 = 0
            while index + 8 <= bytes.count {
                let word = base.loadUnaligned(fromByteOffset: index, as: UInt64.self)
                let quote = word ^ (ones &* 0x22)
                let backslash = word ^ (ones &* 0x5C)
                // A byte is zero in `quote` or `backslash`, or below 0x20 in `word`: its top
                // bit is set in the subtraction and clear in the value (the classic exact test of
                // whether any byte matches; which one is left to the byte loop below).
                let found =
                    ((quote &- ones) & ~quote) | ((backslash &- ones) & ~backslash) | ((word &- ones &* 0x20) & ~word)
                if found & tops != 0 { break }
                high |= word
                index += 8
            }
            if high & tops != 0 { highBits |= 0x80 }
        }
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") || byte < 0x20 { return index }
            highBits |= byte
            index += 1
        }
        return index
    }

    private mutating func string() throws(JSONError) -> String {
        index += 1  // the opening quote
        let start = index
        // Fast path: no escapes.
        var highBits: UInt8 = 0
        index = Self.plainRunEnd(bytes, from: index, highBits: &highBits)
        while index < bytes.count {
            let byte = bytes[index]
            if byte == UInt8(ascii: "\"") {
                let raw = UnsafeBufferPointer(rebasing: bytes[start..<index])
                // ASCII is valid UTF-8 as it stands: no need for the validating decoder.
                let text = highBits < 0x80 ? String(decoding: raw, as: UTF8.self) : try Self.text(raw, at: start)
                index += 1
                return text
            }
            highBits |= byte
            if byte == UInt8(ascii: "\\") { break }
            if byte < 0x20 { throw error("control character in a string; escape it") }
            index += 1
        }
        var unescaped = Array(bytes[start..<index])
        while index < bytes.count {
            let byte = bytes[index]
            switch byte {
            case UInt8(ascii: "\""):
                index += 1
                return try unescaped.withUnsafeBufferPointer { buffer throws(JSONError) in
                    try Self.text(buffer, at: start)
                }
            case UInt8(ascii: "\\"):
                index += 1
                guard index < bytes.count else { throw error("unexpected end of input in an escape") }
                let escape = bytes[index]
                index += 1
                switch escape {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): unescaped.append(escape)
                case UInt8(ascii: "b"): unescaped.append(0x08)
                case UInt8(ascii: "f"): unescaped.append(0x0C)
                case UInt8(ascii: "n"): unescaped.append(0x0A)
                case UInt8(ascii: "r"): unescaped.append(0x0D)
                case UInt8(ascii: "t"): unescaped.append(0x09)
                case UInt8(ascii: "u"): try unicodeEscape(into: &unescaped)
                default: throw error("invalid escape '\\\(Self.describe(escape))'")
                }
            default:
                if byte < 0x20 { throw error("control character in a string; escape it") }
                unescaped.append(byte)
                index += 1
            }
        }
        throw error("unterminated string")
    }

    private mutating func unicodeEscape(into output: inout [UInt8]) throws(JSONError) {
        var scalar = try hex4()
        if (0xD800...0xDBFF).contains(scalar) {
            guard index + 1 < bytes.count, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u")
            else { throw error("a high surrogate must be followed by a low one") }
            index += 2
            let low = try hex4()
            guard (0xDC00...0xDFFF).contains(low) else { throw error("invalid low surrogate") }
            scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
        } else if (0xDC00...0xDFFF).contains(scalar) {
            throw error("a low surrogate without a high one")
        }
        guard let unicode = Unicode.Scalar(scalar) else { throw error("invalid unicode escape") }
        output.append(contentsOf: String(Character(unicode)).utf8)
    }

    private mutating func hex4() throws(JSONError) -> UInt32 {
        guard index + 4 <= bytes.count else { throw error("unexpected end of input in a \\u escape") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = bytes[index]
            let digit: UInt32
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(byte - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(byte - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(byte - UInt8(ascii: "A") + 10)
            default: throw error("invalid hexadecimal digit in a \\u escape")
            }
            value = value << 4 | digit
            index += 1
        }
        return value
    }

    private mutating func number() throws(JSONError) -> JSONValue {
        let start = index
        var negative = false
        if bytes[index] == UInt8(ascii: "-") {
            negative = true
            index += 1
        }
        guard index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) else {
            throw error("expected a digit")
        }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
            if index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) {
                throw error("a number may not start with 0")
            }
        }
        // Accumulate the integer part as a negative number, which reaches Int64.min.
        var integer: Int64 = 0
        var overflow = false
        while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) {
            let digit = Int64(bytes[index] - UInt8(ascii: "0"))
            let (times, o1) = integer.multipliedReportingOverflow(by: 10)
            let (next, o2) = times.subtractingReportingOverflow(digit)
            overflow = overflow || o1 || o2
            integer = next
            index += 1
        }
        var isInteger = true
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            isInteger = false
            index += 1
            guard index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) else {
                throw error("expected a digit after the decimal point")
            }
            while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            isInteger = false
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
                index += 1
            }
            guard index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) else {
                throw error("expected a digit in the exponent")
            }
            while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) { index += 1 }
        }
        if isInteger && !overflow {
            if negative { return .int(integer) }
            if integer != .min { return .int(-integer) }
        }
        let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
        guard let double = Double(text), double.isFinite else {
            throw JSONError(message: "number \(text.prefix(40)) is out of range", offset: start)
        }
        return .double(double)
    }

    private static func text(_ bytes: UnsafeBufferPointer<UInt8>, at offset: Int) throws(JSONError) -> String {
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw JSONError(message: "a string is not valid UTF-8", offset: offset)
        }
        return text
    }

    private static func describe(_ byte: UInt8) -> String {
        byte >= 0x20 && byte < 0x7F ? String(Character(Unicode.Scalar(byte))) : "0x" + String(byte, radix: 16)
    }
}

/// An object's members in the order they came (see ``JSONParser/parseMessage(_:maxDepth:listKey:canonicalKey:)``).
typealias JSONMembers = [(key: String, value: JSONValue)]

/// An element of an array read by ``JSONParser/parseMessage(_:maxDepth:listKey:canonicalKey:)``.
enum JSONElement {
    /// An object, as its members; with the canonical text of the member named by
    /// `parseMessage`'s `canonicalKey` when it was read that way.
    case members(JSONMembers, canonical: [UInt8]?)
    case value(JSONValue)
}

/// A JSON syntax error.
struct JSONError: Error {
    var message: String
    var offset: Int
}
