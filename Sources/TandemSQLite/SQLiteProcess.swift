import CTandemSQLite
import GRDBSQLite

/// Settings of SQLite that hold for the whole process.
///
/// SQLite counts the memory it allocates unless told not to (`SQLITE_CONFIG_MEMSTATUS`), and
/// the count is kept under one lock for the whole process. Debian's libsqlite3 is built without
/// SQLite's own small-allocation cache (`SQLITE_OMIT_LOOKASIDE`), so every value bound, every
/// row read and every cursor takes that lock: the server, and in the benchmarks the devices
/// too, all wait for one another on it. Turned off, the throughput benchmark gains about an
/// eighth (docs/BENCHMARKS.md has the figures).
///
/// The count serves only `sqlite3_memory_used()`, `sqlite3_memory_highwater()` and the soft
/// heap limit (`sqlite3_soft_heap_limit64`), which then no longer work. `tandem` turns it off
/// first thing; an app that uses none of them may do the same before it opens its first
/// database.
public enum SQLiteProcess {
    /// Turns SQLite's memory statistics off for this process. It must come before the process
    /// opens its first database (SQLite reads its settings once); later it changes nothing and
    /// returns false.
    @discardableResult
    public static func disableMemoryStatistics() -> Bool {
        tandem_sqlite3_disable_memory_statistics() == SQLITE_OK
    }

    /// Whether SQLite counts its memory in this process, read from SQLite itself: with the
    /// statistics off its count stays at zero. Meaningful once a database is open.
    public static var keepsMemoryStatistics: Bool { sqlite3_memory_used() > 0 }
}
