import Foundation
import TandemClient
import TandemServer
import TandemTesting
import TandemWire
import Testing

/// One hostile or broken input and what the protocol says must happen.
struct BadInput: Sendable, CustomTestStringConvertible {
    enum Expected: Sendable {
        /// An error frame with this code; the connection stays open.
        case error(ErrorCode, mentioning: String)
        /// The connection is closed with this status.
        case close(UInt16)
    }

    var name: String
    var helloFirst = true
    var frames: [(RawWebSocket.Opcode, [UInt8])]
    var expected: Expected

    var testDescription: String { name }

    static func text(_ name: String, _ json: String, hello: Bool = true, _ expected: Expected) -> BadInput {
        BadInput(name: name, helloFirst: hello, frames: [(.text, Array(json.utf8))], expected: expected)
    }
}

let badInputs: [BadInput] = [
    .text("malformed JSON", #"{"type":"write","#, .error(.badMessage, mentioning: "not valid JSON")),
    .text("not an object", #"[1,2,3]"#, .error(.badMessage, mentioning: "expected")),
    .text("unknown message type", #"{"type":"subscribe"}"#, .error(.badMessage, mentioning: "unknown message type")),
    .text("missing fields", #"{"type":"write","request":"r1"}"#, .error(.badMessage, mentioning: "ops: missing")),
    .text(
        "invalid path",
        #"{"type":"write","request":"r1","ops":[{"op":"create","collection":"notes/x","fields":{},"idempotencyKey":"k"}]}"#,
        .error(.invalidPath, mentioning: "even number of segments")),
    .text(
        "id with SQL and path characters",
        #"{"type":"get","request":"r1","collection":"notes","id":"x'; DROP TABLE document;--"}"#,
        .error(.invalidPath, mentioning: "contains")),
    .text(
        "write to a document that does not exist",
        #"{"type":"write","request":"r1","ops":[{"op":"update","collection":"notes","id":"ghost","fields":{"a":1},"idempotencyKey":"k"}]}"#,
        .error(.notFound, mentioning: "does not exist")),
    .text(
        "document over the size limit",
        #"{"type":"write","request":"r1","ops":[{"op":"create","collection":"notes","fields":{"blob":""#
            + String(repeating: "x", count: 5000)
            + #""},"idempotencyKey":"k"}]}"#,
        .error(.tooLarge, mentioning: "the limit is 4096")),
    .text(
        "more ops than allowed",
        #"{"type":"write","request":"r1","ops":["#
            + Array(repeating: #"{"op":"create","collection":"notes","fields":{},"idempotencyKey":"k"}"#, count: 11)
            .joined(separator: ",")
            + "]}",
        .error(.tooLarge, mentioning: "at most 10 ops")),
    .text(
        "a message before hello", #"{"type":"listen","target":"t","collection":"notes"}"#, hello: false,
        .error(.badMessage, mentioning: "send hello first")),
    .text(
        "an unsupported protocol version", #"{"type":"hello","protocol":99,"clientId":"c"}"#, hello: false,
        .error(.unsupportedProtocol, mentioning: "protocol 1")),
    .text(
        "a second hello", #"{"type":"hello","protocol":1,"clientId":"c"}"#, .error(.badMessage, mentioning: "already")),
    .text(
        "a huge number",
        #"{"type":"write","request":"r1","ops":[{"op":"create","collection":"notes","fields":{"n":1e99999},"idempotencyKey":"k"}]}"#,
        .error(.badMessage, mentioning: "")),
    .text(
        "deeply nested JSON",
        #"{"type":"write","request":"r1","ops":[{"op":"create","collection":"notes","fields":{"n":"#
            + String(repeating: "[", count: 5000) + "]}}]}",
        .error(.badMessage, mentioning: "nested deeper")),
    BadInput(
        name: "binary frame", frames: [(.binary, [0x7B, 0x7D])],
        expected: .error(.badMessage, mentioning: "binary frames")),
    BadInput(
        name: "oversize message", frames: [(.text, Array(repeating: 0x20, count: 70_000))], expected: .close(1009)),
    BadInput(name: "invalid UTF-8", frames: [(.text, [0x22, 0xFF, 0xFE, 0x22])], expected: .close(1007)),
]

@Suite("Bad input: documented errors, nothing stored, other clients unaffected")
struct BadInputTests {
    /// A raw connection that said hello and read its welcome.
    @Test("each bad input gets its documented answer", arguments: badInputs)
    func badInput(_ input: BadInput) async throws {
        let server = try await TestServer { configuration in
            configuration.limits = Limits(
                maxMessageBytes: 64 << 10, maxOpsPerWrite: 10, maxListenersPerConnection: 5, maxDocumentBytes: 4096)
        }
        let bystander = try await connect(server)
        let bystanderFeed = Feed()
        bystander.listen(to: try path("notes"), handler: bystanderFeed.handler)
        try await waitUntil("the bystander is current") { bystanderFeed.isCurrent }

        let raw = try await RawWebSocket.open(
            port: server.port, hello: input.helloFirst ? #"{"type":"hello","protocol":1,"clientId":"raw"}"# : nil)
        if input.helloFirst {
            #expect(try await raw.readText().contains(#""type":"welcome""#))
        }
        for (opcode, payload) in input.frames {
            try await raw.write(RawWebSocket.frame(opcode: opcode, payload: payload))
        }

        switch input.expected {
        case .error(let code, let fragment):
            let reply = try await raw.readText()
            guard case .error(let error) = try Wire.decode(ServerMessage.self, from: Array(reply.utf8)) else {
                Issue.record("expected an error, got \(reply)")
                return
            }
            #expect(error.code == code, "\(reply)")
            #expect(fragment.isEmpty || error.message.contains(fragment), "\(error.message)")
            // The connection stays usable.
            if !input.helloFirst && code != .unsupportedProtocol {
                try raw.send(text: #"{"type":"hello","protocol":1,"clientId":"raw"}"#)
                _ = try await raw.readText()
            } else if code == .unsupportedProtocol {
                try raw.send(text: #"{"type":"hello","protocol":1,"clientId":"raw"}"#)
                #expect(try await raw.readText().contains("welcome"))
            }
            try raw.send(text: #"{"type":"get","request":"after","collection":"notes","id":"nope"}"#)
            let after = try await raw.readText()
            #expect(after.contains(#""request":"after""#), "\(after)")
        case .close(let status):
            let close = try await raw.readClose()
            #expect(close.closeCode == status)
        }

        // Nothing was stored, and the server still serves others.
        #expect(try await server.server.documents(in: try path("notes")).isEmpty)
        _ = try await bystander.create("notes", ["still": "serving"])
        try await waitUntil("the bystander hears its own write") { bystanderFeed.changes.count == 1 }
    }

    @Test("a consumer that stops reading is disconnected after the stall time without stalling the other listeners")
    func slowConsumer() async throws {
        let server = try await TestServer { configuration in
            configuration.maxQueuedBytesPerConnection = 256 << 10
            configuration.stallTimeout = 2
        }
        let healthy = try await connect(server)
        let healthyFeed = Feed()
        healthy.listen(to: try path("firehose"), handler: healthyFeed.handler)

        let stalled = try await RawWebSocket.open(
            port: server.port, receiveBufferSize: 4096, hello: #"{"type":"hello","protocol":1,"clientId":"stalled"}"#)
        try stalled.send(text: #"{"type":"listen","target":"t","collection":"firehose"}"#)
        try await waitUntil("both listen") { await server.server.stats.liveListeners == 2 && healthyFeed.isCurrent }

        let writer = try await connect(server)
        let blob = JSONValue.string(String(repeating: "x", count: 8 << 10))
        var written = 0
        while await server.server.stats.connections == 3 && written < 2000 {
            let ops = try (0..<20).map { _ in
                WriteOp.create(in: try path("firehose"), fields: ["blob": blob], idempotencyKey: key())
            }
            _ = try await writer.write(ops)
            written += 20
        }
        // Its listener fell behind, and nothing more was queued for it; after the stall time it
        // is closed. The close frame cannot reach a peer that does not read: libwebsockets gives
        // up on flushing it after its own timeout, then the connection is gone.
        try await waitUntil("the stalled consumer is dropped") { await server.server.stats.connections == 2 }
        try await waitUntil("the healthy listener has every change") { healthyFeed.changes.count == written }
        _ = stalled
    }

    @Test("a flood of tiny frames is answered in order without unbounded queueing")
    func flood() async throws {
        let server = try await TestServer()
        let raw = try await welcomedRawSocket(on: server, as: "flood")
        // Made on a thread of its own, as the million fragments below: seconds of work in a debug
        // build that would otherwise hold a thread of the pool every test shares.
        let frames = try await onOwnThread {
            (0..<20_000).flatMap { index in
                RawWebSocket.frame(
                    opcode: .text,
                    payload: Array(#"{"type":"get","request":"\#(index)","collection":"c","id":"x"}"#.utf8))
            }
        }
        try await raw.write(frames)
        let replies = try await raw.readTexts(20_000)
        for (index, reply) in replies.enumerated() where !reply.contains(#""request":"\#(index)""#) {
            Issue.record("reply \(index) out of order: \(reply.prefix(120))")
            break
        }
        #expect(await server.server.stats.connections == 1)
    }

    /// The server decodes a large message off its core queue and a small one on it; the
    /// small get right behind a large write must still wait for it.
    @Test("a get sent right behind a large write is answered after it, and finds its document")
    func largeThenSmall() async throws {
        let server = try await TestServer()
        let raw = try await welcomedRawSocket(on: server, as: "mixed")
        let blob = String(repeating: "x", count: 200_000)
        let frames = (0..<10).flatMap { index in
            let write =
                #"{"type":"write","request":"w\#(index)","ops":[{"op":"create","collection":"c","id":"d\#(index)","#
                + #""fields":{"blob":"\#(blob)"},"idempotencyKey":"k\#(index)"}]}"#
            let get = #"{"type":"get","request":"g\#(index)","collection":"c","id":"d\#(index)"}"#
            return RawWebSocket.frame(opcode: .text, payload: Array(write.utf8))
                + RawWebSocket.frame(opcode: .text, payload: Array(get.utf8))
        }
        try await raw.write(frames)
        let replies = try await raw.readTexts(20)
        for (index, reply) in replies.enumerated() {
            let request = index % 2 == 0 ? "w\(index / 2)" : "g\(index / 2)"
            #expect(reply.contains(#""request":"\#(request)""#), "reply \(index): \(reply.prefix(120))")
            #expect(!reply.contains(#""type":"error""#), "reply \(index): \(reply.prefix(120))")
        }
    }

    @Test("a message sent as a million one-byte fragments is put together and answered")
    func millionFragments() async throws {
        let server = try await TestServer()
        let raw = try await welcomedRawSocket(on: server, as: "fragments")
        let wire = try await onOwnThread {
            let message = Array(#"{"type":"get","request":"whole","collection":"c","id":"x"}"#.utf8)
            let padded = message + Array(repeating: UInt8(ascii: " "), count: 1_000_000 - message.count)
            var wire: [UInt8] = []
            wire.reserveCapacity(padded.count * 7)
            for (index, byte) in padded.enumerated() {
                wire += RawWebSocket.frame(
                    opcode: index == 0 ? .text : .continuation, payload: [byte], fin: index == padded.count - 1)
            }
            return wire
        }
        try await raw.write(wire)
        let reply = try await raw.readText(timeout: .seconds(60))
        #expect(reply.contains(#""request":"whole""#), "\(reply.prefix(200))")
    }

    @Test("a connection that opens and never says hello is closed with 1008")
    func silentConnection() async throws {
        let server = try await TestServer { $0.helloTimeout = .seconds(3) }  // the client below must make it
        let silent = try await RawWebSocket.open(port: server.port)
        let close = try await silent.readClose(timeout: .seconds(10))
        #expect(close.closeCode == 1008)
        #expect(close.closeReason.contains("no hello"))
        try await waitUntil("the server forgot it") { await server.server.stats.connections == 0 }
        // A client that does speak in time is served.
        let client = try await connect(server)
        client.close()
    }
}
