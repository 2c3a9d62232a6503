import TandemWire

/// Points inside the sync engine where a test can watch or hold the engine, to force an
/// interleaving that would otherwise depend on timing. Behind the `Testing` SPI:
/// `@_spi(Testing) import Tandem`.
///
/// Hooks run synchronously on the engine's threads: a hook that blocks (see
/// `TandemTesting.Checkpoint`) holds the engine exactly there. For example, holding the
/// pusher between the server's acknowledgement and the write-back, while the listener's echo
/// arrives:
///
/// ```swift
/// let afterAck = Checkpoint()
/// configuration.hooks.afterAck = afterAck.hook
/// ```
@_spi(Testing) public struct SyncHooks: Sendable {
    /// When a connection attempt begins, before the socket is opened (on a thread of its own;
    /// the attempt waits for it).
    public var beforeConnect: (@Sendable () -> Void)?
    /// A connection is in place, before its first push is queued (on a thread of its own;
    /// the service waits for it).
    public var afterConnect: (@Sendable () -> Void)?
    /// Before a `write` is sent, with its ops.
    public var beforeSend: (@Sendable ([WriteOp]) -> Void)?
    /// After the server acknowledged a write, before the answer is written back to SQLite.
    /// The push barrier is still held.
    public var afterAck: (@Sendable ([WriteResult]) -> Void)?
    /// After an acknowledged write was written back to SQLite, with its ops and their results:
    /// from here on the device knows the server has them.
    public var afterWriteBack: (@Sendable ([WriteOp], [WriteResult]) -> Void)?
    /// Consulted when an acknowledgement arrives: returning true drops it and the connection,
    /// as if the network failed after the server applied the write.
    public var dropAcknowledgement: (@Sendable () -> Bool)?
    /// A snapshot arrived and is being queued for applying (on the connection's queue).
    public var snapshotReceived: (@Sendable (ServerMessage.Snapshot) -> Void)?
    /// Before a snapshot is applied, on the queue that applies it.
    ///
    /// A live snapshot that brings nothing but a new resume token (the one after each of this
    /// device's pushes) is stored later, with others like it: its hooks run then (possibly within
    /// ``SyncService/stop(discardingQueuedWork:)``, and ``beforeApplyCommit`` with several
    /// collections' snapshots at once), or never when a later snapshot of its collection was
    /// applied first, a reset came, or the service stopped discarding its work.
    public var beforeApply: (@Sendable (ServerMessage.Snapshot) -> Void)?
    /// Inside the transaction that applies snapshots, after their changes and resume tokens
    /// were written and before the commit: a crash here loses the whole transaction.
    public var beforeApplyCommit: (@Sendable ([ServerMessage.Snapshot]) -> Void)?
    /// After a snapshot and its resume token were committed.
    public var afterApply: (@Sendable (ServerMessage.Snapshot) -> Void)?
    /// A read of the status's counts that a local commit queued is about to start (on a
    /// thread of its own); commits until it starts queue no other.
    public var beforeQueuedStatusRead: (@Sendable () -> Void)?

    public init() {}
}
