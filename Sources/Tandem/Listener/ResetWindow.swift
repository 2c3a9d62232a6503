import TandemWire

/// The rows that pushes wrote back while a reset's full snapshot could still end on this
/// connection, each with the number of the message that acknowledged it
/// (``ServerConnection/arrivals``).
///
/// A reset's full snapshot is the whole truth: at its end, the clean rows it did not bring
/// go (``SyncLedger/finishReset(_:_:parentRowId:keeping:_:remove:)``). The server reads its
/// last page at one moment; a write it applies after that is not in the page, and the write's
/// acknowledgement comes after the page on the connection. A push that runs between the
/// page's arrival and its apply (the page waits behind the push's barrier) writes such a row
/// back, and the end of the page would remove it although the server holds it: for good,
/// when the listener leaves out its own writes, or to come back under a new local id. So the
/// rows acknowledged by a message after the page's stay.
struct ResetWindow {
    /// Collections whose full snapshot may still end on this connection.
    private(set) var collections: Set<CollectionPath> = []
    private var acknowledged: [(arrival: Int, table: String, rowIds: [Int64])] = []

    /// A reset's full snapshot is coming for `path`: listened to while a reset was under way,
    /// or reset by the server.
    mutating func expect(_ path: CollectionPath) {
        collections.insert(path)
    }

    /// A push wrote back `rowIds` of `table`, acknowledged by message `arrival`. Nothing is
    /// kept while no full snapshot is coming.
    mutating func acknowledged(_ rowIds: [Int64], of table: String, arrival: Int) {
        guard !collections.isEmpty, !rowIds.isEmpty else { return }
        acknowledged.append((arrival, table, rowIds))
    }

    /// The rows of `table` acknowledged by a message after `arrival`: a page numbered
    /// `arrival` does not hold what they wrote.
    func rows(of table: String, acknowledgedAfter arrival: Int) -> Set<Int64> {
        var rows: Set<Int64> = []
        for entry in acknowledged where entry.arrival > arrival && entry.table == table {
            rows.formUnion(entry.rowIds)
        }
        return rows
    }

    /// Snapshots up to message `arrival` were applied, and the full snapshots of `finished`
    /// ended: the acknowledgements up to it can matter to no page still to come (those are
    /// numbered later).
    mutating func applied(through arrival: Int, finished: some Sequence<CollectionPath>) {
        collections.subtract(finished)
        if collections.isEmpty {
            acknowledged = []
        } else {
            acknowledged.removeAll { $0.arrival <= arrival }
        }
    }
}
