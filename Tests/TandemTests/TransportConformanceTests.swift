import TandemClient
import TandemTesting
import Testing

/// Tandem's own transport passes the suite every other transport must pass.
@Suite("Transport conformance: libwebsockets")
struct TransportConformanceTests {
    @Test(arguments: TransportConformance.checks)
    func libWebSockets(_ check: TransportConformance.Check) async throws {
        try await check.run(on: LibWebSocketsTransport())
    }
}
