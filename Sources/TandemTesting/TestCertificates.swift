import Foundation

/// A certificate authority made at test time with `openssl`, and a server certificate it
/// signed for `localhost` and `127.0.0.1`: what TLS tests need, and nothing committed.
///
/// For example:
///
/// ```swift
/// let certificates = try TestCertificates()
/// let server = try await TestServer { $0.tls = certificates.serverFiles }
/// let connection = try await ServerConnection.connect(
///     to: server.url, clientId: "c", trustedCertificates: certificates.authority.path)
/// ```
public struct TestCertificates: Sendable {
    public let folder: URL
    /// The authority's certificate (PEM): what a client trusts.
    public var authority: URL { folder.appendingPathComponent("ca.pem") }
    public var certificate: URL { folder.appendingPathComponent("server.pem") }
    public var privateKey: URL { folder.appendingPathComponent("server.key") }
    private let keep: TemporaryDirectory

    /// - Parameters:
    ///   - names: The server certificate's subject alternative names, in openssl's form.
    ///   - authority: Another set whose authority signs this server certificate (its
    ///     ``authority`` is then this one's too); nil for an authority of its own.
    public init(names: String = "DNS:localhost,IP:127.0.0.1", signedBy authority: TestCertificates? = nil) throws {
        keep = try TemporaryDirectory(prefix: "tandem-tls")
        folder = keep.url
        let subjectNames = folder.appendingPathComponent("names.cnf")
        try "subjectAltName=\(names)\n".write(to: subjectNames, atomically: true, encoding: .utf8)
        if let authority {
            for file in ["ca.pem", "ca.key"] {
                try FileManager.default.copyItem(
                    at: authority.folder.appendingPathComponent(file), to: folder.appendingPathComponent(file))
            }
        }
        let makeAuthority: [[String]] = [
            [
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
                "-subj", "/CN=Tandem Test Authority",
            ]
        ]
        let steps: [[String]] =
            (authority == nil ? makeAuthority : []) + [
                [
                    "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
                    "-subj", "/CN=localhost",
                ],
                [
                    "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                    "-out", "server.pem", "-days", "2", "-extfile", "names.cnf",
                ],
            ]
        for arguments in steps {
            let process = ChildProcess()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
            process.arguments = arguments
            process.currentDirectoryURL = folder
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            try process.run()
            process.waitUntilExit()
            guard process.terminationStatus == 0 else {
                throw HarnessError(
                    "openssl \(arguments.prefix(2).joined(separator: " ")) failed; is openssl installed?")
            }
        }
    }
}
