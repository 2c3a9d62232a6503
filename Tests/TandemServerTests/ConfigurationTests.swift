import Foundation
import TandemServer
import TandemTesting
import Testing

/// A setting the server cannot run with, and what its refusal must say.
struct BadSetting: Sendable, CustomTestStringConvertible {
    var testDescription: String
    var mentioning: String
    var change: @Sendable (inout ServerConfiguration) -> Void
}

let badSettings = [
    BadSetting(testDescription: "port", mentioning: "between 0 and 65535") { $0.port = 70_000 },
    BadSetting(testDescription: "admin token", mentioning: "must not be empty") { $0.adminToken = "" },
    BadSetting(testDescription: "limits", mentioning: "messages at least 1 KiB") { $0.limits.maxMessageBytes = 10 },
    BadSetting(testDescription: "snapshot page bytes", mentioning: "snapshotPageBytes 100") {
        $0.snapshotPageBytes = 100
    },
    BadSetting(testDescription: "snapshot page size", mentioning: "snapshotPageSize 0") { $0.snapshotPageSize = 0 },
    BadSetting(testDescription: "body budget", mentioning: "must hold at least one import") {
        $0.maxHTTPBodyBytesInFlight = 1 << 20
    },
    BadSetting(testDescription: "handshakes", mentioning: "maxHandshakes must be at least 1") { $0.maxHandshakes = 0 },
    BadSetting(testDescription: "stall timeout", mentioning: "stallTimeout must be at least 1") { $0.stallTimeout = 0 },
    BadSetting(testDescription: "commit outcome timeout", mentioning: "commitOutcomeTimeout must not be negative") {
        $0.commitOutcomeTimeout = .seconds(-1)
    },
]

/// A configuration the server cannot run with is refused at start, with what was wrong.
@Suite("Server configuration")
struct ConfigurationTests {
    @Test("a setting out of range is refused with a message that names it", arguments: badSettings)
    func refused(_ setting: BadSetting) async throws {
        let folder = try TemporaryDirectory()
        var configuration = ServerConfiguration(dataDirectory: folder.url)
        configuration.port = 0
        setting.change(&configuration)
        do {
            let server = try TandemServer(configuration: configuration)
            await server.shutdown()
            Issue.record("started with a bad \(setting.testDescription)")
        } catch {
            #expect(error.code == .invalidConfiguration)
            #expect(error.message.contains(setting.mentioning), "\(error.message)")
        }
    }
}
