import Foundation
import GRDB
import Synchronization
import TandemHarness
import TandemLocal
import TandemSocket
import TandemWire

/// What the machine can do without Tandem, to measure Tandem against.
package enum Floors {
    /// Sends every message back.
    package final class Echo: WebSocketDelegate {
        package init() {}
        package func webSocketDidOpen(_ connection: WebSocketConnection) {}
        package func webSocket(_ connection: WebSocketConnection, didReceive message: WebSocketMessage) {
            try? connection.send(OutboundMessage(text: message.bytes))
        }
        package func webSocket(_ connection: WebSocketConnection, didCloseWith event: WebSocketCloseEvent) {}
    }

    /// A raw libwebsockets echo of 400-byte messages: sequential round trips, then pipelined
    /// messages per second.
    static func echo(messages: Int) throws -> (roundTrip: Latencies, perSecond: Double) {
        final class Counter: WebSocketDelegate {
            let received = Atomic<Int>(0)
            func webSocketDidOpen(_ connection: WebSocketConnection) {}
            func webSocket(_ connection: WebSocketConnection, didReceive message: WebSocketMessage) {
                received.add(1, ordering: .releasing)
            }
            func webSocket(_ connection: WebSocketConnection, didCloseWith event: WebSocketCloseEvent) {}
        }
        let server = try WebSocketServer(port: 0, delegate: Echo())
        defer { server.shutdown() }
        let client = try WebSocketClient()
        defer { client.shutdown() }
        let counter = Counter()
        let connection = try client.connect(to: "ws://127.0.0.1:\(server.port)/", delegate: counter)
        let payload = OutboundMessage(text: String(repeating: "x", count: 400))
        while !connection.isOpen { usleep(100) }

        var roundTrips = Latencies()
        for _ in 0..<min(messages, 2000) {
            let before = counter.received.load(ordering: .acquiring)
            let start = ContinuousClock.now
            try connection.send(payload)
            while counter.received.load(ordering: .acquiring) == before {}
            roundTrips.record(ContinuousClock.now - start)
        }
        let base = counter.received.load(ordering: .acquiring)
        let start = ContinuousClock.now
        var sent = 0
        while sent < messages {
            if sent - (counter.received.load(ordering: .acquiring) - base) < 512 {
                try connection.send(payload)
                sent += 1
            }
        }
        while counter.received.load(ordering: .acquiring) - base < messages {}
        return (roundTrips, Double(messages) / (ContinuousClock.now - start).seconds)
    }

    /// Raw SQLite inserts of the benchmark's rows through one prepared statement, in one
    /// transaction, in a fresh WAL database: rows per second.
    static func sqliteInserts(rows: Int) throws -> Double {
        let folder = try TemporaryDirectory(prefix: "tandem-floor")
        var configuration = Configuration()
        configuration.journalMode = .wal
        let database = try DatabaseQueue(path: folder.path("floor.sqlite"), configuration: configuration)
        try database.write { db in
            try db.execute(
                sql: "CREATE TABLE item (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT, amount INTEGER, note TEXT)")
        }
        let start = ContinuousClock.now
        try database.write { db in
            let statement = try db.makeStatement(sql: "INSERT INTO item (title, amount, note) VALUES (?, ?, ?)")
            for index in 0..<rows { try statement.execute(arguments: ["item \(index)", index, BenchModel.note]) }
        }
        return Double(rows) / (ContinuousClock.now - start).seconds
    }

    /// Raw SQLite, in a table of `rows` rows of the benchmark's shape with a unique text key:
    /// find a row by its key and update it, one transaction (WAL, synchronous NORMAL, as the
    /// devices) per change. The median in milliseconds.
    static func indexedUpdate(rows: Int, changes: Int) throws -> Double {
        let folder = try TemporaryDirectory(prefix: "tandem-floor")
        var configuration = Configuration()
        configuration.journalMode = .wal
        configuration.prepareDatabase { db in try db.execute(sql: "PRAGMA synchronous = NORMAL") }
        let database = try DatabaseQueue(path: folder.path("floor.sqlite"), configuration: configuration)
        try database.write { db in
            try db.execute(
                sql: """
                    CREATE TABLE item (id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE, title TEXT,
                        amount INTEGER, note TEXT)
                    """)
            let statement = try db.makeStatement(sql: "INSERT INTO item (key, title, amount, note) VALUES (?, ?, ?, ?)")
            for index in 0..<rows {
                try statement.execute(arguments: ["key-\(index)", "item \(index)", index, BenchModel.note])
            }
        }
        var durations: [Duration] = []
        for change in 0..<changes {
            let start = ContinuousClock.now
            try database.write { db in
                try db.cachedStatement(sql: "UPDATE item SET amount = ? WHERE key = ?")
                    .execute(arguments: [-change, "key-\((change * 7919) % rows)"])
            }
            durations.append(ContinuousClock.now - start)
        }
        return Double(durations.sorted()[durations.count / 2].microseconds) / 1000
    }

    /// Encoding and decoding the benchmark's documents as snapshot messages of 500: documents
    /// per second, encode and decode together.
    static func json(documents: Int) throws -> Double {
        let changes = try (0..<500).map { index in
            Change(
                .added,
                Document(
                    id: try DocumentID("doc\(index)"), version: 1, fields: BenchModel.fields(index), createTime: 0,
                    updateTime: 0))
        }
        let message = ServerMessage.snapshot(
            .init(target: "items", changes: changes, resumeToken: "e.1", initial: false))
        let start = ContinuousClock.now
        var done = 0
        while done < documents {
            let bytes = Wire.encode(message)
            _ = try Wire.decode(ServerMessage.self, from: bytes)
            done += 500
        }
        return Double(done) / (ContinuousClock.now - start).seconds
    }
}
