import ArgumentParser
import Foundation
import TandemClient

struct ImportCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "import",
        abstract: "Load an export (NDJSON from tandem export) into a server, all or nothing.",
        discussion: """
            Documents keep their ids, versions, times and field times. An import never \
            overwrites: if one of the file's documents exists on the server, nothing is imported \
            (reset the collection first: POST /admin/reset?collection=PATH, or the console's reset).

            Example:
              tandem import backup.ndjson --server ws://127.0.0.1:7878
            """)

    @Argument(help: "The export file.")
    var file: String

    @OptionGroup var options: AdminOptions

    func validate() throws {
        guard FileManager.default.isReadableFile(atPath: file) else { throw ValidationError("cannot read \(file)") }
    }

    func run() async throws {
        let admin = try options.client()
        let bytes: [UInt8]
        do { bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: file))) } catch {
            throw CLIError("cannot read \(file): \(error.localizedDescription)")
        }
        note("sending \(file) (\(bytes.count) bytes) to \(options.server)…")
        do {
            let summary = try await admin.importDocuments(bytes)
            emit("imported \(summary.documents) documents into \(summary.collections) collections")
        } catch {
            throw CLIError("import failed: \(error)")
        }
    }
}
