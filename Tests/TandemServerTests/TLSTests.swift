import Foundation
import TandemClient
import TandemServer
import TandemTesting
import TandemWire
import Testing

/// One at a time: each TLS context libwebsockets 4.1 makes disturbs TLS handshakes under way in
/// other contexts of the process (see ServiceLoop), and these tests make several.
@Suite("TLS", .serialized)
struct TLSTests {
    @Test("a client that trusts the test authority syncs over wss://; one that does not is refused with a clear error")
    func trustedAndUntrusted() async throws {
        let certificates = try await onOwnThread { try TestCertificates() }
        let server = try await TestServer { configuration in
            configuration.tls = .init(certificate: certificates.certificate, privateKey: certificates.privateKey)
        }
        #expect(server.url.hasPrefix("wss://"))
        let trusting = try await ServerConnection.connect(
            to: server.url, clientId: "trusting", trustedCertificates: certificates.authority.path)
        let created = try await trusting.create("notes", ["over": "tls"])
        let feed = Feed()
        trusting.listen(to: try path("notes"), handler: feed.handler)
        try await waitUntil("the snapshot arrives over TLS") { feed.changes.count == 1 }
        #expect(feed.changes.first?.document.id == created.id)

        do {
            let refused = try await ServerConnection.connect(to: server.url, clientId: "stranger")
            refused.close()
            Issue.record("a client without the authority connected")
        } catch let error as TandemError {
            #expect(error.code == .unreachable)
            #expect(error.message.contains("TLS handshake"), "\(error.message)")
            #expect(error.message.contains("not trusted"), "\(error.message)")
        }
        // A plain ws:// client is not served on a TLS port.
        await #expect(throws: TandemError.self) {
            _ = try await ServerConnection.connect(
                to: server.url.replacingOccurrences(of: "wss://", with: "ws://"), clientId: "plain",
                timeout: .seconds(5))
        }
    }

    @Test("devices sync through a TLS server when given the authority")
    func devicesOverTLS() async throws {
        let certificates = try await onOwnThread { try TestCertificates() }
        let server = try await TestServer { configuration in
            configuration.tls = .init(certificate: certificates.certificate, privateKey: certificates.privateKey)
        }
        let devices = try ["phone", "laptop"].map { name in
            try TestDevice(name: name, serverURL: server.url) { $0.trustedCertificates = certificates.authority.path }
        }
        for device in devices { device.service.start() }
        let account = try await devices[0].addAccount("Household")
        try await devices[0].addEntry("Rent", amount: -100, account: account.id!)
        let report = try await Convergence.waitUntilQuiet(server: server, devices: devices)
        #expect(report.isConverged, "\(report.firstDifferences)")
        #expect(try await devices[1].entries().count == 1)
    }

    @Test(
        "a server with a token file on a non-loopback address refuses to start without TLS, unless told plaintext is fine"
    )
    func plaintextRefused() async throws {
        let access = try SampleAccess.control()
        let folder = try TemporaryDirectory()
        var configuration = ServerConfiguration(dataDirectory: folder.url)
        configuration.host = "0.0.0.0"
        configuration.port = 0
        configuration.access = access
        do {
            let server = try TandemServer(configuration: configuration)
            await server.shutdown()
            Issue.record("started without TLS")
        } catch {
            #expect(error.code == .invalidConfiguration)
            #expect(error.message.contains("in the clear"), "\(error.message)")
            #expect(error.message.contains("--allow-plaintext"), "\(error.message)")
        }
        configuration.allowsPlaintext = true
        let server = try TandemServer(configuration: configuration)
        await server.shutdown()
        let certificates = try await onOwnThread { try TestCertificates() }
        configuration.allowsPlaintext = false
        configuration.tls = .init(certificate: certificates.certificate, privateKey: certificates.privateKey)
        let secure = try TandemServer(configuration: configuration)
        await secure.shutdown()
    }
}
