import Logging
import TandemClient

/// How a ``SyncService`` pushes, retries and resolves conflicts.
///
/// For example:
///
/// ```swift
/// var configuration = SyncConfiguration()
/// configuration.pushDelay = .zero          // push as soon as a local change commits
/// configuration.pushInterval = .seconds(10)
/// ```
public struct SyncConfiguration: Sendable {
    /// How often dirty rows are pushed even if nothing new was written. Default: 30 s.
    public var pushInterval: Duration = .seconds(30)
    /// How long after a local change the push starts, so that a burst of writes goes out in
    /// one batch. Zero pushes at once. Default: 50 ms.
    public var pushDelay: Duration = .milliseconds(50)
    /// The most ops in one `write` message (the server's own limit applies too). Default: 500.
    public var maxBatchSize = 500
    /// How many `write` messages of a push may await their answers at once: the next batches
    /// are prepared and sent while the server applies the ones before. Default: 4.
    ///
    /// The pipeline's depth bounds a push at `writesInFlight × maxBatchSize` ops per round trip
    /// (4 × 500 over a 50 ms link: 40,000 ops/s), and on a fast link keeps the server busy while
    /// the device writes answers back. A dropped connection resends what was on its way, under
    /// the same keys.
    public var writesInFlight = 4
    /// Failed attempts (timeouts, dropped connections, server errors) after which a row is
    /// `failed` and no longer pushed until ``SyncService/retryFailed()``. Refusals that cannot
    /// succeed (`permission-denied`, `invalid-path`, `too-large`) fail a row at once.
    /// Default: 5.
    public var maxAttempts = 5
    /// How long to wait for the server's answer to a write. Default: 30 s.
    public var requestTimeout: Duration = .seconds(30)
    /// Reconnection backoff: the first delay, doubled after each failure up to the cap, with
    /// random jitter of up to half the delay. Defaults: 250 ms, 30 s.
    public var reconnectDelay: Duration = .milliseconds(250)
    public var maxReconnectDelay: Duration = .seconds(30)
    /// How conflicts are settled. Default: ``ConflictPolicy/lastWriteWins``.
    public var conflictPolicy = ConflictPolicy.lastWriteWins
    /// Whether listener changes wait for pushes (see ``Serialization``). Default: `.barrier`;
    /// the other mode exists only to show the race Tandem prevents (`tandem demo`, race
    /// tests), so it is behind the `Testing` SPI.
    @_spi(Testing) public var serialization = Serialization.barrier
    /// Whether the listeners also hear this device's own writes back from the server on the
    /// connection that made them. Default: false (`excludeOwnWrites`), live and in the
    /// catch-up after a push of what was written offline: the `ack` told the device all of
    /// it, and an echo cost a download, a decode and a lookup per document. A device still
    /// hears them after a reconnect, and while it resumes an interrupted reset, where the
    /// barrier keeps them from being inserted twice.
    /// Tests turn them on to race them; `.unserialized` always hears them (the race it shows
    /// is theirs).
    @_spi(Testing) public var receivesOwnWrites = false
    /// How long the resume token of a snapshot that brings nothing else (the one after each
    /// push) may be kept before it is stored; stored sooner at every listener refresh (a new
    /// connection, a parent row changed) and when the service stops (see
    /// ``SyncService/stop(discardingQueuedWork:)``). Tests lengthen it to see the tokens kept.
    @_spi(Testing) public var tokenStoreDelay = Duration.seconds(1)
    /// The clock for `updatedAt`.
    public var clock: any SyncClock = SystemClock()
    /// Points where a test holds or watches the engine; empty in production, and behind the
    /// `Testing` SPI (`@_spi(Testing) import Tandem`, as TandemTesting does).
    @_spi(Testing) public var hooks = SyncHooks()
    /// The WebSocket client the service connects with (see `WebSocketTransport`); by default
    /// `LibWebSocketsTransport`, on an event loop shared by the process. Required where no
    /// target links libwebsockets (iOS): without it, connecting fails with `.invalidArgument`.
    public var transport: (any WebSocketTransport)?
    /// A bearer token for servers with access control.
    public var token: String?
    /// Where tokens come from when they expire: the app's sign-in (a JWT from its identity
    /// provider). Asked before each connect and, on an open connection, ``tokenRefreshMargin``
    /// before the current token's `exp` (read from its payload, not verified here); the new
    /// token goes to the server in an `auth` message, and the listeners stay open. A provider
    /// that throws leaves the service offline with the error in ``SyncStatus/lastError``;
    /// writes still queue, and it is asked again with the reconnect backoff. Takes the place
    /// of ``token`` when set.
    public var tokenProvider: (@Sendable () async throws -> String)?
    /// How long before a token's `exp` the provider is asked for the next.
    public var tokenRefreshMargin: Duration = .seconds(60)
    /// More nodes of the same server (the same PostgreSQL database, see docs/SCALE-OUT.md):
    /// the service connects to its `serverURL` first and, when a connection is lost or
    /// refused, to the next of these, round robin, resuming its listeners there.
    public var serverURLs: [String] = []
    /// For `wss://` servers over the default transport: the certificate authorities (a PEM
    /// file) their certificates must chain to. Nil: the system's. The server's name is checked against its certificate.
    public var trustedCertificates: String?
    public var logger = Logger(label: "tandem.sync")

    public init() {}
}

/// How the listener's changes are ordered against pushes.
@_spi(Testing) public enum Serialization: String, Sendable, CaseIterable {
    /// One queue: a push (send, answer, write-back) is a barrier that listener changes wait
    /// for. The server's echo of a create is applied after the create's server id is stored,
    /// so it is recognized. This is Tandem's design.
    case barrier
    /// Listener changes are applied as they arrive, on their connection's queue, concurrently
    /// with pushes, and documents are not matched to this device's unanswered creates by their
    /// key: no second queue, only the barrier left out. Only for showing the race Tandem
    /// prevents: the echo of a create can be inserted as a second row. Spelled `none` on the
    /// command line (`tandem demo --serialization none`).
    case unserialized = "none"
}
