import ArgumentParser
import Foundation
import Synchronization
import Tandem
import TandemWire

struct WatchCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Print every change to a collection as it happens, until interrupted.",
        discussion: """
            One line per change: added|modified|deleted ID VERSION JSON. The resume token goes \
            to standard error; pass it to --since to continue where you stopped.

            Examples:
              tandem watch notes
              tandem watch notes --since Xk29fQ01ab.42
            """)

    @Argument(help: "The collection path.")
    var collection: String

    @Option(help: "A resume token: print only what changed after it.")
    var since: String?

    @OptionGroup var options: ClientOptions

    func validate() throws { _ = try parseCollection(collection) }

    func run() async throws {
        let path = try parseCollection(collection)
        let progress = WatchProgress(token: since)
        let (endings, ending) = AsyncStream.makeStream(of: String?.self)

        let connection = try await ServerConnection.connect(
            to: options.server, clientId: "cli-watch-\(DocumentID.random().rawValue.prefix(6))", token: options.token,
            timeout: .seconds(options.timeout),
            onClose: { event in ending.yield("connection lost: \(event)") }
        )
        connection.listen(to: path, resumeToken: since) { event in
            switch event {
            case .snapshot(let snapshot):
                for change in snapshot.changes {
                    let document = change.document
                    emit("\(change.kind) \(document.id) \(document.version) \(json(document.fields))")
                }
                progress.token = snapshot.resumeToken
                if snapshot.initial && !snapshot.hasMore {
                    note("# up to date at token \(snapshot.resumeToken)")
                }
            case .reset(let reason):
                note("# reset: \(reason)")
            case .error(let error):
                ending.yield("cannot watch \(path): \(error.message)")
            }
        }
        let interrupt = Task {
            _ = await Signals.wait(for: [SIGINT, SIGTERM])
            ending.yield(nil)
        }
        var failure: String?
        for await end in endings {
            failure = end
            break
        }
        interrupt.cancel()
        connection.close()
        if let token = progress.token { note("# resume with --since \(token)") }
        if let failure { throw CLIError(failure) }
    }
}

/// The last resume token seen, written on the connection's queue and read at the end.
private final class WatchProgress: Sendable {
    private let state: Mutex<String?>
    init(token: String?) { state = Mutex(token) }
    var token: String? {
        get { state.withLock { $0 } }
        set { state.withLock { $0 = newValue } }
    }
}
