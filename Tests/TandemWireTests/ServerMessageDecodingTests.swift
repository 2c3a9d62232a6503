import Foundation
import Testing

@testable import TandemWire

/// `Wire.decode(ServerMessage.self, from:)` reads the message object and a snapshot's changes
/// as member lists; it must accept and refuse exactly what the general decoding (through a
/// `JSONValue` tree) does, with the same values and the same errors.
@Suite("Server messages decoded through member lists")
struct ServerMessageDecodingTests {
    /// The general decoding: the generic `Wire.decode`, which the `ServerMessage` overload
    /// hides outside a generic context.
    static func general<Message: JSONReadable>(_ type: Message.Type, _ bytes: [UInt8]) throws(WireError) -> Message {
        try Wire.decode(type, from: bytes)
    }

    /// What a decoding gave: the message, or the error with everything it carries.
    enum Outcome: Equatable {
        case message(ServerMessage)
        case refused(String)

        init(_ body: () throws(WireError) -> ServerMessage) {
            do { self = .message(try body()) } catch {
                self = .refused(
                    "\(error.code) \(error.message) request=\(error.request ?? "-") target=\(error.target ?? "-")")
            }
        }
    }

    /// The two decodings' outcomes.
    static func outcomes(_ bytes: [UInt8]) -> (fast: Outcome, general: Outcome) {
        (
            Outcome { () throws(WireError) in try Wire.decode(ServerMessage.self, from: bytes) },
            Outcome { () throws(WireError) in try general(ServerMessage.self, bytes) }
        )
    }

    static func document(_ random: inout SplitMix, _ index: Int) -> Document {
        var fields: JSONObject = ["title": .string("t\(index) \u{e9}\"\\\n"), "amount": .int(Int64(index) - 50)]
        if Bool.random(using: &random) {
            fields["nested"] = .object(["a": .array([.null, .bool(true), .double(2.5)])])
        }
        if Bool.random(using: &random) {
            fields["note"] = .string(String(repeating: "x", count: Int.random(in: 0...300, using: &random)))
        }
        return Document(
            id: try! DocumentID("d\(index)"), version: Int64.random(in: 1...9, using: &random), fields: fields,
            createTime: 1_763_683_200_000 + Int64(index), updateTime: 1_763_683_300_000,
            deleted: Int.random(in: 0..<10, using: &random) == 0,
            createKey: Bool.random(using: &random) ? "k\(index)" : nil,
            fieldTimes: Bool.random(using: &random) ? ["title": 5, "amount": 6] : nil)
    }

    static func messages(seed: UInt64) -> [ServerMessage] {
        var random = SplitMix(seed: seed)
        let changes = (0..<Int.random(in: 0...40, using: &random)).map { index in
            var change = Change(
                [.added, .modified, .deleted, .removed].randomElement(using: &random)!, document(&random, index))
            if Bool.random(using: &random) {
                change.oldIndex = Int.random(in: -1...5, using: &random)
                change.newIndex = Int.random(in: -1...5, using: &random)
            }
            return change
        }
        return [
            .snapshot(
                .init(
                    target: "t\(seed)", changes: changes, resumeToken: "e.\(seed)",
                    initial: Bool.random(using: &random),
                    hasMore: Bool.random(using: &random))),
            .ack(
                .init(
                    request: "r1",
                    results: [
                        WriteResult(id: try! DocumentID("a"), version: 2, updateTime: 3, document: document(&random, 1))
                    ])),
            .reset(.init(target: "t1", reason: "why")),
            .error(WireError(.permissionDenied, "no", request: "r2", op: 1)),
        ]
    }

    /// Twenty copies of `bytes`, each with a byte changed, removed, or one of `insertions`
    /// inserted, at a random place.
    static func mutations(of bytes: [UInt8], _ random: inout SplitMix, inserting insertions: [String]) -> [[UInt8]] {
        (0..<20).map { _ in
            var mutated = bytes
            let at = Int.random(in: 0..<mutated.count, using: &random)
            switch Int.random(in: 0..<(2 + insertions.count), using: &random) {
            case 0: mutated[at] = UInt8.random(in: 0x20...0x7E, using: &random)
            case 1: mutated.remove(at: at)
            case let choice: mutated.insert(contentsOf: Array(insertions[choice - 2].utf8), at: at)
            }
            return mutated
        }
    }

    @Test("every server message decodes to the same value both ways", arguments: 0..<50)
    func sameValues(seed: Int) throws {
        for message in Self.messages(seed: UInt64(seed)) {
            let bytes = Wire.encode(message)
            let fast = try Wire.decode(ServerMessage.self, from: bytes)
            #expect(fast == message)
            #expect(try Self.general(ServerMessage.self, bytes) == fast)
        }
    }

    @Test("ServerMessage.kinds names the type of every message the server sends, and only those")
    func kindsListed() throws {
        var seen: Set<String> = []
        let document = Document(id: try DocumentID("d1"), version: 1, fields: [:], createTime: 1, updateTime: 1)
        let others: [ServerMessage] = [
            .welcome(.init(sessionId: "s1", serverTime: 1, limits: .default)),
            .conflict(.init(request: "r1", op: 0, server: document)),
            .document(.init(request: "r2", document: document)),
            .authenticated(.init(user: "alice", expires: 1_800_000_000)),
        ]
        for seed in 0..<20 {
            for message in Self.messages(seed: UInt64(seed)) + others {
                guard case .object(let members) = try Wire.parse(Wire.encode(message)),
                    case .string(let type)? = members["type"]
                else { throw WireError(.badMessage, "a message without its type") }
                seen.insert(type)
            }
        }
        #expect(seen == ServerMessage.kinds)
    }

    @Test("malformed and mutated server messages get the same outcome both ways, value or error")
    func sameOutcomes() {
        var random = SplitMix(seed: 42)
        var inputs: [[UInt8]] = [
            Array(#"[]"#.utf8), Array(#" "snapshot" "#.utf8), Array(#"{}"#.utf8), Array(#"{"type":"snapshot"}"#.utf8),
            Array(#"{"type":"snapshot","target":"t","changes":{},"resumeToken":"x"}"#.utf8),
            Array(#"{"type":"snapshot","target":"t","changes":[1,{"kind":"added"}],"resumeToken":"x"}"#.utf8),
            Array(#"{"type":"snapshot","target":"t","changes":[],"changes":[],"resumeToken":"x"}"#.utf8),
            Array(
                #"{"type":"snapshot","target":"t","resumeToken":"x","changes":[{"kind":"added","id":"a","version":1,"version":2}]}"#
                    .utf8),
            Array(
                #"{"type":"snapshot","target":"t","resumeToken":"x","changes":[{"kind":"nope","id":"a","version":1}]}"#
                    .utf8),
            Array(
                #"{"type":"snapshot","target":"t","resumeToken":"x","changes":[{"kind":"added","id":"a/b","version":1}]}"#
                    .utf8),
            Array(
                #"{"type":"snapshot","target":"t","resumeToken":"x","changes":[{"kind":"added","id":"a","version":1.0,"fields":null}]}"#
                    .utf8),
            Array(#"{"type":"snapshot","target":7,"resumeToken":"x","changes":[]} x"#.utf8),
            Array(#"{"type":"error","code":"internal","message":"m","target":"t9"}"#.utf8),
            Array(#"{"type":"ack","request":"r","results":[{"id":"a"}]}"#.utf8),
            Array(
                ("{\"type\":\"snapshot\",\"target\":\"t\",\"resumeToken\":\"x\",\"changes\":[{\"kind\":\"added\",\"id\":\"a\",\"version\":1,\"fields\":"
                    + String(repeating: "[", count: 70) + String(repeating: "]", count: 70) + "}]}").utf8),
        ]
        // Objects of many members, whose repeated keys the member lists find through a set.
        let many = (0..<30).map { #""x\#($0)":\#($0)"# }.joined(separator: ",")
        for repeated in ["x3", "x20", "kind", "type"] {
            inputs.append(
                Array(
                    (#"{"type":"snapshot","target":"t","resumeToken":"x","changes":[{"kind":"added","id":"a","version":1,"#
                        + many + #","\#(repeated)":0}]}"#).utf8))
            inputs.append(Array((#"{"type":"reset","target":"t","reason":"r","# + many + #","\#(repeated)":0}"#).utf8))
        }
        for seed in 0..<20 {
            for message in Self.messages(seed: UInt64(seed)) {
                let bytes = Wire.encode(message)
                inputs.append(bytes)
                inputs += Self.mutations(of: bytes, &random, inserting: [#","version":1"#, #","target":"dup""#])
            }
        }
        var refused = 0
        for input in inputs {
            let (fast, general) = Self.outcomes(input)
            #expect(fast == general, "\(String(decoding: input.prefix(200), as: UTF8.self))")
            if case .refused = general { refused += 1 }
        }
        #expect(refused > inputs.count / 4, "the mutations must reach the errors: \(refused) of \(inputs.count)")
    }
}
