import ArgumentParser
import Foundation
import TandemClient
import TandemWire

struct PutCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "put",
        abstract: "Create a document, or replace the one with --id. Prints its id and version.",
        discussion: """
            Examples:
              tandem put notes '{"title":"Rent","amount":-1200}'
              tandem put notes '{"title":"Rent, paid"}' --id a1B2c3D4e5F6g7H8i9J0
            """)

    @Argument(help: "The collection path, like notes or accounts/ID/transactions.")
    var collection: String

    @Argument(help: "The document's fields, a JSON object.")
    var fields: String

    @Option(help: "The document id: created with this id, or replaced if it exists.")
    var id: String?

    @OptionGroup var options: ClientOptions

    func validate() throws {
        _ = try parseCollection(collection)
        _ = try parseFields(fields)
        if let id {
            do { _ = try DocumentID(id) } catch { throw ValidationError(error.message) }
        }
    }

    func run() async throws {
        let path = try parseCollection(collection)
        let fields = try parseFields(fields)
        let documentID = try id.map(DocumentID.init)
        let connection = try await options.connect()
        defer { connection.close() }

        let key = { ClientName.key(milliseconds: Int64(Date().timeIntervalSince1970 * 1000)) }
        var reply = try await request("put") {
            try await connection.write([.create(in: path, id: documentID, fields: fields, idempotencyKey: key())])
        }
        // With --id, an existing document is replaced at the version the server reports.
        var attempts = 0
        while case .conflict(_, let server) = reply, let documentID, attempts < 5 {
            attempts += 1
            let op: WriteOp =
                server.deleted
                ? .create(in: path, id: documentID, fields: fields, idempotencyKey: key())
                : .update(in: path, id: documentID, fields: fields, baseVersion: server.version, idempotencyKey: key())
            reply = try await request("put") { try await connection.write([op]) }
        }
        let result = try reply.results("put")[0]
        emit("\(result.id) \(result.version)")
    }
}
