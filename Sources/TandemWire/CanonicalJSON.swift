/// Reads a JSON value straight into its canonical form (the bytes `JSONWriter(sortsKeys: true)`
/// writes for it), without building a tree of values: for the server, which stores a write's
/// fields as canonical text and needs the tree only when access rules or a merge look inside.
///
/// It takes the common case and leaves the rest to ``JSONParser``: whitespace is dropped and
/// object members are sorted by key, but a string with an escape, a key that is not ASCII
/// (Swift orders and compares those after Unicode normalization, not byte by byte), a number
/// whose text is not what the writer would print for it (`1e3`, `-0`, `1.50`), a repeated key,
/// anything malformed and anything nested too deep make it return nil, and the parser then
/// reads the value as before, with the same result or the same error.
///
/// For example:
///
/// ```swift
/// let text = Array(#"{ "b": [1, true], "a": "x" }"#.utf8)
/// let canonical = text.withUnsafeBufferPointer { CanonicalJSON.read($0, from: 0, depthLeft: 64) }
/// // canonical?.json == Array(#"{"a":"x","b":[1,true]}"#.utf8), canonical?.end == text.count
/// ```
enum CanonicalJSON {
    /// The canonical bytes of the value that starts at `start` (no whitespace before it), and
    /// where it ends in `bytes`; nil when ``JSONParser`` must read it.
    ///
    /// - Parameter depthLeft: How many more levels of arrays and objects the parser would
    ///   accept here (its limit less its depth).
    static func read(_ bytes: UnsafeBufferPointer<UInt8>, from start: Int, depthLeft: Int)
        -> (json: [UInt8], end: Int)?
    {
        var reader = Reader(bytes: bytes, index: start, depthLeft: depthLeft)
        reader.output.reserveCapacity(512)
        // A document's members, in one allocation rather than grown from one.
        reader.members.reserveCapacity(16)
        guard reader.value() else { return nil }
        return (reader.output, reader.index)
    }

    private struct Reader {
        let bytes: UnsafeBufferPointer<UInt8>
        var index: Int
        var depthLeft: Int
        var output: [UInt8] = []
        /// The members of the objects being read, innermost last, as ranges of `output`: the
        /// member's start (its key's opening quote), its key's closing quote, its end.
        var members: [(start: Int, keyEnd: Int, end: Int)] = []

        init(bytes: UnsafeBufferPointer<UInt8>, index: Int, depthLeft: Int) {
            self.bytes = bytes
            self.index = index
            self.depthLeft = depthLeft
        }

        mutating func skipWhitespace() {
            index = JSONParser.whitespaceEnd(bytes, from: index)
        }

        mutating func value() -> Bool {
            guard index < bytes.count else { return false }
            switch bytes[index] {
            case UInt8(ascii: "{"): return object()
            case UInt8(ascii: "["): return array()
            case UInt8(ascii: "\""): return string(asKey: false)
            case UInt8(ascii: "t"): return literal("true")
            case UInt8(ascii: "f"): return literal("false")
            case UInt8(ascii: "n"): return literal("null")
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return number()
            default: return false
            }
        }

        mutating func literal(_ word: StaticString) -> Bool {
            let count = word.utf8CodeUnitCount
            guard index + count <= bytes.count else { return false }
            for offset in 0..<count where bytes[index + offset] != word.utf8Start[offset] { return false }
            output.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[index..<index + count]))
            index += count
            return true
        }

        /// A string copied as it stands: one with an escape, a control character or (for a
        /// key) a byte outside ASCII is left to the parser.
        mutating func string(asKey: Bool) -> Bool {
            let start = index
            var highBits: UInt8 = 0
            index = JSONParser.plainRunEnd(bytes, from: index + 1, highBits: &highBits)
            // Stopped at an escape or a control character (or the end): the parser's to read.
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { return false }
            index += 1
            let text = UnsafeBufferPointer(rebasing: bytes[start..<index])
            if highBits >= 0x80 {
                let content = UnsafeBufferPointer(rebasing: text.dropFirst().dropLast())
                guard !asKey, String(validating: content, as: UTF8.self) != nil else { return false }
            }
            output.append(contentsOf: text)
            return true
        }

        /// A number whose text is what the writer prints for the value the parser reads: an
        /// integer without a sign on zero, or a double in Swift's shortest form.
        mutating func number() -> Bool {
            let start = index
            var negative = false
            if bytes[index] == UInt8(ascii: "-") {
                negative = true
                index += 1
            }
            let digitsStart = index
            var magnitude: UInt64 = 0
            while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) {
                let (times, o1) = magnitude.multipliedReportingOverflow(by: 10)
                let (next, o2) = times.addingReportingOverflow(UInt64(bytes[index] - UInt8(ascii: "0")))
                if o1 || o2 { return false }
                magnitude = next
                index += 1
            }
            let digits = index - digitsStart
            guard digits > 0, bytes[digitsStart] != UInt8(ascii: "0") || digits == 1 else { return false }
            let isInteger =
                index == bytes.count
                || (bytes[index] != UInt8(ascii: ".") && bytes[index] != UInt8(ascii: "e")
                    && bytes[index] != UInt8(ascii: "E"))
            if isInteger {
                // Within Int64 (its minimum included), and no "-0", which the writer prints as 0.
                guard magnitude <= (negative ? UInt64(Int64.max) + 1 : UInt64(Int64.max)), !(negative && magnitude == 0)
                else { return false }
                output.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[start..<index]))
                return true
            }
            // A fraction or an exponent: the parser's double, printed back, must be this text.
            if bytes[index] == UInt8(ascii: ".") {
                index += 1
                let fractionStart = index
                while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) {
                    index += 1
                }
                guard index > fractionStart else { return false }
            }
            if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
                return false
            }
            let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
            guard let double = Double(text), double.isFinite, double.description == text else { return false }
            output.append(contentsOf: text.utf8)
            return true
        }

        /// The elements of an array or the members of an object, each read by `element`, with a
        /// comma written between them: from the opening bracket at `index` to past `close`, which
        /// is left for the caller to write.
        mutating func container(opening: UInt8, close: UInt8, _ element: (inout Reader) -> Bool) -> Bool {
            guard depthLeft > 0 else { return false }
            depthLeft -= 1
            index += 1
            output.append(opening)
            skipWhitespace()
            if index < bytes.count, bytes[index] == close {
                index += 1
                depthLeft += 1
                return true
            }
            while true {
                guard element(&self) else { return false }
                skipWhitespace()
                guard index < bytes.count else { return false }
                if bytes[index] == UInt8(ascii: ",") {
                    output.append(UInt8(ascii: ","))
                    index += 1
                    skipWhitespace()
                    continue
                }
                guard bytes[index] == close else { return false }
                index += 1
                depthLeft += 1
                return true
            }
        }

        mutating func array() -> Bool {
            guard container(opening: UInt8(ascii: "["), close: UInt8(ascii: "]"), { $0.value() }) else { return false }
            output.append(UInt8(ascii: "]"))
            return true
        }

        mutating func object() -> Bool {
            let objectStart = output.count
            let first = members.count
            defer { members.removeSubrange(first...) }
            var sorted = true
            let read = container(opening: UInt8(ascii: "{"), close: UInt8(ascii: "}")) { reader in
                guard reader.index < reader.bytes.count, reader.bytes[reader.index] == UInt8(ascii: "\"") else {
                    return false
                }
                let memberStart = reader.output.count
                guard reader.string(asKey: true) else { return false }
                let keyEnd = reader.output.count - 1
                reader.skipWhitespace()
                guard reader.index < reader.bytes.count, reader.bytes[reader.index] == UInt8(ascii: ":") else {
                    return false
                }
                reader.index += 1
                reader.skipWhitespace()
                reader.output.append(UInt8(ascii: ":"))
                guard reader.value() else { return false }
                let member = (start: memberStart, keyEnd: keyEnd, end: reader.output.count)
                if sorted, reader.members.count > first,
                    !reader.key(of: reader.members[reader.members.count - 1]).lexicographicallyPrecedes(
                        reader.key(of: member))
                {
                    sorted = false
                }
                reader.members.append(member)
                return true
            }
            guard read else { return false }
            if !sorted { guard sortMembers(from: first, objectStart: objectStart) else { return false } }
            output.append(UInt8(ascii: "}"))
            return true
        }

        /// A member's key, without its quotes.
        func key(of member: (start: Int, keyEnd: Int, end: Int)) -> ArraySlice<UInt8> {
            output[member.start + 1..<member.keyEnd]
        }

        /// Writes the object's members again in the order of their keys; false on a key that
        /// appears twice (the parser names it).
        mutating func sortMembers(from first: Int, objectStart: Int) -> Bool {
            let order = members[first...].sorted { key(of: $0).lexicographicallyPrecedes(key(of: $1)) }
            for (earlier, later) in zip(order, order.dropFirst()) where key(of: earlier) == key(of: later) {
                return false
            }
            let written = Array(output[(objectStart + 1)...])
            let base = objectStart + 1
            output.removeSubrange(base...)
            for (position, member) in order.enumerated() {
                if position > 0 { output.append(UInt8(ascii: ",")) }
                output.append(contentsOf: written[(member.start - base)..<(member.end - base)])
            }
            return true
        }
    }
}
