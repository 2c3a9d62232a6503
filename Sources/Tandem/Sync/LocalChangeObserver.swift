import GRDB
import Synchronization
import TandemWire

/// Notices commits in which the app (not Tandem) changed synced tables, so that the push
/// starts soon after a local write.
///
/// GRDB calls transaction observers on the database writer's queue, one transaction at a
/// time; `isTandemWriting`, `changed` and `parentsChanged` are only touched there.
final class LocalChangeObserver: TransactionObserver, @unchecked Sendable {
    private let tables: Set<String>
    private let parents: Set<String>
    /// Set by Tandem for the duration of its own write closures (``tandemWrites(in:_:)``).
    private var isTandemWriting = false
    private var changed = false
    private var parentsChanged = false
    private let onCommit = Mutex<CommitAction?>(nil)

    /// What a commit of the app's changes runs, kept in a struct rather than as a bare closure:
    /// a closure that is itself the `Mutex`'s generic value comes out of each `withLock { $0 }`
    /// wrapped in a pair of conversion thunks more, written back into the lock, so every commit
    /// called through more frames than the one before (built with `-O`: 6 µs a call at first,
    /// 70 µs after 10,000 calls, and a crash between 10,000 and 11,000 on a 512 KB stack;
    /// swiftlang/swift#91348). A struct's field keeps its closure as it is (0.05 µs, flat).
    private struct CommitAction: Sendable {
        let run: @Sendable (_ parentsChanged: Bool) -> Void
    }

    init(tables: Set<String>, parents: Set<String>) {
        self.tables = tables
        self.parents = parents
    }

    /// Runs one of Tandem's own writes, whose changes start no push: inside the writer's
    /// transaction, on its queue (GRDB's `isInsideTransaction` checks the queue itself).
    func tandemWrites<T>(in db: Database, _ body: () throws -> T) rethrows -> T {
        Confinement.check(db.isInsideTransaction, "Tandem's write flag set outside a write of the database")
        isTandemWriting = true
        defer { isTandemWriting = false }
        return try body()
    }

    func setOnCommit(_ action: @escaping @Sendable (_ parentsChanged: Bool) -> Void) {
        onCommit.withLock { $0 = CommitAction(run: action) }
    }

    /// GRDB asks before each statement. Tandem's own statements are not observed at all: GRDB
    /// then prepares no per-statement observation and reports none of their rows (on the
    /// apply's path, 3 % of the CPU of the throughput benchmark went there). GRDB also asks
    /// when it prepares a statement, whether a `DELETE` without `WHERE` may truncate the table
    /// without reporting its rows, and keeps the answer with the cached statement; Tandem's
    /// deletes of app rows all have a `WHERE`, so none of its cached statements can carry a
    /// "no" into an app's transaction.
    func observes(eventsOfKind eventKind: DatabaseEventKind) -> Bool {
        !isTandemWriting && tables.contains(eventKind.tableName)
    }

    func databaseDidChange(with event: DatabaseEvent) {
        changed = true
        if parents.contains(event.tableName) { parentsChanged = true }
        // Nothing more to learn from this transaction's other rows.
        if parentsChanged || parents.isEmpty { stopObservingDatabaseChangesUntilNextTransaction() }
    }

    func databaseDidCommit(_ db: Database) {
        defer {
            changed = false
            parentsChanged = false
        }
        guard changed else { return }
        let parentsChanged = self.parentsChanged
        onCommit.withLock { $0 }?.run(parentsChanged)
    }

    func databaseDidRollback(_ db: Database) {
        changed = false
        parentsChanged = false
    }
}
