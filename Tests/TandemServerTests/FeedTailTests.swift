import GRDB
import Logging
import Synchronization
import TandemTesting
import TandemWire
import Testing

@testable import TandemServer

/// The embedded store serves the feed page after a write from the rows it just wrote: that page
/// must be the one the file gives back, and never once anything changed since.
@Suite("The feed after a write, from memory")
struct FeedTailTests {
    private let collection = try! CollectionPath("notes")

    /// Writes documents with the given ids and numbers, each at the collection's next sequence,
    /// as a write group does; `failing` throws after the save, so the transaction rolls back.
    private func write(_ store: SQLiteStore, _ documents: [(id: String, n: Int)], failing: Bool = false) throws {
        struct Refused: Error {}
        try store.write(locking: [collection]) { transaction in
            let last = try transaction.lastSequence(of: collection)
            let stored = try documents.enumerated().map { index, document in
                StoredDocument(
                    collection: collection, id: try DocumentID(document.id), fieldsJSON: #"{"n":\#(document.n)}"#,
                    version: 1, createTime: 1, updateTime: 1, deleted: false, sequence: last + 1 + Int64(index),
                    createSequence: last + 1 + Int64(index), createKey: "k-\(document.id)", createClient: "c",
                    fieldTimesJSON: nil, isNew: true)
            }
            try transaction.save(stored, records: [], sequences: [collection: last + Int64(documents.count)])
            if failing { throw Refused() }
        }
    }

    /// A page as the listeners get it, and the same page read from the file.
    private func pages(_ store: SQLiteStore, after position: Int64, limit: Int = 100, maxBytes: Int = 1 << 20)
        throws -> (served: [String], file: [String])
    {
        func describe(_ page: FeedPage?) -> [String] {
            guard let page else { return [] }
            return page.rows.map { "\($0.id)@\($0.sequence) \($0.fieldsJSON) \($0.createKey ?? "-") \($0.isNew)" }
                + ["position \(page.position) last \(page.bounds.last)"]
        }
        let served = try store.readFeeds(after: [collection: position], limit: limit, maxBytes: maxBytes)[collection]
        let file = try store.database.read { db in
            try SQLiteStore.page(
                db, collection, after: position, PageSize(limit: limit, maxBytes: maxBytes),
                bounds: SQLiteStore.bounds(db, collection))
        }
        return (describe(served), describe(file))
    }

    @Test("the page after a write is its rows, cut where the file's page is cut, and served from memory")
    func servedFromMemory() throws {
        let folder = try TemporaryDirectory()
        let store = try SQLiteStore(directory: folder.url, logger: Logger(label: "test"))
        try write(store, [("a", 1), ("b", 2), ("c", 3)])
        for (limit, maxBytes) in [(100, 1 << 20), (2, 1 << 20), (100, 170)] {
            let (served, file) = try pages(store, after: 0, limit: limit, maxBytes: maxBytes)
            #expect(served == file, "limit \(limit), maxBytes \(maxBytes)")
        }
        #expect(store.pagesFromMemory == 3)
        // A catch-up page after the same position too.
        _ = try store.page(of: collection, after: 0, limit: 100, maxBytes: 1 << 20)
        #expect(store.pagesFromMemory == 4)

        try write(store, [("d", 4), ("e", 5)])
        let (after, fileAfter) = try pages(store, after: 3)
        #expect(after == fileAfter)
        #expect(after.count == 3)
        #expect(store.pagesFromMemory == 1)
        // Behind the last write: the file's page, all five.
        let (behind, fileBehind) = try pages(store, after: 0)
        #expect(behind == fileBehind)
        #expect(behind.count == 6)
        #expect(store.pagesFromMemory == 1)
    }

    @Test("a row changed after the write, or a write rolled back, makes the feed be read from the file")
    func changedSince() throws {
        let folder = try TemporaryDirectory()
        let store = try SQLiteStore(directory: folder.url, logger: Logger(label: "test"))
        try write(store, [("a", 1), ("b", 2)])
        try store.database.write { db in try db.execute(sql: #"UPDATE document SET fields = '{"n":99}' WHERE id = 'b'"#)
        }
        let (changed, file) = try pages(store, after: 0)
        #expect(changed == file)
        #expect(changed.contains { $0.contains(#"{"n":99}"#) }, "\(changed)")
        #expect(store.pagesFromMemory == 0)

        try write(store, [("c", 3)])
        #expect(throws: (any Error).self) { try write(store, [("d", 4)], failing: true) }
        let (afterRollback, fileAfterRollback) = try pages(store, after: 2)
        #expect(afterRollback == fileAfterRollback)
        #expect(afterRollback.count == 2, "\(afterRollback)")
    }

    @Test("new documents go in many per statement, an update among them in its place: every row as saved")
    func newDocumentsManyPerStatement() throws {
        let folder = try TemporaryDirectory()
        let store = try SQLiteStore(directory: folder.url, logger: Logger(label: "test"))
        try write(store, [("a", 1), ("b", 2)])
        func stored(_ id: String, _ sequence: Int64, isNew: Bool) -> StoredDocument {
            StoredDocument(
                collection: collection, id: try! DocumentID(id), fieldsJSON: #"{"at":\#(sequence)}"#,
                version: isNew ? 1 : 2, createTime: 1, updateTime: 2, deleted: false, sequence: sequence,
                createSequence: isNew ? sequence : 2, createKey: "k-\(id)", createClient: "c", fieldTimesJSON: nil,
                isNew: isNew)
        }
        // Five new, then b updated, then 66 new: statements of 4 and 1, the update, 64, 1 and 1.
        let documents =
            (3...7).map { stored("n\($0)", Int64($0), isNew: true) } + [stored("b", 8, isNew: false)]
            + (9...74).map { stored("n\($0)", Int64($0), isNew: true) }
        let inserts = Mutex(0)
        store.database.writeWithoutTransaction { db in
            db.trace { event in
                if case .statement(let statement) = event, statement.sql.hasPrefix("INSERT INTO document") {
                    inserts.withLock { $0 += 1 }
                }
            }
        }
        try store.write(locking: [collection]) { transaction in
            _ = try transaction.lastSequence(of: collection)
            try transaction.save(documents, records: [], sequences: [collection: 74])
        }
        store.database.writeWithoutTransaction { db in db.trace(nil) }
        #expect(inserts.withLock { $0 } == 5)
        let rows = try store.database.read { db in
            try Row.fetchAll(db, sql: "SELECT id, sequence, fields FROM document ORDER BY sequence")
        }
        #expect(rows.map { $0["id"] as String } == ["a"] + (3...7).map { "n\($0)" } + ["b"] + (9...74).map { "n\($0)" })
        for row in rows.dropFirst() {
            #expect(row["fields"] as String == #"{"at":\#(row["sequence"] as Int64)}"#)
        }
    }
}
