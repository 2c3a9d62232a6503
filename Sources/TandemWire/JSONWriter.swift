/// Writes JSON into a byte buffer: compact, no escaped slashes, keys sorted on request.
///
/// Protocol types write themselves field by field (``JSONWritable``), so that encoding a
/// message does not build a tree of values first.
public struct JSONWriter {
    public private(set) var bytes: [UInt8]
    /// Sorts object keys: the same value always gives the same bytes (canonical form).
    public var sortsKeys: Bool
    private var needsComma: [Bool] = []

    public init(sortsKeys: Bool = false, capacity: Int = 256, prefix: Int = 0) {
        bytes = []
        bytes.reserveCapacity(prefix + capacity)
        bytes.append(contentsOf: repeatElement(0, count: prefix))
        self.sortsKeys = sortsKeys
    }

    // MARK: Structure

    public mutating func beginObject() {
        separate()
        bytes.append(UInt8(ascii: "{"))
        needsComma.append(false)
    }

    public mutating func endObject() {
        needsComma.removeLast()
        bytes.append(UInt8(ascii: "}"))
    }

    public mutating func beginArray() {
        separate()
        bytes.append(UInt8(ascii: "["))
        needsComma.append(false)
    }

    public mutating func endArray() {
        needsComma.removeLast()
        bytes.append(UInt8(ascii: "]"))
    }

    /// Writes `"key":`; the next value written is its value.
    public mutating func key(_ key: String) {
        separate()
        writeString(key)
        bytes.append(UInt8(ascii: ":"))
        if !needsComma.isEmpty { needsComma[needsComma.count - 1] = false }
    }

    /// Writes a key already written as JSON, its colon included (`"title":`): for keys
    /// written again and again, escaped once.
    package mutating func key(encoded: [UInt8]) {
        separate()
        bytes.append(contentsOf: encoded)
        if !needsComma.isEmpty { needsComma[needsComma.count - 1] = false }
    }

    /// `"key":` as ``key(_:)`` writes it.
    package static func encodedKey(_ key: String) -> [UInt8] {
        var writer = JSONWriter(capacity: key.utf8.count + 8)
        writer.writeString(key)
        writer.bytes.append(UInt8(ascii: ":"))
        return writer.bytes
    }

    private mutating func separate() {
        guard let last = needsComma.last else { return }
        if last { bytes.append(UInt8(ascii: ",")) }
        needsComma[needsComma.count - 1] = true
    }

    // MARK: Values

    public mutating func value(_ value: JSONValue) {
        switch value {
        case .null: scalar("null")
        case .bool(let bool): scalar(bool ? "true" : "false")
        case .int(let int): self.int(int)
        case .double(let double): self.double(double)
        case .string(let string): self.string(string)
        case .array(let values):
            beginArray()
            for element in values { self.value(element) }
            endArray()
        case .object(let object): self.object(object)
        }
    }

    public mutating func object(_ object: JSONObject) {
        beginObject()
        if sortsKeys {
            for key in object.keys.sorted() {
                self.key(key)
                value(object[key]!)
            }
        } else {
            for (key, element) in object {
                self.key(key)
                value(element)
            }
        }
        endObject()
    }

    public mutating func string(_ string: String) {
        separate()
        writeString(string)
    }

    public mutating func int(_ value: Int64) {
        separate()
        // The digits from the end of a buffer of 20 bytes (a sign and 19 digits at most), then
        // appended at once.
        var magnitude = value.magnitude
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 20) { buffer in
            var start = 20
            repeat {
                start -= 1
                buffer[start] = UInt8(ascii: "0") + UInt8(magnitude % 10)
                magnitude /= 10
            } while magnitude > 0
            if value < 0 {
                start -= 1
                buffer[start] = UInt8(ascii: "-")
            }
            bytes.append(contentsOf: UnsafeBufferPointer(rebasing: buffer[start..<20]))
        }
    }

    /// A double, in Swift's shortest form that reads back to the same value. Non-finite
    /// numbers, which JSON cannot carry, are written as null.
    public mutating func double(_ value: Double) {
        guard value.isFinite else {
            scalar("null")
            return
        }
        separate()
        bytes.append(contentsOf: value.description.utf8)
    }

    public mutating func bool(_ value: Bool) { scalar(value ? "true" : "false") }

    public mutating func null() { scalar("null") }

    /// Writes bytes that are already one JSON value (canonical fields stored as text).
    public mutating func raw(_ json: some Collection<UInt8>) {
        separate()
        bytes.append(contentsOf: json)
    }

    private mutating func scalar(_ text: StaticString) {
        separate()
        bytes.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    private mutating func writeString(_ string: String) {
        bytes.append(UInt8(ascii: "\""))
        var string = string
        string.withUTF8 { utf8 in
            var start = 0
            while start < utf8.count {
                // The bytes that need no escape go in one run (a document's long notes, found
                // eight bytes at a time), then the one that does.
                var highBits: UInt8 = 0
                let end = JSONParser.plainRunEnd(utf8, from: start, highBits: &highBits)
                bytes.append(contentsOf: UnsafeBufferPointer(rebasing: utf8[start..<end]))
                guard end < utf8.count else { break }
                let byte = utf8[end]
                switch byte {
                case UInt8(ascii: "\""): bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\"")])
                case UInt8(ascii: "\\"): bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\\")])
                case 0x0A: bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "n")])
                case 0x0D: bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "r")])
                case 0x09: bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "t")])
                default:
                    let hex = Array("0123456789abcdef".utf8)
                    bytes.append(contentsOf: [
                        UInt8(ascii: "\\"), UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0"),
                        hex[Int(byte >> 4)],
                        hex[Int(byte & 0xF)],
                    ])
                }
                start = end + 1
            }
        }
        bytes.append(UInt8(ascii: "\""))
    }
}

/// A protocol type that writes its own JSON form.
public protocol JSONWritable {
    func write(to writer: inout JSONWriter)
}
