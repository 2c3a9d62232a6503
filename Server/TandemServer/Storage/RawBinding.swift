import GRDB
import GRDBSQLite

/// Values bound straight to a cached statement's SQLite handle, for the statements the server
/// runs once per document. GRDB's `StatementArguments` box every value in an existential and
/// convert it to a `DatabaseValue` first, which on these paths cost about as much as SQLite's
/// own work.
struct RawBinder {
    fileprivate let handle: OpaquePointer
    fileprivate var index: Int32 = 0
    /// The first bind that SQLite refused (`SQLITE_TOOBIG`, …): the statement must not run,
    /// since a refused parameter keeps the value of the row bound before.
    fileprivate var failure: (index: Int32, code: Int32)?

    /// SQLite copies the bytes (its "transient" destructor), so the string need not outlive
    /// the call.
    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    mutating func bind(_ value: String) {
        index += 1
        var value = value
        let code = value.withUTF8 { bytes in
            sqlite3_bind_text(handle, index, bytes.baseAddress, Int32(clamping: bytes.count), Self.transient)
        }
        check(code)
    }

    mutating func bind(_ value: String?) {
        guard let value else {
            index += 1
            check(sqlite3_bind_null(handle, index))
            return
        }
        bind(value)
    }

    mutating func bind(_ value: Int64) {
        index += 1
        check(sqlite3_bind_int64(handle, index, value))
    }

    mutating func bind(_ value: Bool) { bind(value ? 1 as Int64 : 0) }

    private mutating func check(_ code: Int32) {
        if code != SQLITE_OK && failure == nil { failure = (index, code) }
    }
}

extension Statement {
    /// Runs this statement (an INSERT, UPDATE or DELETE, inside a transaction of GRDB's) with
    /// the values `bind` binds, in order.
    ///
    /// It steps the statement itself, so GRDB's transaction observers do not hear of it: right
    /// for the server's store, which has none (its listeners are fed from the feed tables).
    ///
    /// - Throws: `DatabaseError`, as GRDB's `execute(arguments:)` would.
    func executeBinding(_ bind: (inout RawBinder) -> Void) throws {
        sqlite3_reset(sqliteStatement)
        var binder = RawBinder(handle: sqliteStatement)
        bind(&binder)
        precondition(
            binder.index == sqlite3_bind_parameter_count(sqliteStatement),
            "\(sql): bound \(binder.index) values, the statement takes \(sqlite3_bind_parameter_count(sqliteStatement))"
        )
        let connection = sqlite3_db_handle(sqliteStatement)
        if let failure = binder.failure {
            throw DatabaseError(
                resultCode: ResultCode(rawValue: failure.code),
                message: "value \(failure.index) not bound: \(String(cString: sqlite3_errmsg(connection)))", sql: sql)
        }
        let code = sqlite3_step(sqliteStatement)
        defer { sqlite3_reset(sqliteStatement) }
        guard code == SQLITE_DONE else {
            throw DatabaseError(
                resultCode: ResultCode(rawValue: code), message: String(cString: sqlite3_errmsg(connection)), sql: sql)
        }
    }
}
