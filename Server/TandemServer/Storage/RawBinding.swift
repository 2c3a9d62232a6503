import GRDB
import GRDBSQLite

/// Values bound straight to a cached statement's SQLite handle, for the statements the server
/// runs once per document. GRDB's `StatementArguments` box every value in an existential and
/// convert it to a `DatabaseValue` first, which on these paths cost about as much as SQLite's
/// own work.
struct RawBinder {
    fileprivate let handle: OpaquePointer
    fileprivate var index: Int32 = 0

    /// SQLite copies the bytes (its "transient" destructor), so the string need not outlive
    /// the call.
    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    mutating func bind(_ value: String) {
        index += 1
        var value = value
        value.withUTF8 { bytes in
            _ = sqlite3_bind_text(handle, index, bytes.baseAddress, Int32(bytes.count), Self.transient)
        }
    }

    mutating func bind(_ value: String?) {
        guard let value else {
            index += 1
            sqlite3_bind_null(handle, index)
            return
        }
        bind(value)
    }

    mutating func bind(_ value: Int64) {
        index += 1
        sqlite3_bind_int64(handle, index, value)
    }

    mutating func bind(_ value: Bool) { bind(value ? 1 as Int64 : 0) }
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
        let code = sqlite3_step(sqliteStatement)
        defer { sqlite3_reset(sqliteStatement) }
        guard code == SQLITE_DONE else {
            let message = String(cString: sqlite3_errmsg(sqlite3_db_handle(sqliteStatement)))
            throw DatabaseError(resultCode: ResultCode(rawValue: code), message: message, sql: sql)
        }
    }
}
