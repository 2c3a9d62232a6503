import Foundation
import Synchronization
import TandemClient
import TandemServer
import TandemTesting
import TandemWire
import Testing

/// A burst of large commits, with a listener that reads as fast as it can and one that stops
/// reading: the first must get everything on its open connection, the second is closed only
/// once it has taken nothing for the stall time, and resumes.
@Suite("A burst of large writes", .serialized)
struct BurstTests {
    /// What a listener has heard, and whether its connection closed.
    final class Heard: Sendable {
        private let state = Mutex<(ids: [DocumentID], token: String?, closes: [String])>(([], nil, []))

        func snapshot(_ snapshot: ServerMessage.Snapshot) {
            state.withLock { state in
                state.ids += snapshot.changes.map(\.document.id)
                state.token = snapshot.resumeToken
            }
        }
        func closed(_ close: TransportClose) { state.withLock { $0.closes.append("\(close)") } }
        var ids: [DocumentID] { state.withLock { $0.ids } }
        var token: String? { state.withLock { $0.token } }
        var closes: [String] { state.withLock { $0.closes } }
    }

    final class WrittenIDs: Sendable {
        private let ids = Mutex<[DocumentID]>([])
        func append(_ id: DocumentID) { ids.withLock { $0.append(id) } }
        var all: [DocumentID] { ids.withLock { $0 } }
    }

    @Test(
        "a thousand 1 MiB writes: a listener reading at full speed gets each change once, never closed; a paused one is closed after the stall time and resumes"
    )
    func thousandLargeWrites() async throws {
        let stall: UInt16 = 3
        let server = try await TestServer { configuration in
            configuration.limits.maxDocumentBytes = 1 << 20
            configuration.stallTimeout = stall
        }
        let burst = try path("burst")

        let fast = Heard()
        let reader = try await ServerConnection.connect(
            to: server.url, clientId: "fast", timeout: .seconds(60), onClose: fast.closed)
        reader.listen(to: burst) { event in if case .snapshot(let snapshot) = event { fast.snapshot(snapshot) } }

        // The paused listener reads its first snapshot and then nothing (a small receive buffer,
        // so that it stops taking bytes soon).
        let paused = try await RawWebSocket.open(
            port: server.port, receiveBufferSize: 4096, hello: #"{"type":"hello","protocol":1,"clientId":"paused"}"#)
        _ = try await paused.readText()
        try paused.send(text: #"{"type":"listen","target":"t","collection":"burst"}"#)
        let first = try await paused.readText()
        let pausedToken = try #require(
            first.firstMatch(of: /"resumeToken":"([^"]+)"/).map { String($0.1) }, "\(first.prefix(200))")
        try await waitUntil("both listen") { await server.server.stats.liveListeners == 2 }
        let stoppedReading = ContinuousClock.now

        // Eight writers, each sending its 125 creates of 1 MiB eight at a time without waiting
        // for each answer: the server takes them in large group commits, and every feed round
        // after them has a page of 1 MiB for each listener. (Each is short of 1 MiB by what its write
        // and its snapshot add, so that both fit in a frame of the default limit, 1 MiB.)
        let blob = JSONValue.string(String(repeating: "x", count: (1 << 20) - 1024))
        let written = WrittenIDs()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for writer in 0..<8 {
                group.addTask {
                    let connection = try await ServerConnection.connect(
                        to: server.url, clientId: "writer-\(writer)", timeout: .seconds(60))
                    defer { connection.close() }
                    // Eight on their way at a time: the client's own send queue holds 16 MiB.
                    var answers: [ServerConnection.PendingWrite] = []
                    for n in 0..<125 {
                        answers.append(
                            connection.startWrite(
                                [
                                    .create(
                                        in: burst, fields: ["n": .int(Int64(writer * 1000 + n)), "blob": blob],
                                        idempotencyKey: try ClientName("w\(writer)-\(n)"))
                                ], timeout: .seconds(300)))
                        guard answers.count == 8 || n == 124 else { continue }
                        for answer in answers {
                            let reply = try await onOwnThread { try answer.wait().get() }
                            guard case .ack(let results) = reply else { throw TestFailure("refused: \(reply)") }
                            written.append(results[0].id)
                        }
                        answers = []
                    }
                }
            }
            try await group.waitForAll()
        }
        let all = Set(written.all)
        #expect(all.count == 1000)

        try await waitUntil("the fast listener has every change", timeout: .seconds(300)) {
            Set(fast.ids) == all || !fast.closes.isEmpty
        }
        #expect(fast.closes.isEmpty, "the fast listener was closed: \(fast.closes)")
        #expect(fast.ids.count == 1000, "each change once: \(fast.ids.count) changes for 1000 documents")

        // The paused one: closed (1008) once it took nothing for the stall time, not before.
        try await waitUntil("the paused listener is closed", timeout: .seconds(120)) {
            await server.server.stats.connections == 1
        }
        let closedAfter = ContinuousClock.now - stoppedReading
        #expect(closedAfter >= .seconds(Int(stall)), "closed after \(closedAfter)")

        // It resumes from its token and gets the rest, each once.
        let resumed = Heard()
        let again = try await ServerConnection.connect(to: server.url, clientId: "paused", timeout: .seconds(60))
        again.listen(to: burst, resumeToken: pausedToken) { event in
            if case .snapshot(let snapshot) = event { resumed.snapshot(snapshot) }
        }
        try await waitUntil("the resumed listener has every change", timeout: .seconds(300)) {
            Set(resumed.ids) == all
        }
        #expect(resumed.ids.count == 1000)
        _ = paused
    }
}
