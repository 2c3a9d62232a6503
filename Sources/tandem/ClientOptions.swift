import ArgumentParser
import Foundation
import TandemClient
import TandemWire

/// Options every client command takes.
struct ClientOptions: ParsableArguments {
    @Option(
        name: .long,
        help: "The server's URL, or several nodes' URLs separated by commas, tried in turn (or set TANDEM_SERVER).")
    var server: String = ProcessInfo.processInfo.environment["TANDEM_SERVER"] ?? "ws://127.0.0.1:7878"

    @Option(
        name: .customLong("ca"),
        help: "For wss:// servers: a PEM file of the certificate authorities to trust (default: the system's).")
    var trustedCertificates: String?

    /// The nodes to try, in order.
    var servers: [String] {
        server.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
    }

    @Option(name: .customLong("token"), help: "A bearer token for servers with access control (or set TANDEM_TOKEN).")
    var tokenOption: String?

    /// `--token`, else `TANDEM_TOKEN`.
    var token: String? { tokenOption ?? ProcessInfo.processInfo.environment["TANDEM_TOKEN"] }

    @Option(name: .long, help: "Seconds to wait for the server.")
    var timeout: Int = 10

    func validate() throws {
        guard !servers.isEmpty else { throw ValidationError("--server needs a URL, like ws://127.0.0.1:7878") }
        for url in servers where !(url.hasPrefix("ws://") || url.hasPrefix("wss://")) {
            throw ValidationError("--server must be a ws:// or wss:// URL, like ws://127.0.0.1:7878; got '\(url)'")
        }
        if let trustedCertificates, !FileManager.default.isReadableFile(atPath: trustedCertificates) {
            throw ValidationError("--ca: cannot read '\(trustedCertificates)'")
        }
        guard timeout > 0 else { throw ValidationError("--timeout must be at least 1 second") }
    }

    /// Connects to the first node that answers, turning failures into one line that says what
    /// to do.
    ///
    /// - Parameter startingAt: Which node to try first (the others follow, round robin).
    func connect(
        clientId: String = "cli-\(DocumentID.random().rawValue.prefix(8))", startingAt first: Int = 0,
        onClose: (@Sendable (TransportClose) -> Void)? = nil
    ) async throws -> ServerConnection {
        var last: TandemError?
        for offset in 0..<servers.count {
            let url = servers[(first + offset) % servers.count]
            do {
                return try await ServerConnection.connect(
                    to: url, clientId: clientId, token: token, trustedCertificates: trustedCertificates,
                    timeout: .seconds(timeout), onClose: onClose)
            } catch let error as TandemError {
                // A refusal (a bad token) is the same on every node: say it at once.
                if error.serverError?.code.isRejection == true { throw CLIError(Self.explain(error)) }
                last = error
            }
        }
        throw CLIError(Self.explain(last ?? TandemError(.unreachable, "no server to connect to")))
    }

    /// A connection failure as one line that says what to do about it.
    static func explain(_ error: TandemError) -> String {
        if error.code == .unreachable && error.message.contains("TLS handshake") {
            return "\(error.message). Pass --ca FILE with the authority that signed the server's certificate."
        }
        if error.code == .unreachable || error.code == .timedOut {
            return "\(error.message). Is `tandem serve` running? Pass --server URL to use another server."
        }
        if error.serverError?.code == .unauthenticated {
            return "\(error.message). Pass --token TOKEN or set TANDEM_TOKEN to a token of the server's token file."
        }
        return error.message
    }
}

/// A failure to report as one line, with a non-zero exit.
struct CLIError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Parses a collection path argument.
func parseCollection(_ text: String) throws -> CollectionPath {
    do { return try CollectionPath(text) } catch { throw ValidationError(error.message) }
}

/// Parses `COLLECTION/ID`.
func parseDocumentPath(_ text: String) throws -> (CollectionPath, DocumentID) {
    guard let slash = text.lastIndex(of: "/") else {
        throw ValidationError("'\(text)' is not COLLECTION/ID, like notes/a1B2c3")
    }
    do {
        return (try CollectionPath(String(text[..<slash])), try DocumentID(String(text[text.index(after: slash)...])))
    } catch {
        throw ValidationError(error.message)
    }
}

/// Parses a JSON object argument.
func parseFields(_ text: String) throws -> JSONObject {
    do {
        return try Wire.decodeFields(Array(text.utf8))
    } catch {
        throw ValidationError("the fields must be a JSON object, like '{\"title\":\"Rent\"}': \(error.message)")
    }
}

/// Canonical one-line JSON of a value.
func json(_ value: some JSONWritable) -> String {
    String(decoding: Wire.encodeCanonical(value), as: UTF8.self)
}

/// Writes a line to standard output at once (unbuffered), so that pipes see it as it happens.
func emit(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

/// Prints a line to standard error.
func note(_ line: String) {
    FileHandle.standardError.write(Data((line + "\n").utf8))
}

extension ServerConnection.WriteReply {
    /// The results, or a one-line error for a conflict.
    func results(_ what: String) throws -> [WriteResult] {
        switch self {
        case .ack(let results): return results
        case .conflict(_, let server):
            if server.deleted { throw CLIError("\(what): the document was deleted (version \(server.version))") }
            throw CLIError("\(what): the document changed meanwhile (now version \(server.version)); try again")
        }
    }
}

/// Runs a server request, turning server errors into one line.
func request<T>(_ what: String, _ body: () async throws -> T) async throws -> T {
    do {
        return try await body()
    } catch let error as TandemError {
        throw CLIError("\(what): \(error.message)")
    }
}
