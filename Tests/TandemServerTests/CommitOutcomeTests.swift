import Foundation
import Synchronization
import TandemClient
import TandemServer
import TandemServerPostgres
import TandemTesting
import TandemWire
import Testing

/// A commit whose answer is lost: the store's connection cut while `COMMIT` is on its way
/// (PostgreSQL), or the log's sync failing (SQLite). The server never answers what it does not
/// know: it finds out from the idempotency record, or says `outcome-unknown`.
@Suite("A commit whose answer is lost", .serialized)
struct CommitOutcomeTests {
    /// One cut, at the next commit.
    final class OneCut: Sendable {
        private let cut: Mutex<StoreCut?>
        init(_ cut: StoreCut) { self.cut = Mutex(cut) }
        @Sendable func next() -> StoreCut? { cut.withLock { $0.take() } }
        var done: Bool { cut.withLock { $0 == nil } }
    }

    /// A server on a database of its own in the shared throwaway PostgreSQL cluster, whatever
    /// the run's store, with the cut at its next commit.
    private func postgresServer(cutting cut: OneCut) async throws -> (TestServer, String) {
        let cluster = try await PostgresCluster.shared()
        let url = try await onOwnThread { try cluster.createDatabase() }
        let server = try await TestServer { configuration in
            configuration.storage = .postgres(url: url)
            configuration.hooks.cutsStoreAtCommit = cut.next
        }
        return (server, url)
    }

    /// How many commits in doubt the server found `found` (`/metrics`); nil over TLS, where
    /// the tests speak no plain HTTP.
    private func commitsInDoubt(_ server: TestServer, found: String) async throws -> Int? {
        guard !TestServer.usesTLS else { return nil }
        let text = try await HTTPGet.fetch(port: server.port, path: "/metrics").body
        let prefix = #"tandem_commits_in_doubt_total{found="\#(found)"} "#
        let line = text.split(separator: "\n").first { $0.hasPrefix(prefix) }
        return line.flatMap { Int($0.dropFirst(prefix.count)) } ?? 0
    }

    @Test(
        "PostgreSQL: a write whose COMMIT went out before the connection was cut is acknowledged as committed; one cut before it is applied again; neither is answered 'internal'",
        arguments: [StoreCut.afterCommitSent, .beforeCommitSent])
    func postgresCommitCut(_ where: StoreCut) async throws {
        let cut = OneCut(`where`)
        let (server, _) = try await postgresServer(cutting: cut)
        let connection = try await connect(server, as: "phone")
        let ops = [WriteOp.create(in: try path("notes"), fields: ["t": "rent"], idempotencyKey: key())]
        let reply = try await connection.write(ops, timeout: .seconds(60))
        #expect(cut.done, "the commit was cut")
        guard case .ack(let first) = reply else { throw TestFailure("expected an ack, got \(reply)") }

        // Committed once: the resend under the same key gets the same answer, and one document.
        guard case .ack(let again) = try await connection.write(ops) else { throw TestFailure("resend refused") }
        #expect(again == first)
        let stored = try await server.server.documents(in: try path("notes"))
        #expect(stored.map(\.id) == [first[0].id])
        #expect(stored.first?.updateTime == first[0].updateTime)
        let found = `where` == .afterCommitSent ? "committed" : "not-committed"
        if let count = try await commitsInDoubt(server, found: found) { #expect(count == 1, "found \(found)") }
    }

    @Test("PostgreSQL: writes sent while a commit is in doubt are answered after it, in order, each once")
    func laterWritesWait() async throws {
        let cut = OneCut(.afterCommitSent)
        let (server, _) = try await postgresServer(cutting: cut)
        let connection = try await connect(server, as: "phone")
        let notes = try path("notes")
        // Sent together: the first group's commit is cut, the rest waits behind it.
        let pending = (0..<20).map { n in
            connection.startWrite(
                [.create(in: notes, fields: ["n": .int(Int64(n))], idempotencyKey: try! ClientName("k\(n)"))],
                timeout: .seconds(60))
        }
        var ids: [DocumentID] = []
        for answer in pending {
            let reply = try await onOwnThread { try answer.wait().get() }
            guard case .ack(let results) = reply else { throw TestFailure("expected an ack, got \(reply)") }
            ids.append(results[0].id)
        }
        #expect(cut.done)
        let stored = try await server.server.documents(in: notes)
        #expect(Set(stored.map(\.id)) == Set(ids))
        #expect(stored.count == 20)
    }

    @Test(
        "SQLite: a write whose log sync failed is found not committed and applied again, once",
        .enabled(if: TestServer.storeKind == "sqlite"))
    func sqliteSyncFailsOnce() async throws {
        FailingDisk.install()
        let server = try await TestServer()
        defer { FailingDisk.heal(FailingDisk.log(of: server)) }
        let connection = try await connect(server, as: "phone")
        FailingDisk.failSyncs(ofFileEndingWith: FailingDisk.log(of: server), count: 1)
        let ops = [WriteOp.create(in: try path("notes"), fields: ["t": "rent"], idempotencyKey: key())]
        let reply = try await connection.write(ops, timeout: .seconds(60))
        #expect(FailingDisk.failedSyncs(ofFileEndingWith: FailingDisk.log(of: server)) == 1, "the commit's sync failed")
        guard case .ack(let first) = reply else { throw TestFailure("expected an ack, got \(reply)") }
        if let count = try await commitsInDoubt(server, found: "not-committed") { #expect(count == 1) }

        // What a restart finds: the write once, as acknowledged.
        connection.close()
        try await server.restart()
        let stored = try await server.server.documents(in: try path("notes"))
        #expect(stored.map(\.id) == [first[0].id])
        let reconnected = try await connect(server, as: "phone")
        guard case .ack(let again) = try await reconnected.write(ops) else { throw TestFailure("resend refused") }
        #expect(again == first)
    }

    @Test(
        "SQLite: a write whose commit cannot be made durable in time is answered 'outcome-unknown'; its resend settles it",
        .enabled(if: TestServer.storeKind == "sqlite"))
    func sqliteSyncKeepsFailing() async throws {
        FailingDisk.install()
        let server = try await TestServer { $0.commitOutcomeTimeout = .milliseconds(500) }
        defer { FailingDisk.heal(FailingDisk.log(of: server)) }
        let connection = try await connect(server, as: "phone")
        FailingDisk.failSyncs(ofFileEndingWith: FailingDisk.log(of: server), count: nil)
        let ops = [WriteOp.create(in: try path("notes"), fields: ["t": "rent"], idempotencyKey: key())]
        let error = await #expect(throws: TandemError.self) { try await connection.write(ops, timeout: .seconds(60)) }
        #expect(error?.serverError?.code == .outcomeUnknown, "\(String(describing: error))")
        #expect(error?.serverError?.request != nil)
        if let count = try await commitsInDoubt(server, found: "unknown") { #expect(count == 1) }

        FailingDisk.heal(FailingDisk.log(of: server))
        guard case .ack(let results) = try await connection.write(ops) else { throw TestFailure("resend refused") }
        let stored = try await server.server.documents(in: try path("notes"))
        #expect(stored.map(\.id) == [results[0].id])
    }
}
