import GRDB
import GRDBSQLite
import TandemTesting
import Testing

@testable import TandemServer

@Suite("Values bound straight to SQLite")
struct RawBindingTests {
    private func database() throws -> (DatabaseQueue, TemporaryDirectory) {
        let folder = try TemporaryDirectory()
        let queue = try DatabaseQueue(path: folder.path("raw.sqlite"))
        try queue.write { db in
            try db.execute(sql: "CREATE TABLE t (id TEXT PRIMARY KEY NOT NULL, n INTEGER, note TEXT)")
        }
        return (queue, folder)
    }

    @Test("the values land in order, nulls included")
    func values() throws {
        let (queue, folder) = try database()
        _ = folder
        try queue.write { db in
            let insert = try db.cachedStatement(sql: "INSERT INTO t (id, n, note) VALUES (?, ?, ?)")
            for (id, n, note) in [("a", 1 as Int64, "é ✓" as String?), ("b", -7, nil)] {
                try insert.executeBinding { values in
                    values.bind(id)
                    values.bind(n)
                    values.bind(note)
                }
            }
        }
        let rows = try queue.read { db in try Row.fetchAll(db, sql: "SELECT id, n, note FROM t ORDER BY id") }
        #expect(rows == [["id": "a", "n": 1, "note": "é ✓"], ["id": "b", "n": -7, "note": nil]])
    }

    @Test("a value SQLite refuses fails the statement instead of writing the row bound before")
    func refusedBind() throws {
        let (queue, folder) = try database()
        _ = folder
        try queue.write { db in
            let insert = try db.cachedStatement(sql: "INSERT INTO t (id, n, note) VALUES (?, ?, ?)")
            try insert.executeBinding { values in
                values.bind("first")
                values.bind(1 as Int64)
                values.bind("short")
            }
            sqlite3_limit(db.sqliteConnection, SQLITE_LIMIT_LENGTH, 100)
            #expect {
                try insert.executeBinding { values in
                    values.bind("second")
                    values.bind(2 as Int64)
                    values.bind(String(repeating: "x", count: 1000))
                }
            } throws: { error in
                (error as? DatabaseError)?.resultCode == .SQLITE_TOOBIG
                    && (error as? DatabaseError)?.message?.contains("value 3 not bound") == true
            }
        }
        let ids = try queue.read { db in try String.fetchAll(db, sql: "SELECT id FROM t ORDER BY id") }
        #expect(ids == ["first"])
    }

    @Test("a constraint violation throws GRDB's DatabaseError and leaves the statement usable")
    func constraint() throws {
        let (queue, folder) = try database()
        _ = folder
        try queue.write { db in
            let insert = try db.cachedStatement(sql: "INSERT INTO t (id, n, note) VALUES (?, ?, ?)")
            func add(_ id: String) throws {
                try insert.executeBinding { values in
                    values.bind(id)
                    values.bind(0 as Int64)
                    values.bind(nil as String?)
                }
            }
            try add("a")
            #expect {
                try add("a")
            } throws: { error in
                (error as? DatabaseError)?.resultCode == .SQLITE_CONSTRAINT
            }
            try add("b")
            // GRDB's own path still works on the same cached statement.
            try insert.execute(arguments: ["c", 1, "x"])
        }
        #expect(try queue.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM t") } == 3)
    }

    @Test("a lookup read straight from SQLite: the integer, nil for no row or NULL, an error that says what failed")
    func lookup() throws {
        let (queue, folder) = try database()
        _ = folder
        try queue.write { db in
            try db.execute(sql: "INSERT INTO t (id, n, note) VALUES ('a', 42, NULL), ('b', NULL, NULL)")
            let find = try db.cachedStatement(sql: "SELECT n FROM t WHERE id = ?")
            #expect(try find.fetchInt64 { $0.bind("a") } == 42)
            #expect(try find.fetchInt64 { $0.bind("b") } == nil)
            #expect(try find.fetchInt64 { $0.bind("none") } == nil)
            // An error at the step (an integer overflow), then the statement works on.
            let negate = try db.cachedStatement(sql: "SELECT abs(n) FROM t WHERE id = ?")
            try db.execute(sql: "UPDATE t SET n = -9223372036854775808 WHERE id = 'b'")
            #expect {
                try negate.fetchInt64 { $0.bind("b") }
            } throws: { error in
                (error as? DatabaseError)?.message?.contains("integer overflow") == true
            }
            #expect(try negate.fetchInt64 { $0.bind("a") } == 42)
            // GRDB's own fetch still works on the same cached statement.
            #expect(try Int64.fetchOne(find, arguments: ["a"]) == 42)
        }
    }
}
