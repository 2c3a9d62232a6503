import ArgumentParser
import TandemSQLite

@main
enum Main {
    static func main() async {
        // First thing, before any command opens a database: SQLite reads its process-wide
        // settings once.
        SQLiteProcess.disableMemoryStatistics()
        await TandemCommand.main()
    }
}

struct TandemCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tandem",
        abstract: "Offline-first realtime sync for SQLite apps, and its companion server.",
        discussion: """
            Start a server, then write and watch documents from other terminals:

              tandem serve --data ./tandem-data
              tandem watch notes
              tandem put notes '{"title":"Rent"}'
              tandem delete notes/ID
            """,
        subcommands: [
            DemoCommand.self, ServeCommand.self, PutCommand.self, GetCommand.self, DeleteCommand.self,
            WatchCommand.self, ExportCommand.self, ImportCommand.self, BenchCommand.self, SoakCommand.self,
            EchoServerCommand.self, DeviceCommand.self,
        ]
    )
}
