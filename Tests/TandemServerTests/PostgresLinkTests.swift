import Foundation
import TandemTesting
import Testing

@testable import TandemServer
@testable import TandemServerPostgres

/// A cut network link must be found by TCP, in seconds, and a loaded database must not look
/// like a cut link: the settings that promise it, read back from the socket's options.
@Suite("PostgreSQL connections: a cut link is found by TCP, a slow database is waited for")
struct PostgresLinkTests {
    @Test("a TCP connection asks the kernel for tcp_user_timeout and keepalives; settings in the URL win")
    func linkSettings() async throws {
        let cluster = try await PostgresCluster.shared()
        let database = try await onOwnThread { try cluster.createDatabase() }
        defer { cluster.dropDatabase(url: database) }
        let name = try #require(PostgresCluster.databaseName(of: database))
        let url = cluster.tcpURL(database: name, address: "127.0.0.1")

        // A connection is used by one thread; each is opened, read and closed on one here.
        let (defaults, deadline) = try await onOwnThread { () -> ([Int32?], Duration) in
            let connection = try PostgresConnection(url: url)
            defer { connection.close() }
            try connection.query("SELECT 1")
            return (Self.linkOptions(connection.socket), connection.timeout)
        }
        #expect(deadline == .seconds(30), "a statement may take long on a loaded machine")
        // tcp_user_timeout (ms), SO_KEEPALIVE, keepalives_idle, _interval, _count
        #expect(defaults == [5000, 1, 5, 1, 3])
        let own = try await onOwnThread { () -> [Int32?] in
            let connection = try PostgresConnection(url: url + "?tcp_user_timeout=1500&keepalives_idle=30")
            defer { connection.close() }
            return Self.linkOptions(connection.socket)
        }
        #expect(own == [1500, 1, 30, 1, 3])
    }

    @Test("a statement that outlasts the deadline fails as a lost connection, and the connection is closed")
    func deadline() async throws {
        let cluster = try await PostgresCluster.shared()
        let database = try await onOwnThread { try cluster.createDatabase() }
        defer { cluster.dropDatabase(url: database) }
        let (error, stillOpen) = try await onOwnThread { () -> (PostgresError?, Bool) in
            // Connected with the usual deadline (a loaded machine may take long), then shortened.
            let connection = try PostgresConnection(url: database)
            connection.timeout = .milliseconds(300)
            defer { connection.close() }
            do {
                try connection.query("SELECT pg_sleep(3)")
                return (nil, connection.isOpen)
            } catch {
                return (error as? PostgresError, connection.isOpen)
            }
        }
        #expect(error?.isConnectionFailure == true, "\(String(describing: error))")
        #expect(error.map { "\($0)" }?.contains("did not answer within 0.3 seconds") == true)
        #expect(!stillOpen)
    }

    @Test("the server's statement deadline is its configuration's postgresTimeout")
    func configuredDeadline() async throws {
        let cluster = try await PostgresCluster.shared()
        let database = try await onOwnThread { try cluster.createDatabase() }
        defer { cluster.dropDatabase(url: database) }
        let server = try await TestServer { configuration in
            configuration.storage = .postgres(url: database)
            configuration.postgresTimeout = .seconds(7)
        }
        defer { server.stopWithoutWaiting() }
        let store = try #require(server.server.core.store as? PostgresStore)
        #expect(store.timeout == .seconds(7))
    }

    private static func linkOptions(_ socket: Int32) -> [Int32?] {
        [
            option(socket, Int32(IPPROTO_TCP), TCP_USER_TIMEOUT), option(socket, SOL_SOCKET, SO_KEEPALIVE),
            option(socket, Int32(IPPROTO_TCP), TCP_KEEPIDLE), option(socket, Int32(IPPROTO_TCP), TCP_KEEPINTVL),
            option(socket, Int32(IPPROTO_TCP), TCP_KEEPCNT),
        ]
    }

    private static func option(_ socket: Int32, _ level: Int32, _ name: Int32) -> Int32? {
        var value: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(socket, level, name, &value, &length) == 0 else { return nil }
        return value
    }
}
