#ifndef TANDEM_CTANDEMSQLITE_H
#define TANDEM_CTANDEMSQLITE_H

/// `sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0)`, which Swift cannot call: `sqlite3_config`
/// is variadic. Returns SQLite's result code: `SQLITE_OK`, or `SQLITE_MISUSE` once SQLite is
/// initialized (the process opened a database).
int tandem_sqlite3_disable_memory_statistics(void);

#endif
