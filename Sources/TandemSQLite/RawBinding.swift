import Foundation
import GRDB
import GRDBSQLite

/// Values bound straight to a cached statement's SQLite handle, for the statements run once per
/// document (the client's apply, the server's writes). GRDB's `StatementArguments` box every
/// value in an existential and convert it to a `DatabaseValue` first, which on these paths cost
/// about as much as SQLite's own work.
package struct RawBinder {
    fileprivate let handle: OpaquePointer
    fileprivate var index: Int32 = 0
    /// The first bind that SQLite refused (`SQLITE_TOOBIG`, …): the statement must not run,
    /// since a refused parameter keeps the value of the row bound before.
    fileprivate var failure: (index: Int32, code: Int32)?

    /// SQLite copies the bytes (its "transient" destructor), so the value need not outlive the
    /// call.
    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    fileprivate init(handle: OpaquePointer) { self.handle = handle }

    package mutating func bind(_ value: String) {
        index += 1
        var value = value
        let code = value.withUTF8 { bytes in
            sqlite3_bind_text(handle, index, bytes.baseAddress, Int32(clamping: bytes.count), Self.transient)
        }
        check(code)
    }

    package mutating func bind(_ value: String?) {
        guard let value else { return bindNull() }
        bind(value)
    }

    package mutating func bind(_ value: Int64) {
        index += 1
        check(sqlite3_bind_int64(handle, index, value))
    }

    package mutating func bind(_ value: Int64?) {
        guard let value else { return bindNull() }
        bind(value)
    }

    package mutating func bind(_ value: Bool) { bind(value ? 1 as Int64 : 0) }

    package mutating func bind(_ value: Double) {
        index += 1
        check(sqlite3_bind_double(handle, index, value))
    }

    package mutating func bind(_ value: Data) {
        index += 1
        let code = value.withUnsafeBytes { bytes in
            sqlite3_bind_blob(handle, index, bytes.baseAddress, Int32(clamping: bytes.count), Self.transient)
        }
        check(code)
    }

    package mutating func bind(_ value: DatabaseValue) {
        switch value.storage {
        case .null: bindNull()
        case .int64(let int): bind(int)
        case .double(let double): bind(double)
        case .string(let string): bind(string)
        case .blob(let data): bind(data)
        }
    }

    package mutating func bindNull() {
        index += 1
        check(sqlite3_bind_null(handle, index))
    }

    private mutating func check(_ code: Int32) {
        if code != SQLITE_OK && failure == nil { failure = (index, code) }
    }
}

extension Statement {
    /// Runs this statement (an INSERT, UPDATE or DELETE, inside a transaction of GRDB's) with
    /// the values `bind` binds, in order.
    ///
    /// It steps the statement itself, so GRDB's transaction observers do not hear of it: right
    /// for the server's store, which has none (its listeners are fed from the feed tables). The
    /// client, whose app may observe its tables, uses ``execute(binding:)``.
    ///
    /// - Throws: `DatabaseError`, as GRDB's `execute(arguments:)` would.
    package func executeBinding(_ bind: (inout RawBinder) -> Void) throws {
        sqlite3_reset(sqliteStatement)
        try bindAll(bind)
        let code = sqlite3_step(sqliteStatement)
        defer { sqlite3_reset(sqliteStatement) }
        guard code == SQLITE_DONE else {
            throw DatabaseError(
                resultCode: ResultCode(rawValue: code),
                message: String(cString: sqlite3_errmsg(sqlite3_db_handle(sqliteStatement))), sql: sql)
        }
    }

    /// Runs this query with the values `bind` binds, in order, and returns the integer in the
    /// first column of its first row: nil when it returns no row, or NULL there.
    ///
    /// For a lookup by key run once per document: GRDB's `fetchOne` steps through a generic
    /// cursor with its scheduling checks, which cost about three times SQLite's own index
    /// search. A query changes nothing, so no transaction observer misses anything.
    ///
    /// - Throws: `DatabaseError`, as GRDB's `fetchOne` would.
    package func fetchInt64(binding bind: (inout RawBinder) -> Void) throws -> Int64? {
        sqlite3_reset(sqliteStatement)
        try bindAll(bind)
        defer { sqlite3_reset(sqliteStatement) }
        switch sqlite3_step(sqliteStatement) {
        case SQLITE_ROW:
            guard sqlite3_column_type(sqliteStatement, 0) != SQLITE_NULL else { return nil }
            return sqlite3_column_int64(sqliteStatement, 0)
        case SQLITE_DONE:
            return nil
        case let code:
            throw DatabaseError(
                resultCode: ResultCode(rawValue: code),
                message: String(cString: sqlite3_errmsg(sqlite3_db_handle(sqliteStatement))), sql: sql)
        }
    }

    /// Runs this statement with the values `bind` binds, in order, through GRDB's own
    /// `execute()`: GRDB's transaction observers (an app's `ValueObservation`) see it as they see
    /// any statement. Only the binding skips `StatementArguments`.
    ///
    /// - Throws: `DatabaseError`, as GRDB's `execute(arguments:)` would.
    package func execute(binding bind: (inout RawBinder) -> Void) throws {
        try bindForGRDB(bind)
        try execute()
    }

    /// Binds the values `bind` binds, in order, for GRDB to run the statement next (`execute()`,
    /// or a fetch with no arguments, which reset the statement and keep its bindings).
    package func bindForGRDB(_ bind: (inout RawBinder) -> Void) throws {
        // A reset of our own first: after a failed step, SQLite's reset returns that failure,
        // which GRDB's `setUncheckedArguments` would not survive.
        sqlite3_reset(sqliteStatement)
        // Empty arguments, taken as valid and bound: GRDB's next run resets the statement
        // without binding anything itself, and so keeps the values bound below.
        setUncheckedArguments(StatementArguments())
        try bindAll(bind)
    }

    private func bindAll(_ bind: (inout RawBinder) -> Void) throws {
        var binder = RawBinder(handle: sqliteStatement)
        bind(&binder)
        precondition(
            binder.index == sqlite3_bind_parameter_count(sqliteStatement),
            "\(sql): bound \(binder.index) values, the statement takes \(sqlite3_bind_parameter_count(sqliteStatement))"
        )
        if let failure = binder.failure {
            throw DatabaseError(
                resultCode: ResultCode(rawValue: failure.code),
                message:
                    "value \(failure.index) not bound: \(String(cString: sqlite3_errmsg(sqlite3_db_handle(sqliteStatement))))",
                sql: sql)
        }
    }
}
