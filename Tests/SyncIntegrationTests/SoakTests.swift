import TandemScenarios
import Foundation
import TandemClient
import TandemServer
import TandemServerPostgres
import TandemTesting
import TandemWire
import Testing

@Suite("Soak: failures of every kind at once")
struct SoakTests {
    @Test("a short soak (300 operations, one SIGKILL of the server) keeps every promise")
    func shortSoak() async throws {
        var options = SoakOptions()
        options.operations = 300
        options.serverRestarts = 1
        options.seed = 11
        let result = try await SoakScenario.run(options)
        #expect(result.report.isConverged, "\(result.report.firstDifferences)")
        #expect(result.lostWrites.isEmpty, "\(result.lostWrites.prefix(3))")
        #expect(result.duplicates.isEmpty, "\(result.duplicates.prefix(3))")
        #expect(result.resurrected.isEmpty, "\(result.resurrected.prefix(3))")
        #expect(result.readYourWritesViolations.isEmpty, "\(result.readYourWritesViolations.prefix(3))")
        #expect(result.restarts == 1)
        #expect(result.acknowledgedWrites > 0)
    }

    @Test(
        "a short cluster soak (three nodes over PostgreSQL, a node SIGKILL, a PostgreSQL restart) keeps every promise")
    func shortClusterSoak() async throws {
        var options = SoakOptions()
        options.operations = 300
        options.nodes = 3
        options.nodeRestarts = 1
        options.postgresRestarts = 1
        options.serverRestarts = 0
        options.seed = 12
        let result = try await SoakScenario.run(options)
        #expect(result.report.isConverged, "\(result.report.firstDifferences)")
        #expect(result.lostWrites.isEmpty, "\(result.lostWrites.prefix(3))")
        #expect(result.duplicates.isEmpty, "\(result.duplicates.prefix(3))")
        #expect(result.resurrected.isEmpty, "\(result.resurrected.prefix(3))")
        #expect(result.readYourWritesViolations.isEmpty, "\(result.readYourWritesViolations.prefix(3))")
        #expect(result.restarts == 1)
        #expect(result.postgresRestarts == 1)
        #expect(result.acknowledgedWrites > 0)
    }

    @Test(
        "a cluster soak on a database other nodes serve, with another client's documents in it, keeps every promise; one on the soak's own collections is refused"
    )
    func clusterSoakBesideOtherNodes() async throws {
        let cluster = try await PostgresCluster.shared()
        let url = try await onOwnThread { try cluster.createDatabase() }
        // Two nodes of a deployment on the same database, written to by another client.
        var others: [TestServer] = []
        for index in 0..<2 {
            others.append(
                try await TestServer { configuration in
                    configuration.storage = .postgres(url: url)
                    configuration.nodeName = "other-\(index)"
                })
        }
        let client = try await ServerConnection.connect(to: others[0].url, clientId: "other-client")
        for n in 0..<6 {
            _ = try await client.write([
                WriteOp.create(
                    in: try CollectionPath("rs3589d0"), fields: ["n": .int(Int64(n))], idempotencyKey: .random())
            ])
        }
        client.close()

        var options = SoakOptions()
        options.operations = 200
        options.nodes = 3
        options.nodeRestarts = 1
        options.serverRestarts = 0
        options.postgresURL = url
        options.seed = 8080
        let result = try await SoakScenario.run(options)
        #expect(result.passed, "\(result.firstDivergence ?? "") \(result.diagnosis)")
        #expect(result.report.isConverged, "\(result.report.firstDifferences)")
        #expect(result.keptFolder == nil)

        // A second soak on the same database would meet the first one's book: refused, saying why.
        let error = await #expect(throws: ScenarioError.self) { try await SoakScenario.run(options) }
        #expect(
            error?.description.contains("already holds the soak's collections") == true, "\(String(describing: error))")
        for node in others { await node.stop() }
    }
}
