import TandemClient
import TandemTesting
import Testing

/// The SwiftNIO transport, Apple platforms' default, passes the suite every transport must
/// pass, over `ws://` and over `wss://` (where it must also refuse what it should not trust).
@Suite("Transport conformance: SwiftNIO", .serialized)
struct NIOTransportTests {
    @Test(arguments: TransportConformance.checks)
    func plain(_ check: TransportConformance.Check) async throws {
        try await check.run(on: try NIOWebSocketTransport())
    }

    @Test(arguments: TransportConformance.checks + TransportConformance.tlsChecks)
    func overTLS(_ check: TransportConformance.Check) async throws {
        let certificates = try await onOwnThread { try TestCertificates() }
        let transport = try NIOWebSocketTransport(trustedCertificates: certificates.authority.path)
        try await check.run(on: transport, tls: certificates)
    }
}
