/// The live console at `GET /`: a page served from the server's own binary that speaks
/// Tandem's protocol from the browser (collections, live documents, an editor, the connected
/// clients, fault switches, reset and export).
///
/// Plain HTML, CSS and JavaScript kept in string literals (``html``, ``style``, ``script``):
/// no files to ship beside the executable, no npm, no build step. The page uses the same
/// port as the WebSocket, the protocol of docs/PROTOCOL.md and the admin API of
/// docs/ADMIN.md, and nothing else, so what it shows is what any client would see.
enum ConsolePage {}
