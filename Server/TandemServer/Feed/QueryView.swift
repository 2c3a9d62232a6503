import TandemWire

/// What a query listener's client sees: the documents its query selects, in the query's
/// order, cut at its limit; and how each commit changes that view, as positioned changes.
///
/// The view keeps every matching document, not only the ones within the limit, so that when
/// one leaves the view the next one takes its place. The changes of one commit come in
/// Firestore's `docChanges` order: removals, then additions, then modifications, each group
/// in query order, each index counted in the view as it stands after the changes before it
/// (``apply(_:)``). Confined to the core queue, like its listener.
final class QueryView {
    let query: Query
    /// Every live document that matches, in query order.
    private var matching: [Entry] = []

    struct Entry {
        var document: StoredDocument
        var fields: JSONObject
        var id: DocumentID { document.id }
    }

    /// A change to the view: its kind, the document as stored now, and its positions.
    struct Change {
        var kind: TandemWire.Change.Kind
        var document: StoredDocument
        var oldIndex: Int
        var newIndex: Int
    }

    init(query: Query) { self.query = query }

    private var view: ArraySlice<Entry> { matching.prefix(query.limit ?? .max) }

    /// The whole view as additions, for a listener's first snapshot.
    func load(_ rows: [StoredDocument]) throws -> [Change] {
        matching = []
        for row in rows where !row.deleted {
            let fields = try row.fields
            if query.matches(fields) { matching.append(Entry(document: row, fields: fields)) }
        }
        matching.sort { query.precedes(($0.id, $0.fields), ($1.id, $1.fields)) }
        return view.enumerated().map {
            Change(kind: .added, document: $0.element.document, oldIndex: -1, newIndex: $0.offset)
        }
    }

    /// Takes in the documents a commit wrote (their latest state, tombstones included) and
    /// returns how the view changed.
    func apply(_ rows: [StoredDocument]) throws -> [Change] {
        let before = Array(view)
        var written: [DocumentID: StoredDocument] = [:]
        for row in rows {
            written[row.id] = row
            matching.removeAll { $0.id == row.id }
            guard !row.deleted else { continue }
            let fields = try row.fields
            guard query.matches(fields) else { continue }
            let entry = Entry(document: row, fields: fields)
            matching.insert(entry, at: insertionIndex(of: entry, in: matching))
        }
        let after = Array(view)
        let beforeIDs = Set(before.map(\.id))
        let afterIDs = Set(after.map(\.id))

        var changes: [Change] = []
        var running = before
        for entry in before where !afterIDs.contains(entry.id) {
            let index = running.firstIndex { $0.id == entry.id }!
            running.remove(at: index)
            changes.append(
                Change(kind: .removed, document: written[entry.id] ?? entry.document, oldIndex: index, newIndex: -1))
        }
        for entry in after where !beforeIDs.contains(entry.id) {
            let index = insertionIndex(of: entry, in: running)
            running.insert(entry, at: index)
            changes.append(Change(kind: .added, document: entry.document, oldIndex: -1, newIndex: index))
        }
        for entry in after where beforeIDs.contains(entry.id) && written[entry.id] != nil {
            let oldIndex = running.firstIndex { $0.id == entry.id }!
            running.remove(at: oldIndex)
            let newIndex = insertionIndex(of: entry, in: running)
            running.insert(entry, at: newIndex)
            changes.append(Change(kind: .modified, document: entry.document, oldIndex: oldIndex, newIndex: newIndex))
        }
        return changes
    }

    /// Where `entry` goes among `entries` (kept in query order): after every one before it.
    private func insertionIndex(of entry: Entry, in entries: [Entry]) -> Int {
        var low = 0
        var high = entries.count
        while low < high {
            let middle = (low + high) / 2
            if query.precedes((entries[middle].id, entries[middle].fields), (entry.id, entry.fields)) {
                low = middle + 1
            } else {
                high = middle
            }
        }
        return low
    }
}
