import Dispatch
import Foundation
import Logging
import Synchronization

/// Where the server's key set comes from, kept current: a file, read again when it changes,
/// or an identity provider's `https://` URL, fetched at start, cached, fetched again before
/// its `Cache-Control: max-age` runs out and when a token names a key the set lacks (at most
/// once a minute). A fetch or read that fails keeps the last good set, and says so in the log
/// and in `/metrics`.
public final class KeySetSource: Sendable {
    public enum Origin: Sendable, Equatable {
        case file(URL)
        /// An `https://` URL, and a certificate authority to trust for it (PEM), if not the system's.
        case url(URL, authority: String?)

        /// `FILE_OR_HTTPS_URL` as `--jwks` takes it; a plain `http://` URL is refused.
        public init(_ text: String, authority: String? = nil) throws(AccessError) {
            let lowered = text.lowercased()
            if lowered.hasPrefix("http://") {
                throw AccessError("--jwks \(text): keys are never taken over plain http://; use https://")
            }
            if lowered.hasPrefix("https://") {
                guard let url = URL(string: text), url.host?.isEmpty == false else {
                    throw AccessError("--jwks \(text) is not a URL")
                }
                self = .url(url, authority: authority)
            } else {
                guard authority == nil else { throw AccessError("--jwks-ca is for an https:// key set only") }
                self = .file(URL(fileURLWithPath: text))
            }
        }

        var name: String {
            switch self {
            case .file(let url): url.path
            case .url(let url, _): url.absoluteString
            }
        }
    }

    /// How a source behaves in time; tests shorten it.
    public struct Timing: Sendable {
        /// The refresh interval when the provider says no `max-age`.
        public var refresh: Duration = .seconds(15 * 60)
        /// Bounds on the provider's `max-age`.
        public var minimumRefresh: Duration = .seconds(60)
        public var maximumRefresh: Duration = .seconds(24 * 3600)
        /// The least time between two fetches made for unknown keys.
        public var unknownKeyInterval: Duration = .seconds(60)
        /// The wait before fetching again after a failure.
        public var retry: Duration = .seconds(30)
        public var fetchTimeout: Duration = .seconds(10)
        /// How often a key file's modification time is looked at.
        public var fileCheck: Duration = .seconds(1)

        public init() {}
    }

    /// What `/metrics` shows of the source.
    struct Health: Sendable {
        var keys = 0
        var failures = 0
        /// The last fetch or read failed: the set in use is the last good one.
        var stale = false
    }

    let origin: Origin
    let timing: Timing
    private let logger: Logger
    private let queue = DispatchQueue(label: "tandem.jwks")
    private let state: Mutex<State>

    private struct State {
        var keys: KeySet
        var health = Health()
        var fileStamp: FileStamp?
        var fileChecked: ContinuousClock.Instant?
        var lastUnknownKeyFetch: ContinuousClock.Instant?
        var timer: (any DispatchSourceTimer)?
        var stopped = false
    }

    private struct FileStamp: Equatable {
        var modified: Date?
        var size: Int?
    }

    /// Reads or fetches the key set once, before anything is verified with it.
    ///
    /// - Throws: ``AccessError`` when the first read or fetch fails: a server never starts
    ///   with no keys it was told to use.
    public init(_ origin: Origin, timing: Timing = Timing(), logger: Logger = Logger(label: "tandem.jwks"))
        throws(AccessError)
    {
        self.origin = origin
        self.timing = timing
        self.logger = logger
        let (keys, stamp, maxAge) = try Self.load(origin, timing: timing)
        for line in keys.skipped { logger.warning("key left out: \(line)") }
        var first = State(keys: keys)
        first.fileStamp = stamp
        first.fileChecked = .now
        first.health.keys = keys.count
        state = Mutex(first)
        if case .url = origin { schedule(after: refreshDelay(maxAge)) }
    }

    deinit { state.withLock { $0.timer?.cancel() } }

    /// Stops the periodic fetch.
    public func stop() {
        state.withLock { state in
            state.stopped = true
            state.timer?.cancel()
            state.timer = nil
        }
    }

    /// The key set to verify with now. A key file changed since it was last read is read
    /// again first (looked at once a ``Timing/fileCheck`` at most).
    public func keys() -> KeySet {
        guard case .file(let url) = origin else { return state.withLock { $0.keys } }
        let due = state.withLock { state -> Bool in
            guard let checked = state.fileChecked, ContinuousClock.now - checked < timing.fileCheck else {
                state.fileChecked = .now
                return true
            }
            return false
        }
        if due, Self.stamp(of: url) != state.withLock({ $0.fileStamp }) { reload() }
        return state.withLock { $0.keys }
    }

    var health: Health { state.withLock { $0.health } }

    /// A token named a key the set lacks: an identity provider that rotated its keys has the
    /// new one in its set already. Fetches the set again, at most once a
    /// ``Timing/unknownKeyInterval``, and calls `done` on a queue of the source's with whether
    /// it did (false: too soon, or not a URL; the token is refused as it is).
    public func refetchForUnknownKey(_ done: @escaping @Sendable (Bool) -> Void) {
        guard case .url = origin else { return done(false) }
        let allowed = state.withLock { state -> Bool in
            if let last = state.lastUnknownKeyFetch, ContinuousClock.now - last < timing.unknownKeyInterval {
                return false
            }
            state.lastUnknownKeyFetch = .now
            return true
        }
        guard allowed else { return done(false) }
        queue.async { [self] in
            reload()
            done(true)
        }
    }

    /// Reads or fetches the set again; a failure keeps the set in use.
    private func reload() {
        do {
            let (keys, stamp, maxAge) = try Self.load(origin, timing: timing)
            let previous = state.withLock { state -> [String] in
                defer {
                    state.keys = keys
                    state.fileStamp = stamp
                    state.health.keys = keys.count
                    state.health.stale = false
                }
                return state.keys.keyIds
            }
            if previous != keys.keyIds {
                logger.notice(
                    "key set \(origin.name) read: \(keys.count) key(s) [\(keys.keyIds.joined(separator: ", "))]")
            }
            for line in keys.skipped { logger.warning("key left out: \(line)") }
            if case .url = origin { schedule(after: refreshDelay(maxAge)) }
        } catch {
            let kept = state.withLock { state -> Int in
                state.health.failures += 1
                state.health.stale = true
                // A file that fails to read now is looked at again when it changes again.
                if case .file(let url) = origin { state.fileStamp = Self.stamp(of: url) }
                return state.keys.count
            }
            logger.error(
                "key set \(origin.name) could not be read; the last good set (\(kept) key(s)) stays in use: \(error.message)"
            )
            if case .url = origin { schedule(after: timing.retry) }
        }
    }

    private func refreshDelay(_ maxAge: Duration?) -> Duration {
        guard let maxAge else { return timing.refresh }
        return min(max(maxAge, timing.minimumRefresh), timing.maximumRefresh)
    }

    private func schedule(after delay: Duration) {
        state.withLock { state in
            guard !state.stopped else { return }
            state.timer?.cancel()
            let timer = DispatchSource.makeTimerSource(queue: queue)
            let nanoseconds = delay.components.seconds * 1_000_000_000 + delay.components.attoseconds / 1_000_000_000
            timer.schedule(deadline: .now() + .nanoseconds(Int(nanoseconds)))
            timer.setEventHandler { [weak self] in self?.reload() }
            timer.resume()
            state.timer = timer
        }
    }

    private static func load(_ origin: Origin, timing: Timing) throws(AccessError) -> (
        KeySet, FileStamp?, Duration?
    ) {
        switch origin {
        case .file(let url):
            let stamp = stamp(of: url)
            let bytes: Data
            do { bytes = try Data(contentsOf: url) } catch {
                throw AccessError("cannot read \(url.path): \(error.localizedDescription)")
            }
            return (try KeySet(parsing: bytes, source: url.path), stamp, nil)
        case .url(let url, let authority):
            let response: HTTPSFetch.Response
            do { response = try HTTPSFetch.get(url, trusting: authority, timeout: timing.fetchTimeout) } catch {
                throw AccessError("fetching \(url.absoluteString): \(error)")
            }
            guard response.status == 200 else {
                throw AccessError("fetching \(url.absoluteString): HTTP \(response.status)")
            }
            return (try KeySet(parsing: response.body, source: url.absoluteString), nil, response.maxAge)
        }
    }

    private static func stamp(of url: URL) -> FileStamp {
        let attributes = try? FileManager.default.attributesOfItem(atPath: url.path)
        return FileStamp(
            modified: attributes?[.modificationDate] as? Date, size: (attributes?[.size] as? NSNumber)?.intValue)
    }
}
