/// The console's page, served at `GET /`: a header with the connection status, the collections
/// tree, the open collection's documents and change log, the document editor, and below them the
/// clients, the fault switches, reset and export.
///
/// Plain HTML that names no outside URL, so the console works offline. Its look is
/// ``ConsolePage/style`` (`/console.css`) and its behaviour ``ConsolePage/script``
/// (`/console.js`); a browser test can rely on the element ids this page defines.
extension ConsolePage {
    static let html = #"""
        <!doctype html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title>Tandem console</title>
        <!-- An empty icon, so that the browser does not ask for /favicon.ico and log a 404. -->
        <link rel="icon" href="data:,">
        <link rel="stylesheet" href="/console.css">
        <script src="/console.js" defer></script>
        </head>
        <body>
        <header class="top">
          <h1>Tandem console</h1>
          <p id="status" data-state="connecting" role="status" aria-live="polite">connecting…</p>
          <p id="status-detail" class="detail"></p>
          <p class="server">server <code id="server-url"></code></p>
          <button id="show-tokens" type="button">Tokens</button>
        </header>

        <div id="faults-banner" role="alert" hidden></div>

        <form id="token-form" class="panel" hidden>
          <p id="token-reason" class="message"></p>
          <label>User token (sent in <code>hello</code>)
            <input id="token" type="password" autocomplete="off" spellcheck="false">
          </label>
          <label>Admin token (for the /admin endpoints, optional)
            <input id="admin-token" type="password" autocomplete="off" spellcheck="false">
          </label>
          <button id="connect" type="submit">Connect</button>
          <p class="hint">Both are kept for this tab only (session storage).</p>
        </form>

        <main>
          <section id="browse" class="panel" aria-labelledby="browse-title">
            <h2 id="browse-title">Collections</h2>
            <form id="open-form" class="inline">
              <input id="collection-input" placeholder="notes or accounts/A1/transactions" spellcheck="false"
                     aria-label="Collection path">
              <button id="open" type="submit">Open</button>
            </form>
            <p id="collections-message" class="message"></p>
            <nav id="collections" aria-label="Collections"></nav>
          </section>

          <section id="view" class="panel" aria-labelledby="view-title">
            <h2 id="view-title">
              Documents <code id="open-collection"></code> <span id="document-count" class="detail"></span>
            </h2>
            <p id="documents-message" class="message"></p>
            <div class="scroll documents-scroll">
              <table id="documents" data-live="false">
                <thead><tr><th>id</th><th>version</th><th>updated</th><th>fields</th></tr></thead>
                <tbody id="document-rows"></tbody>
              </table>
            </div>
            <h3>Changes <span class="detail">(latest 50)</span></h3>
            <ol id="changes" class="changes"></ol>
          </section>

          <section id="editor" class="panel" aria-labelledby="editor-title">
            <h2 id="editor-title">Editor</h2>
            <p class="editor-where">collection <code id="editor-collection"></code></p>
            <label>Id
              <input id="editor-id" spellcheck="false" placeholder="empty: the server assigns one">
            </label>
            <p>Base version <output id="editor-version"></output></p>
            <label>Fields (a JSON object)
              <textarea id="editor-fields" spellcheck="false" rows="14"></textarea>
            </label>
            <div class="buttons">
              <button id="new" type="button">New</button>
              <button id="save" type="button" class="primary">Save</button>
              <button id="delete" type="button" class="danger">Delete</button>
            </div>
            <p id="editor-note" class="note"></p>
            <div id="editor-message" class="message" aria-live="polite"></div>
          </section>
        </main>

        <div id="admin" class="admin">
          <section class="panel" aria-labelledby="clients-title">
            <h2 id="clients-title">Clients</h2>
            <p id="clients-message" class="message"></p>
            <div class="scroll">
              <table id="clients">
                <thead>
                  <tr><th>client id</th><th>user</th><th>peer</th><th>session</th><th>queued</th><th>listens</th></tr>
                </thead>
                <tbody id="client-rows"></tbody>
              </table>
            </div>
          </section>

          <section id="faults" class="panel faults" data-enabled="false" aria-labelledby="faults-title">
            <h2 id="faults-title">Fault injection (for manual race testing)</h2>
            <p class="hint">Off by default. A fault on makes the server misbehave on purpose for every client,
              this console included: its own connection may drop and its answers may be lost.</p>
            <div class="fault">
              <label><input id="fault-lost-ack" type="checkbox"> Lost acknowledgements</label>
              <label>rate
                <input id="fault-lost-ack-rate" type="number" min="0" max="1" step="0.01" value="0.1">
              </label>
            </div>
            <div class="fault">
              <label><input id="fault-delayed-delivery" type="checkbox"> Delayed deliveries</label>
              <label>rate
                <input id="fault-delayed-delivery-rate" type="number" min="0" max="1" step="0.01" value="0.1">
              </label>
              <label>delay <input id="fault-delivery-delay-ms" type="number" min="0" step="50" value="200"> ms</label>
            </div>
            <div class="fault">
              <label><input id="fault-drop-connection" type="checkbox"> Dropped connections</label>
              <label>rate
                <input id="fault-drop-connection-rate" type="number" min="0" max="1" step="0.01" value="0.05">
              </label>
            </div>
            <button id="faults-off" type="button">Switch all off</button>
            <p id="faults-message" class="message"></p>
          </section>

          <section id="maintenance" class="panel" aria-labelledby="maintenance-title">
            <h2 id="maintenance-title">Reset and export</h2>
            <div class="inline">
              <select id="reset-scope" aria-label="What to reset">
                <option value="collection">the open collection</option>
                <option value="everything">everything</option>
              </select>
              <button id="reset" type="button" class="danger">Reset…</button>
            </div>
            <div class="inline">
              <button id="export" type="button">Export (NDJSON)</button>
            </div>
            <p id="admin-message" class="message"></p>
          </section>
        </div>
        </body>
        </html>
        """#
}
