/// The live console at `GET /`: a page served from the server's own binary that speaks
/// Tandem's protocol from the browser (collections, live documents, an editor, the connected
/// clients, fault switches, reset and export).
///
/// Plain HTML, CSS and JavaScript, in files of their own beside this one (`console.html`,
/// `console.css`, `console.js`), which SwiftPM embeds in the binary at build time
/// (`.embedInCode`): nothing to ship beside the executable, no npm, no build step, and the files
/// can be read, linted and edited as what they are. The page uses the same port as the
/// WebSocket, the protocol of docs/PROTOCOL.md and the admin API of docs/ADMIN.md, and nothing
/// else, so what it shows is what any client would see.
///
/// - `console.html`, served at `/`: a header with the connection status, the collections tree,
///   the open collection's documents and change log, the document editor, and below them the
///   clients, the fault switches, reset and export. It names no outside URL, so the console
///   works offline; a browser test relies on the element ids it defines.
/// - `console.css`, at `/console.css`: a light theme in the system font, three columns that fold
///   into one on narrow screens, monospace for ids and JSON, highlights for the rows a snapshot
///   just changed. No images, no web fonts.
/// - `console.js`, at `/console.js`: plain JavaScript in one function. It speaks the protocol
///   over a WebSocket to the server that served the page (`hello` with the user token if one was
///   given, one `listen` on the open collection resumed from its last `resumeToken` after a
///   reconnection, the editor's writes, sent again unchanged under the same idempotency keys when
///   the connection drops before their answer) and calls `/admin` with `fetch` and the admin
///   token. What the server sends reaches the page through `textContent` only. Its pure functions
///   (tree building, applying snapshot changes, the fault switches' request body) do not touch
///   the page: run without one (`node console.js`), the script hands them to
///   `globalThis.tandemConsoleLogic` for a test and stops.
enum ConsolePage {
    static var html: [UInt8] { PackageResources.console_html }
    static var style: [UInt8] { PackageResources.console_css }
    static var script: [UInt8] { PackageResources.console_js }
}
