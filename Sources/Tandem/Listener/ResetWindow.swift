import TandemWire

/// The rows that pushes wrote back while a reset's full snapshot could still end, each with
/// the number of the message that acknowledged it (``ServerConnection/arrivals``).
///
/// A reset's full snapshot is the whole truth: at its end, the clean rows it did not bring
/// go (``SyncLedger/resetLeftovers(_:_:parentRowId:keeping:_:)``). But the server reads
/// it at one moment: a collection's last page when it reads that page, a query's whole view
/// before its first frame. A write it applies after that is not in the snapshot, and the
/// write's acknowledgement comes after that message on the connection. A push that runs
/// before the last page is applied (the page waits behind the push's barrier, or beside it
/// with `Serialization.unserialized`) writes such a row back, and the end of the snapshot
/// would remove it although the server holds it: for good when the listener leaves out its
/// own writes, or to come back under a new local id. So the rows acknowledged by a message
/// after the one the snapshot was read for stay.
///
/// Each connection has its own (the numbers are the connection's), kept until the next
/// connection comes, while what the last one delivered may still be applied.
struct ResetWindow {
    /// A full snapshot on its way: from which message on (the `reset`, or the listen), whether
    /// it is a query's view (read before its first frame), and the number of its first frame
    /// once it came.
    private struct Round {
        var since: Int
        var isView: Bool
        var firstFrame: Int?
        /// The first frame of an earlier round of this view, overtaken by this one before its
        /// last page was taken: that page, still to be applied, keeps what came after it.
        var overtakenFirstFrame: Int?
        /// The listener closed, or the server refused it, at this message: what it delivered
        /// before may still wait to be applied.
        var closedAt: Int?

        /// From which message on acknowledgements may still matter to this round's pages.
        var floor: Int? {
            [isView ? firstFrame : nil, overtakenFirstFrame].compactMap { $0 }.min()
        }
    }

    private var coming: [CollectionPath: Round] = [:]
    private var acknowledged: [(arrival: Int, table: String, rowIds: [Int64])] = []

    var isEmpty: Bool { coming.isEmpty }

    /// How many acknowledgements are kept (for tests of the window's bound).
    var notedCount: Int { acknowledged.count }

    /// A reset's full snapshot of `path` comes after message `since`: listened to while a
    /// reset was under way, or reset by the server (again, when it starts over). `isView`:
    /// the listener's query view.
    mutating func expect(_ path: CollectionPath, since: Int, isView: Bool) {
        coming[path] = Round(since: since, isView: isView, overtakenFirstFrame: coming[path]?.floor)
    }

    /// An `initial` frame of `path` came as message `arrival`.
    mutating func received(initialFrameOf path: CollectionPath, arrival: Int) {
        if coming[path]?.firstFrame == nil { coming[path]?.firstFrame = arrival }
    }

    /// No full snapshot of `path` is coming after message `arrival` any more: its listener
    /// closed, or the server refused it. Its frames before that may still wait to be applied:
    /// the round goes once they are taken.
    mutating func close(_ path: CollectionPath, at arrival: Int) {
        coming[path]?.closedAt = arrival
    }

    /// A push wrote back `rowIds` of `table`, acknowledged by message `arrival`. Nothing is
    /// kept while no full snapshot is coming.
    mutating func acknowledged(_ rowIds: [Int64], of table: String, arrival: Int) {
        guard !coming.isEmpty, !rowIds.isEmpty else { return }
        acknowledged.append((arrival, table, rowIds))
    }

    /// The rows of `table` that the full snapshot of `path`, ending with the page numbered
    /// `lastPage`, does not hold: those acknowledged after the page, or, for a query's view
    /// (`readAtFirstFrame`), after its first frame. A view whose round was overtaken by a
    /// newer one (its first frame no longer known) keeps every row noted.
    func rows(of table: String, in path: CollectionPath, lastPage: Int, readAtFirstFrame: Bool) -> Set<Int64> {
        var readFor = lastPage
        if readAtFirstFrame {
            let round = coming[path]
            readFor = round.flatMap { $0.since < lastPage ? $0.firstFrame : nil } ?? 0
        }
        var rows: Set<Int64> = []
        for entry in acknowledged where entry.arrival > readFor && entry.table == table {
            rows.formUnion(entry.rowIds)
        }
        return rows
    }

    /// Snapshots up to message `arrival` were taken from the inbox (applied, or their tokens
    /// kept), and the full snapshots whose last pages are `finished` ended: a round that began
    /// after its page (a newer `reset`) is still coming. The acknowledgements up to `arrival`
    /// can matter to no snapshot still to come (its pages are numbered later), except to a
    /// view whose first frame came before them. So a collection's full snapshot, however long,
    /// keeps only what came since its last page taken.
    mutating func taken(through arrival: Int, finished: [(path: CollectionPath, lastPage: Int)]) {
        for (path, lastPage) in finished {
            guard let round = coming[path] else { continue }
            if round.since < lastPage {
                coming[path] = nil
            } else {
                coming[path]?.overtakenFirstFrame = nil  // the overtaken round's last page
            }
        }
        for (path, round) in coming where round.closedAt.map({ $0 <= arrival }) == true {
            coming[path] = nil
        }
        if coming.isEmpty {
            acknowledged = []
        } else {
            let keepFrom = coming.values.compactMap(\.floor).reduce(arrival, min)
            acknowledged.removeAll { $0.arrival <= keepFrom }
        }
    }
}
