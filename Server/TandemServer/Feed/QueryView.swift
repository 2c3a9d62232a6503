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
    /// The entries of `matching`, by id.
    private var byID: [DocumentID: Entry] = [:]

    /// A class, so that moving entries in `matching` moves pointers, not documents.
    final class Entry {
        let document: StoredDocument
        let fields: JSONObject
        var id: DocumentID { document.id }

        init(document: StoredDocument, fields: JSONObject) {
            self.document = document
            self.fields = fields
        }
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
    ///
    /// - Parameter rows: Each document's latest row, tombstones included.
    func load(_ rows: some Sequence<StoredDocument>) throws -> [Change] {
        matching = []
        byID = [:]
        for row in rows where !row.deleted {
            let fields = try row.fields
            guard query.matches(fields) else { continue }
            let entry = Entry(document: row, fields: fields)
            matching.append(entry)
            byID[row.id] = entry
        }
        matching.sort(by: precedes)
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
            if let old = byID.removeValue(forKey: row.id) {
                matching.remove(at: insertionIndex(of: old, in: matching))
            }
            guard !row.deleted else { continue }
            let fields = try row.fields
            guard query.matches(fields) else { continue }
            let entry = Entry(document: row, fields: fields)
            matching.insert(entry, at: insertionIndex(of: entry, in: matching))
            byID[row.id] = entry
        }
        let after = Array(view)
        let beforeIDs = Set(before.map(\.id))
        let afterIDs = Set(after.map(\.id))

        // Firestore's docChanges order, each index in the view as the changes before it left
        // it: `running` starts as the old view and ends as the new one.
        var changes: [Change] = []
        var running = before
        for entry in before where !afterIDs.contains(entry.id) {
            let index = running.firstIndex { $0 === entry }!
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

    private func precedes(_ a: Entry, _ b: Entry) -> Bool {
        query.precedes((a.id, a.fields), (b.id, b.fields))
    }

    /// Where `entry` goes among `entries` (kept in query order): after every one before it.
    /// For an entry that is there, its index: the order is total, and ids are unique.
    private func insertionIndex(of entry: Entry, in entries: [Entry]) -> Int {
        var low = 0
        var high = entries.count
        while low < high {
            let middle = (low + high) / 2
            if precedes(entries[middle], entry) {
                low = middle + 1
            } else {
                high = middle
            }
        }
        return low
    }
}
