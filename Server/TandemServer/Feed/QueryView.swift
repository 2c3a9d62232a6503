import TandemWire

/// What a query listener's client sees: the documents its query selects (and its user may
/// read), in the query's order, cut at its limit; and how each commit changes that view, as
/// positioned changes.
///
/// The view keeps every matching document, not only the ones within the limit, so that when
/// one leaves the view the next one takes its place. The changes of one commit come in
/// Firestore's `docChanges` order: removals, then additions, then modifications, each group
/// in query order, each index counted in the view as it stands after the changes before it
/// (``apply(_:)``). Confined to the core queue, like its listener.
final class QueryView {
    let query: Query
    let collection: CollectionPath
    /// Whether the listener's user may read a live document (nil: every one, the rules allow
    /// the whole collection). Set when the read rules look at each document.
    var readable: ((JSONObject) throws -> Bool)?
    /// Told when a document joins (true) or leaves (false) the matching documents, so that the
    /// feed knows whose view a write to it may change.
    var membershipChanged: ((DocumentID, Bool) -> Void)?
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

    /// A change to the view: its kind, the document as sent, and its positions.
    struct Change {
        var kind: TandemWire.Change.Kind
        var document: StoredDocument
        var oldIndex: Int
        var newIndex: Int
    }

    init(query: Query, collection: CollectionPath) {
        self.query = query
        self.collection = collection
    }

    private var view: ArraySlice<Entry> { matching.prefix(query.limit ?? .max) }

    /// The ids in the view, in order: what its client holds.
    var ids: [DocumentID] { view.map(\.id) }

    /// The whole view as additions, for a listener's first snapshot.
    ///
    /// - Parameter rows: Each document's latest row, tombstones included.
    func load(_ rows: some Sequence<FeedRow>) throws -> [Change] {
        try rebuild(from: rows)
        return view.enumerated().map {
            Change(kind: .added, document: $0.element.document, oldIndex: -1, newIndex: $0.offset)
        }
    }

    /// Takes in the documents a commit wrote (their latest state, tombstones included) and
    /// returns how the view changed.
    func apply(_ rows: [FeedRow]) throws -> [Change] {
        query.limit == nil ? try applyWhole(rows) : try applyLimited(rows)
    }

    /// ``apply(_:)`` for a view without a limit: only the written documents move, so the
    /// changes are made on the view itself, each found by binary search, whatever its size.
    /// The view stays in order throughout: the entries of documents still to be modified keep
    /// their old fields until their turn, as in Firestore's `docChanges`.
    private func applyWhole(_ rows: [FeedRow]) throws -> [Change] {
        // Decided first (readability may throw): the view changes all at once or not at all.
        let entries = try rows.map(entry(for:))
        var removals: [(entry: Entry, document: StoredDocument)] = []
        var additions: [Entry] = []
        var modifications: [(old: Entry, new: Entry)] = []
        for (row, entry) in zip(rows, entries) {
            switch (byID[row.id], entry) {
            case (let old?, nil): removals.append((old, try removal(row.row)))
            case (nil, let new?): additions.append(new)
            case (let old?, let new?): modifications.append((old, new))
            case (nil, nil): break
            }
        }
        removals.sort { precedes($0.entry, $1.entry) }
        additions.sort(by: precedes)
        modifications.sort { precedes($0.new, $1.new) }

        var changes: [Change] = []
        for (entry, document) in removals {
            let index = insertionIndex(of: entry, in: matching)
            matching.remove(at: index)
            byID[entry.id] = nil
            membershipChanged?(entry.id, false)
            changes.append(Change(kind: .removed, document: document, oldIndex: index, newIndex: -1))
        }
        for entry in additions {
            let index = insertionIndex(of: entry, in: matching)
            matching.insert(entry, at: index)
            byID[entry.id] = entry
            membershipChanged?(entry.id, true)
            changes.append(Change(kind: .added, document: entry.document, oldIndex: -1, newIndex: index))
        }
        for (old, new) in modifications {
            let oldIndex = insertionIndex(of: old, in: matching)
            matching.remove(at: oldIndex)
            let newIndex = insertionIndex(of: new, in: matching)
            matching.insert(new, at: newIndex)
            byID[new.id] = new
            changes.append(Change(kind: .modified, document: new.document, oldIndex: oldIndex, newIndex: newIndex))
        }
        return changes
    }

    /// ``apply(_:)`` for a view cut at a limit: documents that were not written may cross the
    /// limit, so the view before and after are compared.
    private func applyLimited(_ rows: [FeedRow]) throws -> [Change] {
        let before = Array(view)
        var written: [DocumentID: FeedRow] = [:]
        // Decided first (readability may throw): the view changes all at once or not at all.
        let entries = try rows.map(entry(for:))
        for (row, entry) in zip(rows, entries) {
            written[row.id] = row
            let old = byID.removeValue(forKey: row.id)
            if let old { matching.remove(at: insertionIndex(of: old, in: matching)) }
            if let entry {
                matching.insert(entry, at: insertionIndex(of: entry, in: matching))
                byID[row.id] = entry
            }
            if (old == nil) != (entry == nil) { membershipChanged?(row.id, entry != nil) }
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
                Change(
                    kind: .removed, document: try removal(written[entry.id]?.row ?? entry.document),
                    oldIndex: index, newIndex: -1))
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

    /// Replaces the view by the one `rows` make (each document's latest row, tombstones
    /// included) and returns the changes that turn `old`, the view its client holds, into it:
    /// for a listener that resumes with the ids of its view, or whose user's reading rights
    /// changed.
    ///
    /// The client's documents that were written since it saw them (`changed`) may have moved,
    /// and where they were is not known here: the changes place each addition and
    /// modification right after the last document before it whose place is known, so that
    /// every step leaves the known documents in order and the last leaves the view.
    ///
    /// - Returns: The changes, or nil when the documents of `old` that did not change are not
    ///   in the query's order (it is not a view this query had): the caller sends the whole
    ///   view instead.
    func replace(with rows: [FeedRow], old: [DocumentID], changed: (StoredDocument) -> Bool) throws
        -> [Change]?
    {
        var latest: [DocumentID: FeedRow] = [:]
        for row in rows { latest[row.id] = row }
        try rebuild(from: latest.values)
        let new = Array(view)
        let newIDs = Set(new.map(\.id))
        let oldIDs = Set(old)

        /// A place in the client's list: its entry when the document's place is known (it did
        /// not change and is still in the view), nil while it may have moved.
        struct Slot {
            var id: DocumentID
            var known: Entry?
        }
        var running = old.map { id in
            Slot(id: id, known: byID[id].flatMap { newIDs.contains(id) && !changed($0.document) ? $0 : nil })
        }
        let known = running.compactMap(\.known)
        guard zip(known, known.dropFirst()).allSatisfy({ precedes($0, $1) }) else { return nil }

        func place(_ entry: Entry) -> Int {
            var index = 0
            for (offset, slot) in running.enumerated() {
                guard let other = slot.known else { continue }
                guard precedes(other, entry) else { break }
                index = offset + 1
            }
            return index
        }
        var changes: [Change] = []
        for id in old where !newIDs.contains(id) {
            let index = running.firstIndex { $0.id == id }!
            running.remove(at: index)
            // A tombstone says nothing to a client that may not have seen the document: under
            // rules that look at each document, it goes withheld too, and so does one gone
            // altogether (a purged tombstone, a reset). Without such rules, one gone altogether
            // is a tombstone of version 0.
            let document =
                try latest[id].map {
                    $0.row.deleted && readable != nil ? .withheld(id, in: collection) : try removal($0.row)
                }
                ?? (readable != nil ? .withheld(id, in: collection) : .gone(id, in: collection))
            changes.append(Change(kind: .removed, document: document, oldIndex: index, newIndex: -1))
        }
        for entry in new where !oldIDs.contains(entry.id) {
            let index = place(entry)
            running.insert(Slot(id: entry.id, known: entry), at: index)
            changes.append(Change(kind: .added, document: entry.document, oldIndex: -1, newIndex: index))
        }
        for entry in new where oldIDs.contains(entry.id) {
            let oldIndex = running.firstIndex { $0.id == entry.id }!
            guard running[oldIndex].known == nil else { continue }
            running.remove(at: oldIndex)
            let newIndex = place(entry)
            running.insert(Slot(id: entry.id, known: entry), at: newIndex)
            changes.append(Change(kind: .modified, document: entry.document, oldIndex: oldIndex, newIndex: newIndex))
        }
        return changes
    }

    /// Empties the view and fills it from `rows`, reporting who joined and who left.
    private func rebuild(from rows: some Sequence<FeedRow>) throws {
        let entries = try rows.compactMap(entry(for:)).sorted(by: precedes)
        let previous = byID
        matching = entries
        byID = Dictionary(uniqueKeysWithValues: entries.map { ($0.id, $0) })
        guard let membershipChanged else { return }
        for id in previous.keys where byID[id] == nil { membershipChanged(id, false) }
        for id in byID.keys where previous[id] == nil { membershipChanged(id, true) }
    }

    /// The row's entry when the document is in the query's result: live, matching and
    /// readable.
    private func entry(for row: FeedRow) throws -> Entry? {
        guard let fields = row.fields, query.matches(fields), try readable?(fields) ?? true else { return nil }
        return Entry(document: row.row, fields: fields)
    }

    /// The document a `removed` change carries: as stored now (a tombstone, or one that no
    /// longer matches), unless its user may not read it now; then nothing of it.
    private func removal(_ row: StoredDocument) throws -> StoredDocument {
        guard !row.deleted, let readable else { return row }
        return try readable(try row.fields) ? row : .withheld(row.id, in: collection)
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

/// A row of the feed with its fields parsed once (nil for a tombstone), however many query
/// listeners look at it.
struct FeedRow {
    let row: StoredDocument
    let fields: JSONObject?
    var id: DocumentID { row.id }

    init(_ row: StoredDocument) throws {
        self.row = row
        fields = row.deleted ? nil : try row.fields
    }
}

extension StoredDocument {
    /// A `removed` change for a document its user may not read (or that does not exist): its
    /// id and nothing else, the same for both.
    static func withheld(_ id: DocumentID, in collection: CollectionPath) -> StoredDocument {
        StoredDocument(
            collection: collection, id: id, fieldsJSON: "{}", version: 0, createTime: 0, updateTime: 0, deleted: false,
            sequence: 0, createSequence: 0)
    }

    /// A `removed` change for a document the store no longer holds at all (its tombstone was
    /// purged, or its collection reset), on a server whose rules do not look at each document.
    static func gone(_ id: DocumentID, in collection: CollectionPath) -> StoredDocument {
        StoredDocument(
            collection: collection, id: id, fieldsJSON: "{}", version: 0, createTime: 0, updateTime: 0, deleted: true,
            sequence: 0, createSequence: 0)
    }
}
