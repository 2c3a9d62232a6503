import Foundation
import TandemClient
import TandemWire

/// Headless Chromium driven through its DevTools protocol, for tests of the live console.
///
/// The browser starts on a page and is driven by evaluating JavaScript in it
/// (`Runtime.evaluate`): a test reads the page the way a user sees it (which element is
/// there, what it says) and clicks and types through the DOM. The DevTools WebSocket is a
/// ``RawWebSocket``, so the test needs no client library for the protocol.
///
/// For example:
///
/// ```swift
/// let browser = try await HeadlessBrowser.open("http://127.0.0.1:7878/")
/// defer { browser.close() }
/// try await browser.waitUntil("the console is connected", #"document.querySelector('#status').dataset.state === 'connected'"#)
/// ```
public final class HeadlessBrowser: @unchecked Sendable {
    private let process: ChildProcess
    private let profile: TemporaryDirectory
    private let socket: RawWebSocket
    /// The last request id; requests are sent one at a time by the test.
    private var lastRequest = 0

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    /// The browser's executable: `TANDEM_CHROMIUM`, else `chromium` or `chromium-browser`
    /// from PATH (Debian's `chromium` package, which `scripts/install-deps` installs).
    public static func executable() throws -> URL {
        if let path = ProcessInfo.processInfo.environment["TANDEM_CHROMIUM"] { return URL(fileURLWithPath: path) }
        let directories = (ProcessInfo.processInfo.environment["PATH"] ?? "/usr/bin").split(separator: ":")
        for name in ["chromium", "chromium-browser", "google-chrome"] {
            for directory in directories where FileManager.default.isExecutableFile(atPath: "\(directory)/\(name)") {
                return URL(fileURLWithPath: "\(directory)/\(name)")
            }
        }
        throw Failure(description: "no Chromium found (install Debian's chromium package: scripts/install-deps does)")
    }

    /// Starts headless Chromium on `url` and connects to the page's DevTools endpoint.
    public static func open(_ url: String, width: Int = 1400, height: Int = 900) async throws -> HeadlessBrowser {
        let profile = try TemporaryDirectory()
        let process = ChildProcess()
        process.executableURL = try executable()
        process.arguments = [
            "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            "--disable-extensions", "--disable-background-networking", "--remote-debugging-port=0",
            "--user-data-dir=\(profile.url.path)", "--window-size=\(width),\(height)", url,
        ]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        do {
            // Chromium writes the port it picked to this file once DevTools listens.
            let portFile = profile.url.appendingPathComponent("DevToolsActivePort")
            var port: Int?
            try await TandemHarness.waitUntil("Chromium's DevTools listens", timeout: .seconds(60)) {
                port = (try? String(contentsOf: portFile, encoding: .utf8))?.split(separator: "\n").first
                    .flatMap { Int($0) }
                return port != nil
            }
            let page = try await pageSocketPath(port: port!, url: url)
            let socket = try await RawWebSocket.open(port: port!, path: page)
            return HeadlessBrowser(process: process, profile: profile, socket: socket)
        } catch {
            process.end(with: SIGKILL)
            throw error
        }
    }

    private init(process: ChildProcess, profile: TemporaryDirectory, socket: RawWebSocket) {
        self.process = process
        self.profile = profile
        self.socket = socket
    }

    /// The DevTools WebSocket path of the page showing `url` (`/devtools/page/ID`).
    private static func pageSocketPath(port: Int, url: String) async throws -> String {
        var path: String?
        try await TandemHarness.waitUntil("the page is listed", timeout: .seconds(30)) {
            let list = try await HTTPGet.fetch(port: port, path: "/json/list").body
            guard case .array(let targets) = try Wire.parse(Array(list.utf8)) else { return false }
            for case .object(let target) in targets where target["type"] == "page" {
                if let socket = target["webSocketDebuggerUrl"]?.stringValue,
                    let range = socket.range(of: "/devtools/")
                {
                    path = String(socket[range.lowerBound...])
                    return true
                }
            }
            return false
        }
        return path!
    }

    /// Calls a DevTools method and returns its `result`.
    ///
    /// - Throws: ``Failure`` with DevTools' error message when the call fails.
    @discardableResult
    public func call(_ method: String, _ parameters: JSONObject = [:], timeout: Duration = .seconds(30)) async throws
        -> JSONObject
    {
        lastRequest += 1
        let id = lastRequest
        let request: JSONValue = ["id": .int(Int64(id)), "method": .string(method), "params": .object(parameters)]
        try socket.send(text: Wire.encodeString(request))
        let deadline = ContinuousClock.now + timeout
        while true {
            let remaining = deadline - ContinuousClock.now
            guard remaining > .zero else { throw Failure(description: "\(method): no answer within \(timeout)") }
            let text = try await socket.readText(timeout: remaining)
            // Events (no id) and answers to earlier calls are skipped.
            guard case .object(let message) = try Wire.parse(Array(text.utf8)), message["id"]?.intValue == Int64(id)
            else { continue }
            if case .object(let error)? = message["error"] {
                throw Failure(description: "\(method): \(error["message"]?.stringValue ?? "\(error)")")
            }
            return message["result"]?.objectValue ?? [:]
        }
    }

    /// Evaluates JavaScript in the page (awaiting a promise it returns) and returns its value.
    ///
    /// - Throws: ``Failure`` with the exception's text when the script throws.
    @discardableResult
    public func evaluate(_ script: String) async throws -> JSONValue {
        let result = try await call(
            "Runtime.evaluate", ["expression": .string(script), "returnByValue": true, "awaitPromise": true])
        if case .object(let exception)? = result["exceptionDetails"] {
            let description = exception["exception"]?.objectValue?["description"]?.stringValue
            throw Failure(description: "the page threw: \(description ?? exception["text"]?.stringValue ?? "?")")
        }
        return result["result"]?.objectValue?["value"] ?? .null
    }

    /// Waits until `condition` (a JavaScript expression) is true in the page. While the page
    /// is still loading, a condition that throws (an element not there yet) counts as false.
    public func waitUntil(_ what: String, _ condition: String, timeout: Duration = .seconds(60)) async throws {
        try await TandemHarness.waitUntil(what, timeout: timeout) {
            try await self.evaluate("(() => { try { return Boolean(\(condition)) } catch (e) { return false } })()")
                == .bool(true)
        }
    }

    /// The page as a PNG.
    public func screenshot() async throws -> [UInt8] {
        let result = try await call("Page.captureScreenshot", ["format": "png"])
        guard let base64 = result["data"]?.stringValue, let data = Data(base64Encoded: base64) else {
            throw Failure(description: "Page.captureScreenshot returned no image")
        }
        return [UInt8](data)
    }

    /// Ends the browser and removes its profile.
    public func close() {
        process.end(with: SIGKILL)
    }
}
