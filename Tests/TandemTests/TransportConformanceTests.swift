import TandemClient
import TandemSocket
import TandemTesting
import Testing

/// Tandem's own transport passes the suite every other transport must pass, on both of its
/// client paths: Tandem's own framing on a raw socket (plain `ws://`, the default), and
/// libwebsockets' WebSocket client (which `wss://` uses; the TLS tests run Tandem over it).
@Suite("Transport conformance: libwebsockets")
struct TransportConformanceTests {
    @Test(arguments: TransportConformance.checks)
    func libWebSockets(_ check: TransportConformance.Check) async throws {
        try await check.run(on: LibWebSocketsTransport())
    }

    @Test(arguments: TransportConformance.checks)
    func libWebSocketsClient(_ check: TransportConformance.Check) async throws {
        var configuration = WebSocketConfiguration()
        configuration.ownClientFraming = false
        let client = try WebSocketClient(configuration: configuration)
        defer { client.shutdownWithoutWaiting() }
        try await check.run(on: LibWebSocketsTransport(client: client))
    }
}
