import Foundation
import Testing

@testable import TandemWire

@Suite("Collection paths and document ids")
struct NamingTests {
    @Test(
        "valid collection paths are accepted",
        arguments: [
            "accounts", "accounts/A1/transactions", "a.b/c~d/e:f", "...", "a/.x/b",
            String(repeating: "x", count: 256), "a/b/c/d/e/f/g/h/i/j/k/l/m/n/o",
        ])
    func validPaths(path: String) throws {
        #expect(try CollectionPath(path).rawValue == path)
    }

    @Test(
        "invalid collection paths are refused with invalid-path",
        arguments: [
            "", "accounts/A1", "/accounts", "accounts/", "a//b", "accounts/../x", "accounts/A 1/t", "ac'counts",
            "a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q", "accounts;DROP TABLE", "é", ".", "a/b/..", "a/./b",
            String(repeating: "x", count: 257), "a/b/" + String(repeating: "x", count: 257),
        ])
    func invalidPaths(path: String) {
        #expect {
            try CollectionPath(path)
        } throws: { error in
            (error as? WireError)?.code == .invalidPath
        }
    }

    @Test("the parent of a nested collection is its owning document")
    func parent() throws {
        let path = try CollectionPath("accounts/A1/transactions")
        let parent = try #require(path.parent)
        #expect(parent.collection.rawValue == "accounts")
        #expect(parent.id.rawValue == "A1")
        #expect(try CollectionPath("accounts").parent == nil)
    }

    @Test("random document ids are 20 letters and digits")
    func randomIDs() throws {
        let ids = (0..<1000).map { _ in DocumentID.random().rawValue }
        #expect(Set(ids).count == 1000)
        for id in ids {
            #expect(id.count == 20)
            #expect(id.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber) })
        }
        // Every position is drawn (a position left unfilled would repeat, or hold garbage).
        for position in 0..<20 {
            let seen = Set(ids.map { Array($0.utf8)[position] })
            #expect(seen.count > 50, "position \(position): \(seen.count) characters in 1,000 ids")
        }
    }

    @Test("server-assigned ids are valid, unique, and sort by the time they were made")
    func timeOrderedIDs() throws {
        let start: Int64 = 1_790_000_000_000
        let ids = (0..<1000).map { index in DocumentID.timeOrdered(milliseconds: start + Int64(index / 10)) }
        #expect(Set(ids).count == 1000)
        for id in ids {
            #expect(id.rawValue.count == 20)
            #expect(try DocumentID(id.rawValue) == id)
        }
        for (earlier, later) in zip(ids, ids.dropFirst(10)) { #expect(earlier < later) }
        for position in 8..<20 {
            let seen = Set(ids.map { Array($0.rawValue.utf8)[position] })
            #expect(seen.count > 50, "random position \(position): \(seen.count) characters in 1,000 ids")
        }
        // Ids whose times are far apart too (6,900 years fit in the 8 time characters).
        #expect(DocumentID.timeOrdered(milliseconds: 0) < DocumentID.timeOrdered(milliseconds: start))
        #expect(DocumentID.timeOrdered(milliseconds: start) < DocumentID.timeOrdered(milliseconds: 200_000_000_000_000))
    }

    @Test("resume tokens round-trip and nonsense is refused")
    func resumeTokens() {
        let token = ResumeToken(epoch: "Ab12", sequence: 42)
        #expect(ResumeToken(token.description) == token)
        for bad in ["", "42", ".42", "x.-1", "x.y", "a b.1"] {
            #expect(ResumeToken(bad) == nil, "\(bad)")
        }
    }
}

@Suite("Message coding")
struct MessageCodingTests {
    @Test("an error about a message carries the message's request or target, whichever it has")
    func errorsNameTheirMessage() {
        do {
            _ = try Wire.decode(ClientMessage.self, from: Array(#"{"type":"write","request":"r9","ops":[]}"#.utf8))
            Issue.record("accepted a write without ops")
        } catch {
            #expect(error.request == "r9" && error.target == nil, "\(error)")
        }
        let snapshot = #"{"type":"snapshot","target":"t9","changes":[{"kind":"x"}],"resumeToken":"e"}"#
        do {
            _ = try Wire.decode(ServerMessage.self, from: Array(snapshot.utf8))
            Issue.record("accepted a change of an unknown kind")
        } catch {
            #expect(error.target == "t9" && error.request == nil, "\(error)")
        }
    }

    @Test("every client message round-trips through JSON")
    func clientRoundTrip() throws {
        let accounts = try CollectionPath("accounts")
        let messages: [ClientMessage] = [
            .hello(.init(clientId: try ClientName("device-1"), token: "secret")),
            .listen(.init(target: "t1", collection: accounts, resumeToken: "e.3")),
            .listen(.init(target: "t2", collection: accounts, excludesOwnWrites: true)),
            .unlisten(.init(target: "t1")),
            .write(
                .init(
                    request: "r1",
                    ops: [
                        .create(
                            in: accounts, fields: ["n": 1, "x": [true, nil, 2.5, "s"]],
                            idempotencyKey: try ClientName("k1")),
                        .update(
                            in: accounts, id: try DocumentID("A"), fields: [:], baseVersion: 2,
                            idempotencyKey: try ClientName("k2")),
                        .delete(
                            in: accounts, id: try DocumentID("A"), baseVersion: nil,
                            idempotencyKey: try ClientName("k3")),
                    ])),
            .get(.init(request: "r2", collection: accounts, id: try DocumentID("A"))),
        ]
        for message in messages {
            let bytes = Wire.encode(message)
            #expect(try Wire.decode(ClientMessage.self, from: bytes) == message)
        }
    }

    @Test("server messages round-trip through JSON")
    func serverRoundTrip() throws {
        let document = Document(id: try DocumentID("A"), version: 2, fields: ["a": 1], createTime: 1, updateTime: 2)
        let messages: [ServerMessage] = [
            .welcome(.init(sessionId: "s", serverTime: 5, limits: .default)),
            .snapshot(
                .init(
                    target: "t", changes: [Change(.added, document)], resumeToken: "e.1", initial: true, hasMore: true)),
            .reset(.init(target: "t", reason: "too old")),
            .ack(.init(request: "r", results: [WriteResult(id: try DocumentID("A"), version: 1, updateTime: 3)])),
            .conflict(.init(request: "r", op: 0, server: document)),
            .document(.init(request: "r", document: document)),
            .error(WireError(.notFound, "gone", request: "r", op: 1)),
        ]
        for message in messages {
            #expect(try Wire.decode(ServerMessage.self, from: Wire.encode(message)) == message)
        }
    }

    @Test("the JSON form matches the protocol document")
    func jsonForm() throws {
        let json =
            #"{"type":"write","request":"r1","ops":[{"op":"update","collection":"accounts/A1/transactions","id":"T9","fields":{"amount":-12.5,"note":"x"},"baseVersion":3,"idempotencyKey":"k-1"}]}"#
        guard case .write(let write) = try Wire.decode(ClientMessage.self, from: Array(json.utf8)) else {
            Issue.record("not a write")
            return
        }
        #expect(write.ops[0].kind == .update)
        #expect(write.ops[0].fields?["amount"] == .double(-12.5))
        #expect(write.ops[0].baseVersion == 3)

        let change = Change(
            .deleted,
            Document(id: try DocumentID("T9"), version: 4, fields: [:], createTime: 1, updateTime: 9, deleted: true))
        let text = Wire.encodeString(change)
        #expect(text.contains(#""kind":"deleted""#))
        #expect(text.contains(#""id":"T9""#))
        #expect(text.contains(#""deleted":true"#))
    }

    @Test("integers stay integers and large ones keep every digit")
    func numbers() throws {
        let fields = try Wire.decodeFields(Array(#"{"a":9007199254740993,"b":1.5,"c":-0}"#.utf8))
        #expect(fields["a"] == .int(9_007_199_254_740_993))
        #expect(fields["b"] == .double(1.5))
        #expect(fields["c"]?.intValue == 0)
    }

    @Test(
        "bad messages are refused with a message naming what is wrong",
        arguments: [
            ("{", ErrorCode.badMessage, "not valid JSON"),
            ("[1,2]", .badMessage, "the message"),
            (#"{"type":"dance"}"#, .badMessage, "unknown message type 'dance'"),
            (#"{"request":"r"}"#, .badMessage, "type: missing"),
            (#"{"type":"write","request":"r1"}"#, .badMessage, "ops: missing"),
            (#"{"type":"write","request":"r1","ops":[]}"#, .badMessage, "at least one op"),
            (
                #"{"type":"write","request":"r1","ops":[{"op":"create","collection":"a","idempotencyKey":"k"}]}"#,
                .badMessage, "ops[0]: a create needs fields"
            ),
            (
                #"{"type":"write","request":"r1","ops":[{"op":"nuke","collection":"a","idempotencyKey":"k"}]}"#,
                .badMessage, "ops[0].op: unknown op 'nuke'"
            ),
            (
                #"{"type":"write","request":"r1","ops":[{"op":"delete","collection":"a","idempotencyKey":"k"}]}"#,
                .badMessage, "a delete needs an id"
            ),
            (
                #"{"type":"write","request":"r1","ops":[{"op":"create","collection":"a/b","fields":{},"idempotencyKey":"k"}]}"#,
                .invalidPath, "ops[0].collection"
            ),
            (
                #"{"type":"write","request":"r1","ops":[{"op":"create","collection":"a","id":"x/y","fields":{},"idempotencyKey":"k"}]}"#,
                .invalidPath, "ops[0].id"
            ),
            (
                #"{"type":"write","request":"r1","ops":[{"op":"create","collection":"a","fields":[],"idempotencyKey":"k"}]}"#,
                .badMessage, "ops[0].fields: expected an object"
            ),
            (
                #"{"type":"write","request":"r1","ops":[{"op":"update","collection":"a","id":"x","fields":{},"baseVersion":"3","idempotencyKey":"k"}]}"#,
                .badMessage, "ops[0].baseVersion: expected an integer"
            ),
            (#"{"type":"listen","target":"","collection":"a"}"#, .badMessage, "target: must be 1 to 128 bytes"),
            (
                #"{"type":"listen","target":"t","collection":"a","excludeOwnWrites":"yes"}"#, .badMessage,
                "excludeOwnWrites: expected true or false"
            ),
            (#"{"type":"hello","protocol":1,"clientId":"has space"}"#, .badMessage, "clientId"),
            (
                #"{"type":"write","request":"r1","ops":[{"op":"create","collection":"a","fields":{"n":1e999},"idempotencyKey":"k"}]}"#,
                .badMessage, ""
            ),
        ])
    func badMessages(json: String, code: ErrorCode, fragment: String) {
        do {
            _ = try Wire.decode(ClientMessage.self, from: Array(json.utf8))
            Issue.record("accepted \(json)")
        } catch {
            #expect(error.code == code, "\(json) → \(error)")
            #expect(fragment.isEmpty || error.message.contains(fragment), "\(json) → \(error.message)")
        }
    }

    @Test("a key twice in one object is refused at the second, at any depth")
    func duplicateKeys() throws {
        for (json, offset) in [(#"{"a":1,"b":2,"a":3}"#, 13), (#"{"x":{"a":{"b":1},"a":2},"y":1}"#, 18)] {
            do {
                _ = try Wire.parse(Array(json.utf8))
                Issue.record("accepted \(json)")
            } catch {
                #expect(error.message.contains("the key 'a' appears twice"), "\(json) → \(error.message)")
                #expect(error.message.contains("at byte \(offset)"), "\(json) → \(error.message)")
            }
        }
        // The same keys in sibling and nested objects are not duplicates.
        let nested = try Wire.decodeFields(Array(#"{"a":{"a":{"a":1},"b":[{"a":2},{"a":3}]},"b":"é\u00e9 ✓"}"#.utf8))
        #expect(nested["a"]?.objectValue?["b"] == .array([.object(["a": .int(2)]), .object(["a": .int(3)])]))
        #expect(nested["a"]?.objectValue?["a"] == .object(["a": .int(1)]))
        #expect(nested["b"] == .string("éé ✓"))
    }

    @Test("a string that is not valid UTF-8 is refused, ASCII or not around it")
    func invalidUTF8() {
        for bytes: [UInt8] in [
            Array(#"{"a":""#.utf8) + [0xC3] + Array(#""}"#.utf8),
            Array(#"{"a":"abc"#.utf8) + [0xFF, 0x41] + Array(#""}"#.utf8),
            Array(#"{""#.utf8) + [0xE2, 0x82] + Array(#"":1}"#.utf8),
        ] {
            #expect(throws: WireError.self) { try Wire.decodeFields(bytes) }
        }
    }

    @Test("an error carries the request id of the message it is about")
    func errorCarriesRequest() {
        let json =
            #"{"type":"write","request":"r77","ops":[{"op":"create","collection":"a//b","fields":{},"idempotencyKey":"k"}]}"#
        #expect(
            throws: WireError(
                .invalidPath, "ops[0].collection: collection path 'a//b' has a segment 2 that is empty", request: "r77")
        ) {
            try Wire.decode(ClientMessage.self, from: Array(json.utf8))
        }
    }

    @Test(
        "an error in an element of a long list names the element and the member",
        arguments: [
            (
                #"{"type":"write","request":"r","ops":[\#(WireCases.op),{"op":"create","collection":"a","fields":{},"idempotencyKey":"k y"}]}"#,
                "bad-message: ops[1].idempotencyKey: idempotencyKey 'k y' contains ' '; allowed are letters, digits and - _ . ~ : @ +"
            ),
            (
                #"{"type":"write","request":"r","ops":[\#(WireCases.op),{"op":"update","collection":"a","fields":{},"idempotencyKey":"k"}]}"#,
                "bad-message: ops[1]: an update needs an id"
            ),
            (
                #"{"type":"write","request":"r","ops":[\#(WireCases.op),{"op":"delete","collection":"a","id":"..","idempotencyKey":"k"}]}"#,
                "invalid-path: ops[1].id: document id '..' may not be '.' or '..'"
            ),
            (#"{"type":"write","request":"r","ops":[\#(WireCases.op),7]}"#, "bad-message: ops[1]: expected an object"),
            (
                #"{"type":"snapshot","target":"t","resumeToken":"e.1","changes":[\#(WireCases.change("a")),\#(WireCases.change("b c"))]}"#,
                "invalid-path: changes[1].id: document id 'b c' contains ' '; allowed are letters, digits and - _ . ~ : @ +"
            ),
            (
                #"{"type":"ack","request":"r","results":[{"id":"a","version":1},{"id":"","version":1}]}"#,
                "invalid-path: results[1].id: document id '' is empty"
            ),
        ])
    func elementErrors(json: String, expected: String) {
        let bytes = Array(json.utf8)
        do throws(WireError) {
            if json.contains(#""type":"write""#) {
                _ = try Wire.decode(ClientMessage.self, from: bytes)
            } else {
                _ = try Wire.decode(ServerMessage.self, from: bytes)
            }
            Issue.record("decoded: \(json)")
        } catch {
            #expect("\(error.code.rawValue): \(error.message)" == expected)
        }
    }

    @Test("deep nesting is refused")
    func deepNesting() {
        let json =
            #"{"type":"write","request":"r","ops":[{"op":"create","collection":"a","idempotencyKey":"k","fields":{"x":"#
            + String(repeating: "[", count: 100_000) + "]}]}"
        #expect(throws: WireError.self) { try Wire.decode(ClientMessage.self, from: Array(json.utf8)) }
        let brackets = #"{"a":"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"]]"}"#
        #expect(throws: Never.self) { try Wire.decodeFields(Array(brackets.utf8)) }
    }
}

/// Well-formed list elements, for the cases that break the one after them.
enum WireCases {
    static let op = #"{"op":"create","collection":"a","fields":{"n":1},"idempotencyKey":"k1"}"#

    static func change(_ id: String) -> String {
        #"{"kind":"added","id":"\#(id)","version":1,"fields":{},"createTime":1,"updateTime":1,"deleted":false}"#
    }
}
