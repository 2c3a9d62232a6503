import Foundation
import GRDB
import Synchronization
import Tandem
import TandemTesting
import TandemWire

/// Collects what a hook sees, for tests to wait on.
final class Seen<Value: Sendable>: Sendable {
    private let values = Mutex<[Value]>([])
    func append(_ value: Value) { values.withLock { $0.append(value) } }
    var all: [Value] { values.withLock { $0 } }
    var count: Int { values.withLock { $0.count } }
}

extension TestDevice {
    /// Waits until the service is connected and its listeners are up to date.
    func waitUntilConnected() async throws {
        try await waitUntil("\(name) is connected") { service.status.isConnected }
    }

    func accountCount() throws -> Int {
        try database.read { db in try CashFlow.Account.fetchCount(db) }
    }
}

extension ServerMessage.Snapshot {
    func contains(_ id: DocumentID) -> Bool { changes.contains { $0.document.id == id } }
}

/// The documents of a collection on the server.
func serverDocuments(_ server: TestServer, _ collection: String) throws -> [Document] {
    try server.server.documents(in: try CollectionPath(collection))
}
