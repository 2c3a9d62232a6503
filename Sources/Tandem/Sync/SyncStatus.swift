/// What the sync service is doing, as the app shows it.
public struct SyncStatus: Sendable, Equatable, CustomStringConvertible {
    /// Connected to the server (welcome received).
    public var isConnected = false
    /// Local changes not pushed yet (dirty rows and deletes), failed ones excluded.
    public var pendingCount = 0
    /// Rows whose push failed for good; see ``SyncService/failedRecords()``.
    public var failedCount = 0
    /// Conflicts waiting for the app (manual policy); see ``SyncService/conflicts()``.
    public var openConflicts = 0
    /// Conflicts settled since the service was created: by a policy, or by the app.
    public var resolvedConflicts = 0
    /// The last problem met, if any, with a ``TandemError/Code`` to switch on
    /// (`.unreachable`, `.disconnected`, `.server` with the server's error, `.database`, …).
    public var lastError: TandemError?

    public init() {}

    public var description: String {
        "\(isConnected ? "connected" : "offline"), \(pendingCount) pending, \(failedCount) failed"
            + (openConflicts > 0 ? ", \(openConflicts) open conflicts" : "")
            + (lastError.map { ", last error: \($0)" } ?? "")
    }
}

/// A row whose push failed for good.
public struct FailedRecord: Sendable, Equatable {
    public var table: String
    /// The local id (the row may be gone when it was a delete that failed).
    public var rowId: Int64
    public var serverId: String?
    public var attempts: Int
    /// Why: a refusal by the server (``TandemError/Code/server``, with its answer in
    /// ``TandemError/serverError``), a row Tandem cannot push as it is (`.invalidArgument`:
    /// moved to another parent), attempts used up on failures that may pass (`.disconnected`,
    /// `.timedOut`, …).
    public var error: TandemError
}

/// What one ``SyncService/syncNow()`` did.
public struct SyncReport: Sendable, Equatable {
    /// Ops the server acknowledged.
    public var pushed = 0
    /// Conflicts settled by the conflict policy.
    public var conflicts = 0
    /// Rows still waiting (because they changed during the push, or a reference was pending).
    public var pending = 0
    public var failed = 0
}
