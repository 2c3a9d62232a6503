import ArgumentParser
import Foundation
import TandemClient

struct ExportCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "export",
        abstract: "Write every document of a server, tombstones included, as NDJSON.",
        discussion: """
            The format (docs/ADMIN.md) keeps ids, versions, times, field times and tombstones; \
            tandem import and tandem serve --import read it back. Progress goes to standard error.

            Examples:
              tandem export > backup.ndjson
              tandem export --server ws://127.0.0.1:7001 --admin-token "$TOKEN" --output backup.ndjson
            """)

    @Option(help: "Write to this file instead of standard output (written whole, or not at all).")
    var output: String?

    @OptionGroup var options: AdminOptions

    func run() async throws {
        let admin = try options.client()
        note("exporting from \(options.server)…")
        let bytes: [UInt8]
        do { bytes = try await admin.export() } catch { throw CLIError("export failed: \(error)") }
        let documents = bytes.reduce(0) { $0 + ($1 == UInt8(ascii: "\n") ? 1 : 0) }
        if let output {
            // Written beside the target and renamed, so that a failed export leaves no half file.
            let target = URL(fileURLWithPath: output)
            let partial = target.appendingPathExtension("partial")
            do {
                try Data(bytes).write(to: partial)
                _ = try? FileManager.default.removeItem(at: target)
                try FileManager.default.moveItem(at: partial, to: target)
            } catch {
                throw CLIError("cannot write \(output): \(error.localizedDescription)")
            }
        } else {
            FileHandle.standardOutput.write(Data(bytes))
        }
        note("exported \(bytes.count) bytes (\(documents) lines, with the header and a line per collection)")
    }
}
