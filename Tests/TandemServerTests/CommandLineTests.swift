import Foundation
import Synchronization
import TandemTesting
import Testing

/// Runs the `tandem` executable and returns its exit status, standard output and error.
///
/// The wait happens on a thread of its own: blocking one of Swift concurrency's few threads
/// for the seconds a command takes would starve the other tests running meanwhile.
func runTandem(
    _ arguments: [String], by name: String? = nil, in folder: URL? = nil, environment: [String: String]? = nil
) async throws -> (status: Int32, output: String, error: String) {
    let process = ChildProcess()
    if let name {
        // Started by name, as a shell would: through /usr/bin/env and PATH.
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = [name] + arguments
    } else {
        process.executableURL = try ServerProcess.findExecutable()
        process.arguments = arguments
    }
    if let folder { process.currentDirectoryURL = folder }
    if let environment { process.environment = environment }
    let output = Pipe(), error = Pipe()
    process.standardOutput = output
    process.standardError = error
    try process.run()
    return try await onOwnThread {
        // Standard error is read on another thread, so that neither pipe can fill up and
        // block the process while this one waits on the other.
        let err = Mutex(Data())
        let errorRead = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            let data = error.fileHandleForReading.readDataToEndOfFile()
            err.withLock { $0 = data }
            errorRead.signal()
        }
        let out = output.fileHandleForReading.readDataToEndOfFile()
        errorRead.wait()
        process.waitUntilExit()
        let errorText = err.withLock { String(decoding: $0, as: UTF8.self) }
        return (process.terminationStatus, String(decoding: out, as: UTF8.self), errorText)
    }
}

@Suite("The tandem command")
struct CommandLineTests {
    @Test("tandem serve runs with SQLite's memory statistics off, as SQLite itself reports")
    func sqliteMemoryStatisticsOff() async throws {
        let folder = try TemporaryDirectory()
        let server = try await ServerProcess(dataDirectory: folder.url)
        defer { server.send(SIGTERM) }
        func storeLine() -> String? { server.standardOutputLines.first { $0.hasPrefix("store: ") } }
        try await waitUntil("tandem serve names its store") { storeLine() != nil }
        let line = try #require(storeLine())
        #expect(line.hasSuffix(", SQLite memory statistics off"), "\(line)")
    }

    @Test("put, get, delete and watch work against tandem serve")
    func roundTrip() async throws {
        let folder = try TemporaryDirectory()
        let server = try await ServerProcess(dataDirectory: folder.url)
        defer { server.send(SIGTERM) }

        let watch = ChildProcess()
        watch.executableURL = server.executable
        watch.arguments = ["watch", "notes", "--server", server.url]
        let watched = Pipe()
        let watchNotes = Pipe()
        watch.standardOutput = watched
        watch.standardError = watchNotes
        try watch.run()
        // The watcher is listening before the first put: otherwise, on a busy machine, its
        // initial snapshot could already hold a later version than the first change.
        let notes = Mutex("")
        let notesReader = watchNotes.fileHandleForReading
        Thread.detachNewThread {
            while case let chunk = notesReader.availableData, !chunk.isEmpty {
                notes.withLock { $0 += String(decoding: chunk, as: UTF8.self) }
            }
        }
        try await waitUntil("the watcher is up to date") { notes.withLock { $0.contains("# up to date") } }

        let put = try await runTandem(["put", "notes", #"{"title":"Rent"}"#, "--server", server.url])
        #expect(put.status == 0, "\(put.error)")
        let parts = put.output.split(separator: " ")
        let id = String(parts[0])
        #expect(parts.last?.trimmingCharacters(in: .whitespacesAndNewlines) == "1")

        let replaced = try await runTandem([
            "put", "notes", #"{"title":"Rent, paid"}"#, "--id", id, "--server", server.url,
        ])
        #expect(replaced.output == "\(id) 2\n")

        let got = try await runTandem(["get", "notes/\(id)", "--server", server.url])
        #expect(got.output.contains(#""title":"Rent, paid""#))

        let deleted = try await runTandem(["delete", "notes/\(id)", "--server", server.url])
        #expect(deleted.output == "deleted \(id) 3\n")

        let missing = try await runTandem(["get", "notes/\(id)", "--server", server.url])
        #expect(missing.status == 1)
        #expect(missing.error.contains("does not exist"))

        // The watcher printed each change as it happened.
        let collected = Mutex("")
        let reader = watched.fileHandleForReading
        Thread.detachNewThread {
            while case let chunk = reader.availableData, !chunk.isEmpty {
                collected.withLock { $0 += String(decoding: chunk, as: UTF8.self) }
            }
        }
        try await waitUntil("the watcher printed three changes") {
            collected.withLock { $0.filter { $0 == "\n" }.count >= 3 }
        }
        let lines = collected.withLock { $0 }
        let printed = lines.split(separator: "\n").map(String.init)
        #expect(printed[0] == #"added \#(id) 1 {"title":"Rent"}"#)
        #expect(printed[1] == #"modified \#(id) 2 {"title":"Rent, paid"}"#)
        #expect(printed[2] == "deleted \(id) 3 {}")
        kill(watch.processIdentifier, SIGINT)
        await watch.exited()
        #expect(watch.terminationStatus == 0)
    }

    @Test("tandem watch with --where, --order-by and --limit prints the view's changes with their positions")
    func watchQuery() async throws {
        let folder = try TemporaryDirectory()
        let server = try await ServerProcess(dataDirectory: folder.url)
        defer { server.send(SIGTERM) }
        for (title, rank) in [("low", 1), ("high", 9)] {
            let put = try await runTandem([
                "put", "tasks", #"{"title":"\#(title)","rank":\#(rank)}"#, "--server", server.url,
            ])
            #expect(put.status == 0, "\(put.error)")
        }
        let watch = ChildProcess()
        watch.executableURL = server.executable
        watch.arguments = [
            "watch", "tasks", "--where", "rank > 0", "--order-by", "rank:desc", "--limit", "2", "--server", server.url,
        ]
        let output = Pipe()
        watch.standardOutput = output
        watch.standardError = FileHandle.nullDevice
        try watch.run()
        let collected = Mutex("")
        let reader = output.fileHandleForReading
        Thread.detachNewThread {
            while case let chunk = reader.availableData, !chunk.isEmpty {
                collected.withLock { $0 += String(decoding: chunk, as: UTF8.self) }
            }
        }
        try await waitUntil("the view is printed") { collected.withLock { $0.filter { $0 == "\n" }.count >= 2 } }
        let middle = try await runTandem(["put", "tasks", #"{"title":"middle","rank":5}"#, "--server", server.url])
        let id = String(middle.output.split(separator: " ")[0])
        try await waitUntil("the new document pushes the lowest out") {
            collected.withLock { $0.filter { $0 == "\n" }.count >= 4 }
        }
        let lines = collected.withLock { $0 }.split(separator: "\n").map(String.init)
        #expect(lines[0].hasPrefix("added ") && lines[0].hasSuffix(#" 1 -1 0 {"rank":9,"title":"high"}"#), "\(lines)")
        #expect(lines[1].hasSuffix(#" 1 -1 1 {"rank":1,"title":"low"}"#), "\(lines)")
        #expect(lines[2].hasPrefix("removed ") && lines[2].hasSuffix(#" 1 1 -1 {"rank":1,"title":"low"}"#), "\(lines)")
        #expect(lines[3] == #"added \#(id) 1 -1 1 {"rank":5,"title":"middle"}"#, "\(lines)")
        kill(watch.processIdentifier, SIGINT)
        await watch.exited()
    }

    @Test(
        "bad arguments and an unreachable server give one line and a non-zero exit",
        arguments: [
            (["put", "notes/x", "{}"], "even number of segments"),
            (["put", "notes", "[1]"], "must be a JSON object"),
            (["get", "notes"], "is not COLLECTION/ID"),
            (["serve", "--port", "70000"], "--port must be between 0 and 65535"),
            (["serve", "--host", "0.0.0.0", "--port", "0"], "only listens on loopback"),
            (["get", "notes/x", "--server", "ws://127.0.0.1:1"], "Is `tandem serve` running?"),
            (["watch", "notes", "--server", "ws://127.0.0.1:1"], "Is `tandem serve` running?"),
            (["watch", "notes", "--server", "http://example.com"], "must be a ws:// or wss:// URL"),
            (["watch", "notes", "--where", "a has 1"], "expected FIELD OP VALUE"),
            (["watch", "notes", "--where", "a in 1"], "in takes a non-empty JSON array"),
            (["watch", "notes", "--where", "a == alice"], "the value must be JSON"),
            (["watch", "notes", "--order-by", "a:up"], "expected FIELD, FIELD:asc or FIELD:desc"),
            (["export", "--server", "wss://127.0.0.1:1"], "speaks plain HTTP"),
            (["import", "/nonexistent.ndjson"], "cannot read /nonexistent.ndjson"),
            (["serve", "--memory", "--data", "/tmp/x"], "give one of them at most"),
            (["serve", "--postgres-timeout", "5"], "--postgres-timeout applies to --postgres only"),
            (
                ["serve", "--postgres", "postgresql://tandem@/x", "--postgres-timeout", "0"],
                "--postgres-timeout is in seconds, between 0.1 and 3600, not 0.0"
            ),
        ])
    func badArguments(arguments: [String], message: String) async throws {
        let result = try await runTandem(arguments)
        #expect(result.status != 0)
        #expect(result.error.contains(message), "\(result.error)")
    }

    @Test("tandem export and import move a server's documents; serve --memory --import seeds a throwaway server")
    func exportImport() async throws {
        let folder = try TemporaryDirectory()
        let source = try await ServerProcess(dataDirectory: folder.url.appendingPathComponent("source"))
        defer { source.send(SIGTERM) }
        for title in ["Rent", "Food"] {
            let put = try await runTandem(["put", "notes", #"{"title":"\#(title)"}"#, "--server", source.url])
            #expect(put.status == 0, "\(put.error)")
        }
        let file = folder.url.appendingPathComponent("export.ndjson")
        let exported = try await runTandem(["export", "--server", source.url, "--output", file.path])
        #expect(exported.status == 0, "\(exported.error)")
        #expect(exported.error.contains("exported"), "\(exported.error)")
        let original = try String(contentsOf: file, encoding: .utf8).split(separator: "\n")
        #expect(original.count == 4)  // the header, the collection, two documents

        let seeded = try await ServerProcess(
            arguments: ["serve", "--port", "0", "--memory", "--import", file.path, "--log-level", "warning"])
        defer { seeded.send(SIGTERM) }
        let copy = try await runTandem(["export", "--server", seeded.url])
        #expect(copy.status == 0, "\(copy.error)")
        // The same documents at the same places in the feed; only the header (epoch, time) differs.
        #expect(Array(copy.output.split(separator: "\n").dropFirst()) == Array(original.dropFirst()))

        let again = try await runTandem(["import", file.path, "--server", seeded.url])
        #expect(again.status != 0)
        #expect(
            again.error.contains("nothing was imported") && again.error.contains("exists on this server"),
            "\(again.error)")

        let empty = try await ServerProcess(dataDirectory: folder.url.appendingPathComponent("empty"))
        defer { empty.send(SIGTERM) }
        let loaded = try await runTandem(["import", file.path, "--server", empty.url])
        #expect(loaded.status == 0, "\(loaded.error)")
        #expect(loaded.output == "imported 2 documents into 1 collections\n")
    }

    @Test("tandem bench --quick runs every scenario and prints a figure, a goal and a floor ratio for each")
    func benchSmoke() async throws {
        // Correctness only: a debug build's figures say nothing about speed.
        let run = try await runTandem(["bench", "all", "--quick", "--json"])
        #expect(run.status == 0, "\(run.error.suffix(2000))")
        let results = try run.output.split(separator: "\n").map { line in
            try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
        }
        let scenarios = results.compactMap { $0["scenario"] as? String }
        #expect(
            scenarios == [
                "propagation", "throughput", "snapshot", "fanout", "fanout-10k", "server", "apply", "connections",
                "cluster", "queries", "query-limit", "transports",
            ])
        for result in results {
            let value = try #require(result["value"] as? Double)
            #expect(value > 0, "\(result)")
            #expect(result["goal"] is String)
            let ratio = try #require(result["floorRatio"] as? Double, "\(result)")
            #expect(ratio > 0)
        }
    }

    @Test(
        "tandem watch --where resumes across a server SIGKILL with the ids of its view: no reset, each change once, in place"
    )
    func watchQueryResumes() async throws {
        let folder = try TemporaryDirectory()
        let server = try await ServerProcess.onStablePort(dataDirectory: folder.url)
        defer { server.send(SIGTERM) }
        let watch = try RunningTandem([
            "watch", "notes", "--where", "n >= 0", "--order-by", "n:desc", "--server", server.url,
        ])
        defer { watch.interrupt() }
        var ids: [String] = []
        func put(_ n: Int) async throws { ids.append(try await putNote(n, server)) }
        for n in 0..<3 { try await put(n) }
        try await waitUntil("the watcher printed three changes") { watch.outputLines.count >= 3 }
        await server.kill(SIGKILL)
        try await waitUntil("the watcher noticed") { watch.errorLines.contains { $0.contains("connection lost") } }
        try await server.restart()
        for n in 3..<6 { try await put(n) }
        try await waitUntil("the changes after the restart") { watch.outputLines.count >= 6 }
        // Each change once: six additions. Applied in order at their indexes (two puts may
        // share a snapshot on a busy machine, whose additions then come in query order), they
        // give the view: n descending.
        var view: [String] = []
        for line in watch.outputLines {
            let words = line.split(separator: " ").map(String.init)
            guard words.count >= 5, let oldIndex = Int(words[3]), let newIndex = Int(words[4]) else {
                Issue.record("not a change line: \(line)")
                continue
            }
            #expect(words[0] == "added" && words[2] == "1" && oldIndex == -1, "\(line)")
            if (0...view.count).contains(newIndex) { view.insert(words[1], at: newIndex) }
        }
        #expect(watch.outputLines.count == 6, "\(watch.outputLines)")
        #expect(view == ids.reversed(), "\(watch.outputLines)")
        #expect(!watch.errorLines.contains { $0.contains("reset") }, "\(watch.errorLines)")
        #expect(watch.errorLines.contains { $0.contains("reconnected") }, "\(watch.errorLines)")
    }

    @Test("tandem watch keeps running across a server SIGKILL and restart, and prints every change once")
    func watchSurvivesRestarts() async throws {
        let folder = try TemporaryDirectory()
        let server = try await ServerProcess.onStablePort(dataDirectory: folder.url)
        defer { server.send(SIGTERM) }
        let watch = try RunningTandem(["watch", "notes", "--server", server.url])
        defer { watch.interrupt() }
        var ids: [String] = []
        func put(_ n: Int) async throws { ids.append(try await putNote(n, server)) }
        for n in 0..<3 { try await put(n) }
        try await waitUntil("the watcher printed three changes") { watch.outputLines.count >= 3 }

        for restart in 0..<2 {
            await server.kill(SIGKILL)
            try await waitUntil("the watcher noticed") {
                watch.errorLines.filter { $0.contains("connection lost") }.count > restart
            }
            try await server.restart()
            for n in 0..<3 { try await put(10 * (restart + 1) + n) }
            let expected = 3 * (restart + 2)
            try await waitUntil("the watcher printed the changes after the restart") {
                watch.outputLines.count >= expected
            }
        }
        // A marker last: once it is printed, nothing printed before can still be on its way.
        try await put(99)
        try await waitUntil("the marker is printed") { watch.outputLines.count >= ids.count }
        let printed = watch.outputLines.map { $0.split(separator: " ")[1] }.map(String.init)
        #expect(printed == ids, "each change once, in order: \(watch.outputLines)")
        #expect(watch.outputLines.allSatisfy { $0.hasPrefix("added ") })
        #expect(watch.errorLines.contains { $0.contains("reconnected") }, "\(watch.errorLines)")
        #expect(watch.isRunning)
    }

    @Test("tandem soak and tandem bench work when run by name from PATH, from any folder")
    func runByNameFromPath() async throws {
        let elsewhere = try TemporaryDirectory()
        let folder = try ServerProcess.findExecutable().deletingLastPathComponent().path
        let environment = ["PATH": "\(folder):/usr/bin:/bin"]
        let soak = try await runTandem(
            ["soak", "--devices", "2", "--ops", "40", "--seed", "1", "--server-restarts", "1"],
            by: "tandem", in: elsewhere.url, environment: environment)
        #expect(soak.status == 0, "\(soak.output.suffix(1000)) \(soak.error.suffix(1000))")
        let bench = try await runTandem(
            ["bench", "connections", "--quick"], by: "tandem", in: elsewhere.url, environment: environment)
        #expect(bench.status == 0, "\(bench.error.suffix(1000))")
    }
}

/// A `tandem` command left running (a watcher), its output collected line by line.
final class RunningTandem: Sendable {
    private let process: ChildProcess
    private let lines = Mutex<(output: [String], error: [String])>(([], []))

    init(_ arguments: [String]) throws {
        let process = ChildProcess()
        process.executableURL = try ServerProcess.findExecutable()
        process.arguments = arguments
        let output = Pipe(), error = Pipe()
        process.standardOutput = output
        process.standardError = error
        try process.run()
        self.process = process
        readLines(of: output.fileHandleForReading) { [weak self] line in self?.lines.withLock { $0.output.append(line) }
        }
        readLines(of: error.fileHandleForReading) { [weak self] line in self?.lines.withLock { $0.error.append(line) } }
    }

    var outputLines: [String] { lines.withLock { $0.output } }
    var errorLines: [String] { lines.withLock { $0.error } }
    var isRunning: Bool { process.isRunning }

    /// SIGINT; a thread of its own waits for the exit (this runs in `defer`, which cannot).
    func interrupt() {
        process.end(with: SIGINT)
    }
}

/// `tandem put notes {"n":N}` against a server in its own process; the new document's id.
private func putNote(_ n: Int, _ server: ServerProcess) async throws -> String {
    let put = try await runTandem(["put", "notes", #"{"n":\#(n)}"#, "--server", server.url])
    #expect(put.status == 0, "\(put.error)")
    return String(put.output.split(separator: " ")[0])
}
