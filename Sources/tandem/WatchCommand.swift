import ArgumentParser
import Foundation
import Synchronization
import TandemClient
import TandemWire

struct WatchCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Print every change to a collection as it happens, until interrupted.",
        discussion: """
            One line per change: added|modified|deleted ID VERSION JSON. Progress goes to \
            standard error: when the watcher is up to date, and the resume token to pass to \
            --since to continue where you stopped.

            When the server goes away (restarted, killed, the network lost), the watcher \
            reconnects with backoff and resumes from its last token, so it prints every change \
            once: none missed, none twice. It stops on a permanent error (a refused token, a \
            collection it may not read) or when interrupted.

            With --where, --order-by or --limit the watcher follows a query: it prints the \
            documents the query selects, in its order, one line per change to that view: \
            added|modified|removed ID VERSION OLD NEW JSON, where OLD and NEW are the document's \
            positions before and after the change (-1 for none). A document that stops matching, \
            or is pushed out by the limit, is removed from the view though it still exists.

            Examples:
              tandem watch notes
              tandem watch notes --since Xk29fQ01ab.42
              tandem watch accounts --where 'members array-contains "alice"' --where 'amount < 0' \
                --order-by date:desc --limit 20
            """)

    @Argument(help: "The collection path.")
    var collection: String

    @Option(help: "A resume token: print only what changed after it.")
    var since: String?

    @Option(
        name: .customLong("where"),
        help: ArgumentHelp(
            "A filter, FIELD OP VALUE, the value in JSON: 'amount < 0', 'members array-contains \"alice\"', "
                + "'status in [\"open\",\"late\"]'. Repeat for several (all must hold).",
            valueName: "filter"))
    var filters: [String] = []

    @Option(help: ArgumentHelp("Order by FIELD or FIELD:desc; repeat for several.", valueName: "field[:desc]"))
    var orderBy: [String] = []

    @Option(help: "Show at most this many documents.")
    var limit: Int?

    @OptionGroup var options: ClientOptions

    func validate() throws {
        _ = try parseCollection(collection)
        _ = try query()
    }

    /// The query the options describe, or nil when there is none.
    func query() throws -> Query? {
        guard !filters.isEmpty || !orderBy.isEmpty || limit != nil else { return nil }
        if let limit, limit < 1 { throw ValidationError("--limit must be at least 1") }
        let filters = try self.filters.map { text throws -> Query.Filter in
            let parts = text.split(separator: " ", maxSplits: 2, omittingEmptySubsequences: true)
            let operators = Query.Filter.Operator.allCases.map(\.rawValue).joined(separator: ", ")
            guard parts.count == 3, let op = Query.Filter.Operator(rawValue: String(parts[1])) else {
                throw ValidationError("--where '\(text)': expected FIELD OP VALUE, with OP one of \(operators)")
            }
            let value: JSONValue
            do { value = try Wire.parse(Array(parts[2].utf8)) } catch {
                throw ValidationError(
                    "--where '\(text)': the value must be JSON (strings in double quotes: \"alice\"); \((error as? WireError)?.message ?? "\(error)")"
                )
            }
            if op.takesList, value.arrayValue?.isEmpty != false {
                throw ValidationError(
                    "--where '\(text)': \(op.rawValue) takes a non-empty JSON array, like [\"a\",\"b\"]")
            }
            do { return Query.Filter(try FieldPath(String(parts[0])), op, value) } catch {
                throw ValidationError("--where '\(text)': \((error as? WireError)?.message ?? "\(error)")")
            }
        }
        let orders = try orderBy.map { text throws -> Query.Order in
            let parts = text.split(separator: ":", maxSplits: 1).map(String.init)
            guard parts.count == 1 || ["asc", "desc"].contains(parts[1]) else {
                throw ValidationError("--order-by '\(text)': expected FIELD, FIELD:asc or FIELD:desc")
            }
            do { return Query.Order(try FieldPath(parts[0]), descending: parts.count == 2 && parts[1] == "desc") } catch
            {
                throw ValidationError("--order-by '\(text)': \((error as? WireError)?.message ?? "\(error)")")
            }
        }
        return Query(filters: filters, orderBy: orders, limit: limit)
    }

    /// Why a connection's watch ended. Each connection attempt has its own number, so that
    /// the news of an earlier one is not taken for the current one's.
    private enum Ending: Sendable {
        case lost(attempt: Int, String)
        /// The pause before the next attempt is over.
        case retry(attempt: Int)
        case refused(String)
        case interrupted
    }

    func run() async throws {
        let path = try parseCollection(collection)
        let query = try self.query()
        let progress = WatchProgress(token: since)
        let clientId = "cli-watch-\(DocumentID.random().rawValue.prefix(6))"
        let (endings, ending) = AsyncStream.makeStream(of: Ending.self)
        let interrupt = Task {
            _ = await Signals.wait(for: [SIGINT, SIGTERM])
            ending.yield(.interrupted)
        }
        defer { interrupt.cancel() }

        // The first connection must succeed: a wrong URL or token is said at once.
        var attempt = 0
        var connection: ServerConnection? = try await options.connect(
            clientId: clientId, onClose: { event in ending.yield(.lost(attempt: 0, "\(event)")) })
        var backoff = Duration.milliseconds(250)
        var failure: String?
        loop: while true {
            if let current = connection {
                let token = progress.token
                current.listen(
                    to: path, resumeToken: token, query: query, view: query != nil && token != nil ? progress.view : nil
                ) { event in
                    switch event {
                    case .snapshot(let snapshot):
                        for change in snapshot.changes {
                            let document = change.document
                            if let old = change.oldIndex, let new = change.newIndex {
                                emit(
                                    "\(change.kind) \(document.id) \(document.version) \(old) \(new) \(json(document.fields))"
                                )
                            } else {
                                emit("\(change.kind) \(document.id) \(document.version) \(json(document.fields))")
                            }
                        }
                        progress.take(snapshot, isQuery: query != nil)
                        if snapshot.initial && !snapshot.hasMore {
                            note("# up to date at token \(snapshot.resumeToken)")
                        }
                    case .reset(let reason):
                        progress.reset()
                        note("# reset: \(reason)")
                    case .error(let error):
                        ending.yield(.refused("cannot watch \(path): \(error.message)"))
                    }
                }
            }
            // Wait for this connection (or this attempt's pause) to end.
            let pause = backoff
            let current = attempt
            let wait: Task<Void, Never>? =
                connection == nil
                ? Task {
                    try? await Task.sleep(for: pause)
                    ending.yield(.retry(attempt: current))
                } : nil
            var next: Ending = .interrupted
            for await end in endings {
                switch end {
                case .lost(let from, _) where from != current || connection == nil: continue
                case .retry(let from) where from != current || connection != nil: continue
                default: next = end
                }
                break
            }
            wait?.cancel()
            switch next {
            case .interrupted:
                break loop
            case .refused(let message):
                failure = message
                break loop
            case .lost(_, let reason):
                note("# connection lost (\(reason)); reconnecting")
                connection?.close()
                connection = nil
                backoff = .milliseconds(250)
                attempt += 1
                continue loop
            case .retry:
                break
            }
            // Reconnect, backing off up to 5 s, until the server is back or a refusal is final.
            attempt += 1
            let number = attempt
            // The next node, when there are several.
            let url = options.servers[attempt % options.servers.count]
            do {
                connection = try await ServerConnection.connect(
                    to: url, clientId: clientId, token: options.token,
                    trustedCertificates: options.trustedCertificates, timeout: .seconds(options.timeout),
                    onClose: { event in ending.yield(.lost(attempt: number, "\(event)")) })
                note("# reconnected to \(url); resuming from \(progress.token ?? "the start")")
            } catch let error as TandemError where error.serverError?.code.isRejection == true {
                failure = ClientOptions.explain(error)
                break loop
            } catch {
                backoff = min(backoff * 2, .seconds(5))
            }
        }
        connection?.close()
        if let token = progress.token { note("# resume with --since \(token)") }
        if let failure { throw CLIError(failure) }
    }
}

/// The last resume token seen, written on the connection's queue and read at the end.
/// Where the watcher is: the last token, and for a query the ids of the view as its changes
/// placed them (sent when it resumes, so that the server sends only what changed; nil until
/// the watcher knows the whole view).
private final class WatchProgress: Sendable {
    private let state: Mutex<(token: String?, view: [DocumentID]?)>
    init(token: String?) { state = Mutex((token, nil)) }

    var token: String? { state.withLock { $0.token } }
    var view: [DocumentID]? { state.withLock { $0.view } }

    /// Takes in a snapshot. A query's token is kept only with its last frame (all frames of
    /// one snapshot carry the same token): a watcher cut off between frames resumes from the
    /// token before, with the view as far as it got.
    func take(_ snapshot: ServerMessage.Snapshot, isQuery: Bool) {
        state.withLock { state in
            if isQuery {
                var view = state.view ?? []
                for change in snapshot.changes {
                    if let old = change.oldIndex, old >= 0, old < view.count { view.remove(at: old) }
                    if let new = change.newIndex, new >= 0, new <= view.count {
                        view.insert(change.document.id, at: new)
                    }
                }
                state.view = view
                if snapshot.hasMore { return }
            }
            state.token = snapshot.resumeToken
        }
    }

    /// After a reset, the whole view comes again.
    func reset() { state.withLock { $0.view = nil } }
}
