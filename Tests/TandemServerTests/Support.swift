import Foundation
import Synchronization
import TandemClient
import TandemServer
import TandemTesting
import TandemWire

/// Collects what a listener hears.
final class Feed: Sendable {
    private let events = Mutex<[ServerConnection.ListenEvent]>([])

    var handler: @Sendable (ServerConnection.ListenEvent) -> Void {
        { [self] event in events.withLock { $0.append(event) } }
    }

    var snapshots: [ServerMessage.Snapshot] {
        events.withLock { $0.compactMap { if case .snapshot(let s) = $0 { s } else { nil } } }
    }

    /// Every change received, in order.
    var changes: [Change] { snapshots.flatMap(\.changes) }

    /// (kind, id, version) of every change, for compact expectations.
    var summary: [String] { changes.map { "\($0.kind) \($0.document.id) v\($0.document.version)" } }

    var resets: [String] {
        events.withLock { $0.compactMap { if case .reset(let r) = $0 { r } else { nil } } }
    }

    var errors: [WireError] {
        events.withLock { $0.compactMap { if case .error(let e) = $0 { e } else { nil } } }
    }

    /// True once the initial load finished (a snapshot with initial and no more pages).
    var isCurrent: Bool { snapshots.contains { $0.initial && !$0.hasMore } }

    var lastToken: String? { snapshots.last?.resumeToken }
}

/// A clock the test moves by hand (milliseconds since 1970).
final class ManualServerClock: Sendable {
    let now = Mutex<Int64>(1_763_683_200_000)
    func advance(by milliseconds: Int64) { now.withLock { $0 += milliseconds } }
    var read: @Sendable () -> Int64 { { [self] in now.withLock { $0 } } }
}

func path(_ string: String) throws -> CollectionPath { try CollectionPath(string) }

func key() -> ClientName { try! ClientName(UUID().uuidString) }

extension ServerConnection {
    /// Creates a document and returns its result; fails the test on anything but an ack.
    func create(_ collection: String, _ fields: JSONObject, id: String? = nil) async throws -> WriteResult {
        let reply = try await write([
            .create(
                in: try CollectionPath(collection), id: try id.map(DocumentID.init), fields: fields,
                idempotencyKey: key())
        ])
        guard case .ack(let results) = reply else { throw TestFailure("create was refused: \(reply)") }
        return results[0]
    }

    func update(_ collection: String, _ id: DocumentID, _ fields: JSONObject, base: Int64?) async throws -> WriteReply {
        try await write([
            .update(
                in: try CollectionPath(collection), id: id, fields: fields, baseVersion: base, idempotencyKey: key())
        ])
    }

    func delete(_ collection: String, _ id: DocumentID, base: Int64? = nil) async throws -> WriteReply {
        try await write([.delete(in: try CollectionPath(collection), id: id, baseVersion: base, idempotencyKey: key())])
    }
}

struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// A raw WebSocket to a test server that said `hello` as `clientId` and read the `welcome`.
func welcomedRawSocket(on server: TestServer, as clientId: String) async throws -> RawWebSocket {
    let raw = try await RawWebSocket.open(
        port: server.port, hello: #"{"type":"hello","protocol":1,"clientId":"\#(clientId)"}"#)
    _ = try await raw.readText()
    return raw
}

/// Connects a protocol client to a test server.
func connect(_ server: TestServer, as clientId: String = "client-\(UUID().uuidString.prefix(6))") async throws
    -> ServerConnection
{
    // A generous bound on progress: on a busy machine a handshake can take seconds.
    try await ServerConnection.connect(to: server.url, clientId: clientId, timeout: .seconds(60))
}
