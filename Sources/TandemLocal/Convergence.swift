import Foundation
import GRDB
import Tandem
import TandemHarness
import TandemServer
import TandemWire

/// How one device compares with the server.
public struct DeviceComparison: Sendable, CustomStringConvertible {
    public var name: String
    /// Synced documents the device holds.
    public var documents: Int
    /// Rows not pushed yet (dirty rows and deletes), failed ones excluded.
    public var pending: Int
    /// Rows whose push failed for good.
    public var failed: Int
    /// Synced rows without a server id: after quiet, duplicates of rows that made it.
    public var duplicates: Int
    /// Server documents the device does not have.
    public var missing: [String]
    /// Documents the device has that the server does not (or has deleted).
    public var extra: [String]
    /// Documents whose fields differ from the server's.
    public var different: [String]

    public var matchesServer: Bool {
        pending == 0 && failed == 0 && duplicates == 0 && missing.isEmpty && extra.isEmpty && different.isEmpty
    }

    public var description: String {
        "\(name): \(documents) documents, \(pending) pending, \(failed) failed, \(duplicates) duplicates, "
            + "\(missing.count) missing, \(extra.count) extra, \(different.count) different"
    }
}

/// Compares devices with the server and with each other.
public struct ConvergenceReport: Sendable {
    public var devices: [DeviceComparison]
    /// Live documents on the server, in the collections compared.
    public var serverDocuments: Int
    /// The server's documents changed while the devices were read: they may match neither.
    public var serverChanged: Bool
    public var isConverged: Bool { !serverChanged && devices.allSatisfy(\.matchesServer) }

    /// Changes whenever any count changes: a report equal to the last one means no progress.
    var fingerprint: String {
        "\(serverDocuments)\(serverChanged ? " changing" : "") " + devices.map(\.description).joined(separator: "; ")
    }

    /// The first differences, for a failure message.
    public var firstDifferences: [String] {
        var lines = serverChanged ? ["the server's documents changed while the devices were read"] : []
        for device in devices {
            lines += device.missing.prefix(3).map { "\(device.name) misses \($0)" }
            lines += device.extra.prefix(3).map { "\(device.name) has extra \($0)" }
            lines += device.different.prefix(3).map { "\(device.name) differs on \($0)" }
            if device.duplicates > 0 { lines.append("\(device.name) has \(device.duplicates) duplicate rows") }
            if device.failed > 0 { lines.append("\(device.name) has \(device.failed) failed rows") }
            if device.pending > 0 { lines.append("\(device.name) has \(device.pending) pending rows") }
        }
        return lines
    }
}

/// Where the server's documents are read from: a server in this process, or the database of
/// one in another process.
public protocol ServerContents {
    /// Every collection holding at least one live document.
    func collections() async throws -> [CollectionPath]
    /// The live documents of a collection.
    func documents(in collection: CollectionPath) async throws -> [Document]
    /// Every document, tombstones included.
    func everyDocument() async throws -> [(collection: CollectionPath, document: Document)]
    /// Where a document stands in its collection's feed, for a failure's diagnosis.
    func feedExcerpt(of collection: CollectionPath, id: DocumentID, around rows: Int) async throws -> FeedExcerpt?
}

extension ServerContents {
    /// Nil: a source of documents that knows nothing of their feed.
    public func feedExcerpt(of collection: CollectionPath, id: DocumentID, around rows: Int) async throws
        -> FeedExcerpt?
    { nil }
}

extension TandemServer: ServerContents {}

/// The documents of a `tandem serve` running in another process, read from its SQLite file
/// (WAL lets a reader in while the server writes).
public struct ServerDatabase: ServerContents {
    let database: DatabaseQueue

    /// - Parameter dataDirectory: The server's `--data` folder.
    public init(dataDirectory: URL) throws {
        database = try DatabaseQueue(path: dataDirectory.appendingPathComponent("tandem.sqlite").path)
    }

    public func collections() async throws -> [CollectionPath] {
        try await database.read { db in
            try String.fetchAll(db, sql: "SELECT DISTINCT collection FROM document WHERE deleted = 0")
                .map { try CollectionPath($0) }
        }
    }

    public func documents(in collection: CollectionPath) async throws -> [Document] {
        try await database.read { db in
            try Row.fetchAll(
                db,
                sql:
                    "SELECT id, fields, version, createTime, updateTime FROM document WHERE collection = ? AND deleted = 0",
                arguments: [collection.rawValue]
            ).map { row in
                Document(
                    id: try DocumentID(row[0]), version: row[2],
                    fields: try Wire.decodeFields(Array((row[1] as String).utf8)),
                    createTime: row[3], updateTime: row[4])
            }
        }
    }

    public func feedExcerpt(of collection: CollectionPath, id: DocumentID, around rows: Int) async throws
        -> FeedExcerpt?
    {
        try await database.read { db in
            guard
                let row = try Row.fetchOne(
                    db,
                    sql: """
                        SELECT version, deleted, sequence, createSequence, createClient FROM document
                        WHERE collection = ? AND id = ?
                        """, arguments: [collection.rawValue, id.rawValue])
            else { return nil }
            let sequence: Int64 = row[2]
            let bounds = try Row.fetchOne(
                db, sql: "SELECT lastSequence, horizonSequence FROM collection WHERE path = ?",
                arguments: [collection.rawValue])
            let neighbours = try Row.fetchAll(
                db,
                sql: """
                    SELECT sequence, id, version, deleted FROM document
                    WHERE collection = ? AND sequence BETWEEN ? AND ? ORDER BY sequence
                    """, arguments: [collection.rawValue, sequence - Int64(rows), sequence + Int64(rows)]
            ).map {
                (
                    sequence: $0[0] as Int64, id: try DocumentID($0[1] as String), version: $0[2] as Int64,
                    deleted: $0[3] as Bool
                )
            }
            return FeedExcerpt(
                collection: collection, id: id, version: row[0], deleted: row[1], sequence: sequence,
                createSequence: row[3], createClient: row[4], lastSequence: bounds?[0] ?? 0,
                horizon: bounds?[1] ?? 0, neighbours: neighbours)
        }
    }

    public func everyDocument() async throws -> [(collection: CollectionPath, document: Document)] {
        try await database.read { db in
            try Row.fetchAll(
                db, sql: "SELECT collection, id, version, deleted, fields, createTime, updateTime FROM document"
            ).map { row in
                (
                    try CollectionPath(row[0] as String),
                    Document(
                        id: try DocumentID(row[1] as String), version: row[2],
                        fields: try Wire.decodeFields(Array((row[4] as String).utf8)), createTime: row[5],
                        updateTime: row[6], deleted: row[3])
                )
            }
        }
    }
}

public enum Convergence {
    private static func describe(_ value: JSONValue) -> String {
        Wire.encodeString(value)
    }

    /// Which of the server's documents a device should hold: for devices that sync only what
    /// their user may read. Given the device's name, the document, and every live document.
    public typealias Visibility =
        @Sendable (
            _ device: String, _ collection: CollectionPath, _ id: DocumentID,
            _ server: [CollectionPath: [DocumentID: JSONObject]]
        ) -> Bool

    /// Compares what each device holds with the server's live documents (those it should
    /// hold, with `visible`).
    ///
    /// The server is read before the devices and again after them, each device in one
    /// transaction (``SyncService/localState()``): a device is only converged with what the
    /// server held all along. (Read once, before, the server could take a device's push while
    /// the others were read, and they would match it without the push's documents.)
    public static func compare(
        server: some ServerContents, devices: [(name: String, service: SyncService)], visible: Visibility? = nil
    ) async throws -> ConvergenceReport {
        let before = try await liveDocuments(server)
        var states: [(name: String, state: LocalState)] = []
        for (name, service) in devices { states.append((name, try await service.localState())) }
        let everything = try await liveDocuments(server)
        var comparisons: [DeviceComparison] = []
        for (name, state) in states {
            var serverDocuments = everything
            if let visible {
                for (collection, documents) in everything {
                    serverDocuments[collection] = documents.filter { visible(name, collection, $0.key, everything) }
                }
            }
            let local = state.documents
            var comparison = DeviceComparison(
                name: name, documents: local.values.map(\.count).reduce(0, +), pending: state.pending,
                failed: state.failed, duplicates: state.unsynced, missing: [], extra: [], different: [])
            for (collection, documents) in serverDocuments {
                let mine = local[collection] ?? [:]
                for (id, fields) in documents {
                    guard let held = mine[id] else {
                        comparison.missing.append("\(collection)/\(id)")
                        continue
                    }
                    if held != fields {
                        let keys = Set(held.keys).union(fields.keys).filter { held[$0] != fields[$0] }.sorted()
                        let detail = keys.map {
                            "\($0): device \(held[$0].map(describe) ?? "absent"), server \(fields[$0].map(describe) ?? "absent")"
                        }
                        comparison.different.append("\(collection)/\(id) (\(detail.joined(separator: "; ")))")
                    }
                }
            }
            for (collection, documents) in local {
                for id in documents.keys where serverDocuments[collection]?[id] == nil {
                    comparison.extra.append("\(collection)/\(id)")
                }
            }
            comparisons.append(comparison)
        }
        return ConvergenceReport(
            devices: comparisons, serverDocuments: everything.values.map(\.count).reduce(0, +),
            serverChanged: before != everything)
    }

    /// The server's live documents, by collection and id.
    private static func liveDocuments(_ server: some ServerContents) async throws
        -> [CollectionPath: [DocumentID: JSONObject]]
    {
        var documents: [CollectionPath: [DocumentID: JSONObject]] = [:]
        for collection in try await server.collections() {
            for document in try await server.documents(in: collection) {
                documents[collection, default: [:]][document.id] = document.fields
            }
        }
        return documents
    }

    /// Pushes on every device and waits until they all match the server, up to `timeout`, or
    /// until nothing has changed for `stall` (a state that will not converge by itself; long
    /// enough for a connection attempt that takes its whole timeout on a busy machine).
    ///
    /// - Returns: The last comparison, converged or not (check ``ConvergenceReport/isConverged``).
    @discardableResult
    public static func waitUntilQuiet(
        server: some ServerContents, devices: [(name: String, service: SyncService)], visible: Visibility? = nil,
        timeout: Duration = .seconds(60), stall: Duration = .seconds(30), progress: ((ConvergenceReport) -> Void)? = nil
    ) async throws -> ConvergenceReport {
        let deadline = ContinuousClock.now + timeout
        var report = try await compare(server: server, devices: devices, visible: visible)
        var lastChange = ContinuousClock.now
        while !report.isConverged && ContinuousClock.now < deadline && ContinuousClock.now - lastChange < stall {
            for device in devices {
                _ = try? await device.service.syncNow()
            }
            try await Task.sleep(for: .milliseconds(20))
            let next = try await compare(server: server, devices: devices, visible: visible)
            if next.fingerprint != report.fingerprint { lastChange = ContinuousClock.now }
            report = next
            progress?(report)
        }
        return report
    }
}

extension Convergence {
    public static func waitUntilQuiet(server: LocalServer, devices: [LocalDevice], timeout: Duration = .seconds(60))
        async throws -> ConvergenceReport
    {
        try await waitUntilQuiet(
            server: server.server, devices: devices.map { ($0.name, $0.service) }, timeout: timeout)
    }

    public static func waitUntilQuiet(
        server: some ServerContents, devices: [LocalDevice], timeout: Duration = .seconds(60),
        progress: ((ConvergenceReport) -> Void)? = nil
    ) async throws -> ConvergenceReport {
        try await waitUntilQuiet(
            server: server, devices: devices.map { ($0.name, $0.service) }, timeout: timeout, progress: progress)
    }
}
