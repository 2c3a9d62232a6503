import Foundation
import TandemTesting
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
}
