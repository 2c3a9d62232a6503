import ArgumentParser
import TandemClient

struct GetCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "get",
        abstract: "Print a document as one line of JSON.",
        discussion: "Example:\n  tandem get notes/a1B2c3D4e5F6g7H8i9J0")

    @Argument(help: "COLLECTION/ID")
    var document: String

    @OptionGroup var options: ClientOptions

    func validate() throws { _ = try parseDocumentPath(document) }

    func run() async throws {
        let (collection, id) = try parseDocumentPath(document)
        let connection = try await options.connect()
        defer { connection.close() }
        guard let found = try await request("get", { try await connection.get(collection, id) }) else {
            throw CLIError("document \(collection)/\(id) does not exist")
        }
        emit(json(found))
    }
}
