import Foundation
import TandemClient
import TandemTesting
import TandemWire
import Testing

/// The live console, in a real browser (headless Chromium over its DevTools protocol),
/// against `tandem serve` in a process of its own, with the `tandem` command as the other
/// client.
@Suite("The live console in a browser")
struct ConsoleTests {
    @Test(
        "a document written with the CLI appears in the page; an edit made in the page reaches tandem get; /metrics counts both"
    )
    func liveConsole() async throws {
        let folder = try TemporaryDirectory()
        let server = try await ServerProcess.onStablePort(dataDirectory: folder.url)
        defer { server.send(SIGTERM) }
        let port = try #require(URLComponents(string: server.url)?.port)
        let browser = try await HeadlessBrowser.open("http://127.0.0.1:\(port)/")
        defer { browser.close() }
        try await browser.waitUntil(
            "the console connects", "document.querySelector('#status').dataset.state === 'connected'")

        let put = try await runTandem(["put", "notes", #"{"title":"Rent"}"#, "--server", server.url])
        #expect(put.status == 0, "\(put.error)")
        let id = String(put.output.split(separator: " ")[0])
        let row = "document.querySelector('#documents tr[data-id=\"\(id)\"]')"

        // The collection shows up in the tree; opening it shows the document.
        try await browser.waitUntil(
            "the tree lists notes", "document.querySelector('#collections [data-collection=\"notes\"]')")
        try await browser.evaluate("document.querySelector('#collections [data-collection=\"notes\"]').click()")
        try await browser.waitUntil("the document appears", "\(row) && \(row).textContent.includes('Rent')")
        #expect(try await browser.evaluate("\(row).dataset.version") == "1")

        // Live: a change made elsewhere reaches the page without a reload.
        let second = try await runTandem([
            "put", "notes", #"{"title":"Rent, due"}"#, "--id", id, "--server", server.url,
        ])
        #expect(second.status == 0, "\(second.error)")
        try await browser.waitUntil("the change arrives", "\(row).dataset.version === '2'")
        #expect(try await browser.evaluate("\(row).textContent.includes('Rent, due')") == .bool(true))
        #expect(
            try await browser.evaluate(
                "document.querySelector('#changes li[data-kind=\"modified\"][data-id=\"\(id)\"]') !== null")
                == .bool(true))

        // An edit in the page, saved with the version it was loaded at.
        try await browser.evaluate("\(row).click()")
        try await browser.waitUntil(
            "the editor holds the document", "document.querySelector('#editor-id').value === '\(id)'")
        try await browser.evaluate(
            #"document.querySelector('#editor-fields').value = '{"title":"Rent, paid"}'; document.querySelector('#save').click()"#
        )
        try await browser.waitUntil(
            "the save is acknowledged", "document.querySelector('#editor-message').dataset.outcome === 'saved'")
        let get = try await runTandem(["get", "notes/\(id)", "--server", server.url])
        #expect(get.status == 0, "\(get.error)")
        let document = try Wire.decode(Document.self, from: Array(get.output.utf8))
        #expect(document.fields == ["title": "Rent, paid"] && document.version == 3)

        // Someone else writes first: the page's next save with its old version is a conflict.
        let other = try await runTandem([
            "put", "notes", #"{"title":"Rent, late"}"#, "--id", id, "--server", server.url,
        ])
        #expect(other.status == 0, "\(other.error)")
        try await browser.evaluate(
            """
            document.querySelector('#editor-version').value = '3';
            document.querySelector('#editor-version').textContent = '3';
            document.querySelector('#editor-fields').value = '{"title":"mine"}';
            """)
        try await browser.waitUntil("the page heard of version 4", "\(row).dataset.version === '4'")
        try await browser.evaluate("document.querySelector('#save').click()")
        try await browser.waitUntil(
            "the conflict is shown", "document.querySelector('#editor-message').dataset.outcome === 'conflict'")
        #expect(
            try await browser.evaluate("document.querySelector('#editor-message').textContent.includes('Rent, late')")
                == .bool(true))

        // The server counted the CLI's and the page's writes.
        let metrics = try await HTTPGet.fetch(port: port, path: "/metrics").body
        #expect(metrics.contains(#"tandem_write_ops_total{op="create"} 1"#), "\(metrics)")
        #expect(metrics.contains(#"tandem_write_ops_total{op="update"} 3"#), "\(metrics)")
        // Two conflicts from `tandem put --id` (it tries a create first), one from the page.
        #expect(metrics.contains("\ntandem_conflicts_total 3\n"), "\(metrics)")

        if let path = ProcessInfo.processInfo.environment["TANDEM_CONSOLE_SCREENSHOT"] {
            try Data(try await browser.screenshot()).write(to: URL(fileURLWithPath: path))
        }

        // The page says when the connection is lost, and when it is back.
        await server.kill()
        // One look at both: the next attempt (after a fraction of a second) says "connecting…".
        try await browser.waitUntil(
            "the page says the connection is lost",
            "document.querySelector('#status').dataset.state === 'lost' "
                + "&& document.querySelector('#status').textContent.includes('connection lost')")
        try await server.start()
        try await browser.waitUntil(
            "and that it is back", "document.querySelector('#status').dataset.state === 'connected'")
        try await browser.waitUntil("with the documents again", "\(row) && \(row).dataset.version === '4'")
    }

    @Test("with access control on, the console asks for a token and connects with it")
    func token() async throws {
        let folder = try TemporaryDirectory()
        let tokens = folder.url.appendingPathComponent("tokens.json")
        try Data(#"{"tokens":{"t-alice":"alice"}}"#.utf8).write(to: tokens)
        let rules = folder.url.appendingPathComponent("rules.json")
        try Data(#"{"rules":[{"match":"notes","read":"user == \"alice\"","write":"user == \"alice\""}]}"#.utf8).write(
            to: rules)
        let server = try await ServerProcess(
            dataDirectory: folder.url.appendingPathComponent("data"),
            options: ["--tokens", tokens.path, "--rules", rules.path])
        defer { server.send(SIGTERM) }
        let port = try #require(URLComponents(string: server.url)?.port)
        let browser = try await HeadlessBrowser.open("http://127.0.0.1:\(port)/")
        defer { browser.close() }
        try await browser.waitUntil(
            "the console asks for a token",
            "document.querySelector('#token') && document.querySelector('#token').offsetParent !== null")
        try await browser.evaluate(
            "document.querySelector('#token').value = 't-alice'; document.querySelector('#connect').click()")
        try await browser.waitUntil(
            "the console connects", "document.querySelector('#status').dataset.state === 'connected'")
    }
}
