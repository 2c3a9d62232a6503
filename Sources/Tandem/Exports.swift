// An app that imports Tandem also gets the protocol client it is built on: `TandemError`,
// `ServerConnection`.
@_exported import TandemClient
import TandemSQLite

/// SQLite's process-wide settings: an app may turn SQLite's memory statistics off before it
/// opens its first database (docs/BENCHMARKS.md has why, and the figures).
public typealias SQLiteProcess = TandemSQLite.SQLiteProcess
