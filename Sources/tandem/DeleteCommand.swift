import ArgumentParser
import Foundation
import TandemClient
import TandemWire

struct DeleteCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "delete",
        abstract: "Delete a document. Prints its id and the tombstone's version.",
        discussion: "Example:\n  tandem delete notes/a1B2c3D4e5F6g7H8i9J0")

    @Argument(help: "COLLECTION/ID")
    var document: String

    @OptionGroup var options: ClientOptions

    func validate() throws { _ = try parseDocumentPath(document) }

    func run() async throws {
        let (collection, id) = try parseDocumentPath(document)
        let connection = try await options.connect()
        defer { connection.close() }
        let reply = try await request("delete") {
            try await connection.write([
                .delete(
                    in: collection, id: id, baseVersion: nil,
                    idempotencyKey: ClientName.key(milliseconds: Int64(Date().timeIntervalSince1970 * 1000)))
            ])
        }
        let result = try reply.results("delete \(collection)/\(id)")[0]
        emit("deleted \(result.id) \(result.version)")
    }
}
