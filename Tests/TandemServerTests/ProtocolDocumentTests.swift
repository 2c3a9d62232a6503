import Foundation
import TandemServer
import TandemTesting
import TandemWire
import Testing

/// The examples of docs/PROTOCOL.md, checked against a real server: the document is the
/// test's input, so the two cannot drift apart.
@Suite("docs/PROTOCOL.md's examples are what the server says")
struct ProtocolDocumentTests {
    static let document = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("docs/PROTOCOL.md")

    /// A row of a tested table: the cells, without the outer pipes, trimmed.
    static func rows(after marker: String) throws -> [[String]] {
        let text = try String(contentsOf: document, encoding: .utf8)
        let lines = text.components(separatedBy: "\n")
        let start = try #require(lines.firstIndex(of: "<!-- tested: \(marker) -->"), "no table marked \(marker)")
        return lines[(start + 1)...].prefix { $0.hasPrefix("|") }.dropFirst(2).map { line in
            line.dropFirst().dropLast().components(separatedBy: " | ").map {
                $0.trimmingCharacters(in: .whitespaces)
            }
        }
    }

    /// The text between the first and the last backtick of a cell.
    static func code(_ cell: String) -> String {
        guard let first = cell.firstIndex(of: "`"), let last = cell.lastIndex(of: "`"), first < last else {
            return cell
        }
        return String(cell[cell.index(after: first)..<last])
    }

    @Test("every row of the error examples is answered word for word")
    func errorExamples() async throws {
        let rows = try Self.rows(after: "ProtocolDocumentTests.errorExamples")
        #expect(rows.count >= 10)
        let server = try await TestServer()
        var mismatches: [String] = []
        for row in rows {
            let beforeHello = row[0].hasPrefix("before hello:")
            let message = Self.code(row[0])
            let expectedCode = Self.code(String(row[1].prefix { $0 != ":" }))
            let expectedText = String(row[1].drop { $0 != ":" }.dropFirst().drop { $0 == " " })

            let socket = try await RawWebSocket.open(
                port: server.port, hello: beforeHello ? nil : #"{"type":"hello","protocol":1,"clientId":"doc"}"#)
            if !beforeHello {
                _ = try await socket.readText()
            }
            try socket.send(text: message)
            let answer = try Wire.decode(ServerMessage.self, from: Array(try await socket.readText().utf8))
            guard case .error(let error) = answer else {
                mismatches.append("\(message): answered \(answer)")
                continue
            }
            if error.code.rawValue != expectedCode || error.message != expectedText {
                mismatches.append("| `\(message)` | `\(error.code)`: \(error.message) |")
            }
        }
        #expect(
            mismatches.isEmpty, "rows that differ, as the server answers them:\n\(mismatches.joined(separator: "\n"))")
    }

    @Test("the rules-file example error is the one the server prints")
    func rulesFileExample() throws {
        let rows = try Self.rows(after: "ProtocolDocumentTests.rulesFileExample")
        #expect(!rows.isEmpty)
        for row in rows {
            let rules = Self.code(row[0])
            let expected = Self.code(row[1])
            do {
                _ = try AccessControl(tokens: nil, rules: (rules, "rules.json"))
                Issue.record("accepted: \(rules)")
            } catch {
                #expect(error.message == expected, "the server prints: \(error.message)")
            }
        }
    }

    @Test("a document's fields read the same in get, snapshot and conflict: keys sorted at every level")
    func oneOrderOfFields() async throws {
        let server = try await TestServer()
        let raw = try await welcomedRawSocket(on: server, as: "order")
        let fields = #"{"b":1,"a":2,"c":{"z":1,"y":2},"d":[{"q":1,"p":2}]}"#
        let sorted = #"{"a":2,"b":1,"c":{"y":2,"z":1},"d":[{"p":2,"q":1}]}"#
        try raw.send(
            text:
                #"{"type":"write","request":"w","ops":[{"op":"create","collection":"c","id":"d1","fields":\#(fields),"idempotencyKey":"k1"}]}"#
        )
        _ = try await raw.readText()
        try raw.send(text: #"{"type":"get","request":"g","collection":"c","id":"d1"}"#)
        let got = try await raw.readText()
        try raw.send(
            text:
                #"{"type":"write","request":"w2","ops":[{"op":"create","collection":"c","id":"d1","fields":{},"idempotencyKey":"k2"}]}"#
        )
        let conflict = try await raw.readText()
        try raw.send(text: #"{"type":"listen","target":"t","collection":"c"}"#)
        let snapshot = try await raw.readText()
        for (name, message) in [("document", got), ("conflict", conflict), ("snapshot", snapshot)] {
            #expect(message.contains(#""fields":\#(sorted)"#), "\(name): \(message)")
        }
    }
}
