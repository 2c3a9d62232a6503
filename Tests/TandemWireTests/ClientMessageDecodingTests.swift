import Foundation
import Testing

@testable import TandemWire

/// `Wire.decode(ClientMessage.self, from:)` reads a write's ops as member lists and their
/// fields straight into canonical text (`CanonicalJSON`) when it can; it must accept and
/// refuse exactly what the general decoding (through a `JSONValue` tree) does, with the same
/// values and the same errors, and the text it keeps must be the bytes the writer gives.
@Suite("Client messages decoded with canonical fields")
struct ClientMessageDecodingTests {
    /// What a decoding gave: the message with the text each op's fields are stored as, or the
    /// error with everything it carries.
    enum Outcome: Equatable {
        case message(ClientMessage, fieldsText: [[UInt8]?])
        case refused(String)

        init(_ body: () throws(WireError) -> ClientMessage) {
            do {
                let message = try body()
                guard case .write(let write) = message else {
                    self = .message(message, fieldsText: [])
                    return
                }
                self = .message(message, fieldsText: write.ops.map(\.canonicalFieldsJSON))
            } catch {
                self = .refused(
                    "\(error.code) \(error.message) request=\(error.request ?? "-") op=\(error.op.map(String.init) ?? "-")"
                )
            }
        }
    }

    static func outcomes(_ bytes: [UInt8]) -> (fast: Outcome, general: Outcome) {
        (
            Outcome { () throws(WireError) in try Wire.decode(ClientMessage.self, from: bytes) },
            Outcome { () throws(WireError) in
                try ServerMessageDecodingTests.general(ClientMessage.self, bytes)
            }
        )
    }

    /// Fields of the kinds apps store, with the values the fast path leaves to the parser
    /// (escapes, non-ASCII keys, doubles printed with an exponent) mixed in at random.
    static func fields(_ random: inout SplitMix, _ index: Int) -> JSONObject {
        var fields: JSONObject = [
            "title": .string("Rent \(index)"), "amount": .int(Int64(index) * 37 - 500), "paid": .bool(index % 2 == 0),
            "updatedAt": .int(1_763_683_200_000 + Int64(index)), "note": .null,
            "price": .double(Double(Int.random(in: -99_999...99_999, using: &random)) / 100),
            "tags": .array([.string("home"), .int(Int64.min), .int(Int64.max), .array([])]),
            "place": .object(["city": .string("Zürich – 東京"), "zip": .string(""), "at": .object([:])]),
        ]
        switch Int.random(in: 0..<6, using: &random) {
        case 0: fields["quote"] = .string("say \"hi\"\\\n\t\u{1}")
        case 1: fields["clé"] = .string("accent in a key")
        case 2: fields["big"] = .double(1e21)
        case 3: fields["small"] = .double(0.000_01)
        default: break
        }
        return fields
    }

    static func messages(seed: UInt64) throws -> [ClientMessage] {
        var random = SplitMix(seed: seed)
        let collection = try CollectionPath("accounts/a\(seed)/entries")
        let ops = try (0..<Int.random(in: 1...30, using: &random)).map { index -> WriteOp in
            switch Int.random(in: 0..<4, using: &random) {
            case 0:
                return .create(
                    in: collection, fields: fields(&random, index), idempotencyKey: try ClientName("k\(index)"))
            case 1:
                return .update(
                    in: collection, id: try DocumentID("d\(index)"), fields: fields(&random, index), baseVersion: 3,
                    idempotencyKey: try ClientName("k\(index)"))
            case 2:
                var op = WriteOp.update(
                    in: collection, id: try DocumentID("d\(index)"), fields: fields(&random, index), baseVersion: nil,
                    idempotencyKey: try ClientName("k\(index)"))
                op.fieldTimes = ["title": 5, "amount": 6]
                return op
            default:
                return .delete(
                    in: collection, id: try DocumentID("d\(index)"), baseVersion: 2,
                    idempotencyKey: try ClientName("k\(index)"))
            }
        }
        return [
            .write(.init(request: "r\(seed)", ops: ops)),
            .hello(.init(clientId: try ClientName("c\(seed)"), token: "t")),
            .get(.init(request: "g", collection: collection, id: try DocumentID("d1"))),
        ]
    }

    @Test("every client message decodes to the same value both ways", arguments: 0..<50)
    func sameValues(seed: Int) throws {
        for message in try Self.messages(seed: UInt64(seed)) {
            let bytes = Wire.encode(message)
            let fast = try Wire.decode(ClientMessage.self, from: bytes)
            #expect(fast == message)
            #expect(try ServerMessageDecodingTests.general(ClientMessage.self, bytes) == fast)
            guard case .write(let write) = fast, case .write(let sent) = message else { continue }
            for (op, sentOp) in zip(write.ops, sent.ops) {
                #expect(op.canonicalFieldsJSON == sentOp.fields.map { Wire.encodeCanonical($0) })
            }
        }
    }

    @Test("a device's write keeps each op's fields as text, parsed only when read; a merge's as a tree")
    func keepsFieldsAsText() throws {
        let collection = try CollectionPath("items")
        var random = SplitMix(seed: 7)
        // No escapes, ASCII keys, doubles in plain form: what the bench's rows hold.
        let plain = (0..<20).map { index -> JSONObject in
            var fields = Self.fields(&random, index)
            for key in ["quote", "clé", "big", "small"] { fields[key] = nil }
            return fields
        }
        let ops = try plain.enumerated().map { index, fields in
            WriteOp.create(in: collection, fields: fields, idempotencyKey: try ClientName("k\(index)"))
        }
        let decoded = try Wire.decode(
            ClientMessage.self, from: Wire.encode(ClientMessage.write(.init(request: "r", ops: ops))))
        guard case .write(let write) = decoded else {
            Issue.record("not a write: \(decoded)")
            return
        }
        for (op, fields) in zip(write.ops, plain) {
            guard case .canonical(let json) = op.content else {
                Issue.record("the fields were parsed into a tree")
                continue
            }
            #expect(json == Wire.encodeCanonical(fields))
            #expect(op.fields == fields)
        }

        // A merge's fields are read anyway (their times' names checked, then merged): parsed
        // once, and kept as a tree.
        var merge = WriteOp.update(
            in: collection, id: try DocumentID("d"), fields: plain[0], baseVersion: nil,
            idempotencyKey: try ClientName("m"))
        merge.fieldTimes = ["title": 1]
        let merged = try Wire.decode(
            ClientMessage.self, from: Wire.encode(ClientMessage.write(.init(request: "r", ops: [merge]))))
        guard case .write(let mergeWrite) = merged, case .tree(let tree) = mergeWrite.ops[0].content else {
            Issue.record("a merge's fields were not kept as a tree: \(merged)")
            return
        }
        #expect(tree == plain[0])
    }

    @Test("malformed and mutated client messages get the same outcome both ways, value or error")
    func sameOutcomes() throws {
        var random = SplitMix(seed: 42)
        let head =
            #"{"type":"write","request":"r","ops":[{"op":"create","collection":"c","idempotencyKey":"k","fields":"#
        var inputs: [[UInt8]] = [
            Array(#"[]"#.utf8), Array(#"{}"#.utf8), Array(#"{"type":"write","request":"r"}"#.utf8),
            Array(#"{"type":"write","request":"r","ops":[]}"#.utf8),
            Array(#"{"type":"write","request":"r","ops":{}}"#.utf8),
            Array(#"{"type":"write","request":"r","ops":[1]}"#.utf8),
        ]
        // Fields the fast path must leave to the parser, and fields it reads itself, each
        // followed by the rest of the op: both must end as the general decoding ends.
        let fieldTexts = [
            #"{"a":1}"#, #"{ "b" : 1 , "a" : [ 1 , 2 ] }"#, #"{"a":"x\"y"}"#, #"{"a":"\u00e9"}"#, #"{"é":1}"#,
            #"{"a":-0}"#, #"{"a":1e3}"#, #"{"a":1.50}"#, #"{"a":1.5}"#, #"{"a":01}"#, #"{"a":-}"#, #"{"a":1.}"#,
            #"{"a":9223372036854775807}"#, #"{"a":9223372036854775808}"#, #"{"a":-9223372036854775808}"#,
            #"{"a":1,"a":2}"#, #"{"b":1,"a":2,"b":3}"#, #"{"a":1,}"#, #"{"a":[1,]}"#, #"{"a":tru}"#,
            "{\"a\":\"tab\tin\"}", #"{"a":1}}"#, #"{"a":{"c":1,"b":{"e":[],"d":{}}}}"#, #"[1]"#, #"null"#, #"{}"#,
            #"{"a":1 "b":2}"#, #"{"a"}"#, "{\"a\":\"\u{1F600}\"}",
            "{\"a\":" + String(repeating: "[", count: 60) + String(repeating: "]", count: 60) + "}",
            "{\"a\":" + String(repeating: "[", count: 61) + String(repeating: "]", count: 61) + "}",
        ]
        for text in fieldTexts {
            inputs.append(Array((head + text + "}]}").utf8))
            inputs.append(Array((head + text + #","fieldTimes":{"a":1}}]}"#).utf8))
            inputs.append(Array((head + text + #","fields":{}}]}"#).utf8))
        }
        // Invalid UTF-8 inside a string of the fields.
        inputs.append(Array(head.utf8) + Array(#"{"a":""#.utf8) + [0xC3, 0x28] + Array(#""}}]}"#.utf8))
        for seed in 0..<20 {
            for message in try Self.messages(seed: UInt64(seed)) {
                let bytes = Wire.encode(message)
                inputs.append(bytes)
                inputs += ServerMessageDecodingTests.mutations(
                    of: bytes, &random, inserting: [#","title":1"#, " ", #","fields":{}"#])
            }
        }
        var refused = 0
        for input in inputs {
            let (fast, general) = Self.outcomes(input)
            #expect(fast == general, "\(String(decoding: input.prefix(300), as: UTF8.self))")
            if case .refused = general { refused += 1 }
        }
        #expect(refused > inputs.count / 4, "the mutations must reach the errors: \(refused) of \(inputs.count)")
    }

    @Test("the canonical reading gives the writer's bytes, or leaves the value to the parser")
    func canonicalReading() throws {
        var random = SplitMix(seed: 3)
        var read = 0
        for index in 0..<500 {
            let value = JSONValue.object(Self.fields(&random, index))
            let canonical = Wire.encodeCanonical(value)
            // The same value spaced out and in another key order, as another client may send it.
            let loose = Array(Wire.encode(value)).flatMap { byte -> [UInt8] in
                byte == UInt8(ascii: ",") || byte == UInt8(ascii: ":") ? [0x20, byte, 0x0A] : [byte]
            }
            for text in [canonical, loose] {
                let result = text.withUnsafeBufferPointer { CanonicalJSON.read($0, from: 0, depthLeft: 64) }
                guard let result else { continue }
                read += 1
                #expect(result.json == canonical)
                #expect(result.end == text.count)
            }
        }
        // Most of these values hold nothing the parser must read (a third hold an escape, a
        // non-ASCII key or a double printed with an exponent).
        #expect(read > 300, "\(read) of 1,000 read canonically")
    }

    @Test(
        "values the canonical reading leaves to the parser",
        arguments: [
            #"{"a":"x\"y"}"#, #"{"a":"\/"}"#, #"{"é":1}"#, #"{"a":-0}"#, #"{"a":1e3}"#, #"{"a":1.50}"#, #"{"a":01}"#,
            #"{"a":1,"a":2}"#, #"{"b":1,"a":2,"b":3}"#, #"{"a":1,}"#, #"{"a":tru}"#, #"{"a":9223372036854775808}"#,
            #"{"a":18446744073709551616}"#, #"{"a":1"#, #"{"a":"x"#, "{\"a\":\"\u{1}\"}",
        ])
    func leftToTheParser(text: String) {
        let bytes = Array(text.utf8)
        #expect(bytes.withUnsafeBufferPointer { CanonicalJSON.read($0, from: 0, depthLeft: 64) } == nil)
    }

    @Test("a string's plain run ends at the first quote, backslash or control byte, eight bytes at a time or one")
    func plainRuns() {
        var random = SplitMix(seed: 11)
        let alphabet: [UInt8] = [0x22, 0x5C, 0x00, 0x1F, 0x20, 0x21, 0x5B, 0x5D, 0x7F, 0x80, 0xC3, 0xA9, 0xFF, 0x61]
        for _ in 0..<2000 {
            let count = Int.random(in: 0...40, using: &random)
            // Mostly plain ASCII, with a special byte here and there.
            let bytes = (0..<count).map { _ in
                Int.random(in: 0..<8, using: &random) == 0
                    ? alphabet.randomElement(using: &random)! : UInt8.random(in: 0x20...0x7E, using: &random)
            }
            let start = count == 0 ? 0 : Int.random(in: 0...count, using: &random)
            var expectedHigh: UInt8 = 0
            var expected = start
            while expected < count, bytes[expected] != 0x22, bytes[expected] != 0x5C, bytes[expected] >= 0x20 {
                expectedHigh |= bytes[expected]
                expected += 1
            }
            var high: UInt8 = 0
            let end = bytes.withUnsafeBufferPointer { JSONParser.plainRunEnd($0, from: start, highBits: &high) }
            #expect(end == expected, "\(bytes) from \(start)")
            #expect(high & 0x80 == expectedHigh & 0x80, "\(bytes) from \(start)")
        }
    }

    @Test("the writer escapes a string's quotes, backslashes and control bytes wherever they fall, and copies the rest")
    func writerEscapes() throws {
        var random = SplitMix(seed: 13)
        let specials: [Unicode.Scalar] = ["\"", "\\", "\u{0}", "\u{1F}", "\n", "\r", "\t", "\u{7F}", "é", "😀", "/"]
        for _ in 0..<2000 {
            let count = Int.random(in: 0...60, using: &random)
            var text = ""
            for _ in 0..<count {
                text.unicodeScalars.append(
                    Int.random(in: 0..<6, using: &random) == 0
                        ? specials.randomElement(using: &random)!
                        : Unicode.Scalar(UInt8.random(in: 0x20...0x7E, using: &random)))
            }
            // One byte at a time, as the writer did before it copied plain runs whole.
            var expected: [UInt8] = [0x22]
            for byte in text.utf8 {
                switch byte {
                case 0x22: expected += Array(#"\""#.utf8)
                case 0x5C: expected += Array(#"\\"#.utf8)
                case 0x0A: expected += Array(#"\n"#.utf8)
                case 0x0D: expected += Array(#"\r"#.utf8)
                case 0x09: expected += Array(#"\t"#.utf8)
                case ..<0x20: expected += Array(String(format: "\\u%04x", byte).utf8)
                default: expected.append(byte)
                }
            }
            expected.append(0x22)
            var writer = JSONWriter()
            writer.string(text)
            #expect(writer.bytes == expected, "\(Array(text.utf8))")
            #expect(try Wire.parse(expected) == .string(text))
        }
    }

    @Test(
        "the writer writes integers as Swift prints them, the ends of Int64 included, and keys written once as key() writes them"
    )
    func writerIntegersAndKeys() {
        var random = SplitMix(seed: 17)
        let values: [Int64] =
            [0, 1, -1, 9, 10, -10, 99, 100, Int64.max, Int64.min, Int64.min + 1]
            + (0..<500).map { _ in
                Int64.random(in: Int64.min...Int64.max, using: &random) >> Int64.random(in: 0...63, using: &random)
            }
        for value in values {
            var writer = JSONWriter()
            writer.int(value)
            #expect(String(decoding: writer.bytes, as: UTF8.self) == String(value))
        }
        for key in ["title", "naïve", "a\"b", "tab\there", ""] {
            var plain = JSONWriter()
            plain.beginObject()
            plain.key(key)
            plain.int(1)
            plain.key(key + "2")
            plain.null()
            plain.endObject()
            var encoded = JSONWriter()
            encoded.beginObject()
            encoded.key(encoded: JSONWriter.encodedKey(key))
            encoded.int(1)
            encoded.key(encoded: JSONWriter.encodedKey(key + "2"))
            encoded.null()
            encoded.endObject()
            #expect(encoded.bytes == plain.bytes)
        }
    }

    @Test("a batch's create key is its key, a dash and the row, and still refused past the length limit")
    func suffixedNames() throws {
        let key = try ClientName("0MxAbCdEaaaaaaaaaaaa")
        #expect(try key.suffixed(42).rawValue == "0MxAbCdEaaaaaaaaaaaa-42")
        #expect(try key.suffixed(-7).rawValue == "0MxAbCdEaaaaaaaaaaaa--7")
        #expect(try key.suffixed(Int64.min).rawValue == "0MxAbCdEaaaaaaaaaaaa-\(Int64.min)")
        let long = try ClientName(String(repeating: "k", count: 250))
        #expect(try long.suffixed(12345).rawValue.utf8.count == 256)
        #expect(throws: WireError.self) { try long.suffixed(123456) }
    }

    @Test("keys that are the same text in another encoding (é, e + U+0301; K, the Kelvin sign) are one key both ways")
    func canonicallyEquivalentKeys() {
        let op = #"{"op":"create","collection":"c","fields":{"a":1},"idempotency\#u{212A}ey":"k"}"#
        let inputs = [
            // A repeated key of the message, and of an op: refused both ways.
            #"{"type":"write","request":"r","ops":[],"\#u{e9}":1,"e\#u{301}":2}"#,
            #"{"type":"write","request":"r","ops":[{"op":"create","collection":"c","fields":{},"idempotencyKey":"k","\#u{e9}":1,"e\#u{301}":2}]}"#,
            // A key written with the Kelvin sign is found as "idempotencyKey" both ways.
            #"{"type":"write","request":"r","ops":[\#(op)]}"#,
        ]
        for input in inputs {
            let (fast, general) = Self.outcomes(Array(input.utf8))
            #expect(fast == general, "\(input)")
        }
        if case .refused = Self.outcomes(Array(inputs[0].utf8)).general {
        } else {
            Issue.record("a repeated key is refused")
        }
        if case .refused = Self.outcomes(Array(inputs[2].utf8)).fast { Issue.record("the Kelvin sign's key is found") }
    }

    @Test("the canonical reading stops where the parser's depth limit would")
    func depthLimit() {
        let nested = Array((String(repeating: "[", count: 3) + String(repeating: "]", count: 3)).utf8)
        #expect(nested.withUnsafeBufferPointer { CanonicalJSON.read($0, from: 0, depthLeft: 3) }?.json == nested)
        #expect(nested.withUnsafeBufferPointer { CanonicalJSON.read($0, from: 0, depthLeft: 2) } == nil)
    }
}
