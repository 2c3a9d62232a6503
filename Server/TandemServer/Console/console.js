// Tandem console: the page's script. Plain JavaScript, no build step, no dependencies.
// It speaks the Tandem protocol (docs/PROTOCOL.md) over a WebSocket to the server that
// served the page, and calls the same server's /admin endpoints with fetch.
//
// Documents are user data: everything the server sends reaches the page through
// textContent, never innerHTML.
(function () {
    "use strict";

    // -----------------------------------------------------------------------------------------
    // Pure logic: no page, no network, so that node can test it (see the end of the script).

    const FIRST_RETRY_MS = 500; // reconnection waits 0.5 s, then twice as long each time...
    const LAST_RETRY_MS = 8000; // ...up to 8 s
    const NAME_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

    // The fault switches of the page. rejectedWriteRate has no switch (it is set from the
    // command line), but it is reported and kept.
    const FAULT_KINDS = [
        { key: "lostAckRate", id: "fault-lost-ack", label: "lost acknowledgements" },
        { key: "delayedDeliveryRate", id: "fault-delayed-delivery", label: "delayed deliveries" },
        { key: "dropConnectionRate", id: "fault-drop-connection", label: "dropped connections" },
    ];
    const REJECTED_WRITES = { key: "rejectedWriteRate", label: "rejected writes" };

    /** Whether `path` has the shape of a collection path: an odd number of non-empty segments. */
    function isCollectionPath(path) {
        const segments = path.split("/");
        return segments.length % 2 === 1 && segments.every((segment) => segment.length > 0);
    }

    /**
     * Builds the collections tree from the list /admin/collections answers.
     *
     * A path's segments alternate collection and document, so the tree does too:
     * "accounts/A1/transactions" is the collection "transactions" of the document "A1" of the
     * collection "accounts". A parent the list does not name itself (all its documents may be
     * gone while a nested collection still has some) gets `documents: null`.
     *
     * For example, [{path: "accounts/A1/transactions", documents: 2}] gives
     *     [{name: "accounts", path: "accounts", documents: null, children: [
     *         {id: "A1", path: "accounts/A1", collections: [
     *             {name: "transactions", path: "accounts/A1/transactions", documents: 2, children: []}]}]}]
     *
     * Collections and documents come sorted by name; entries that are not collection paths
     * are left out.
     */
    function buildTree(entries) {
        const top = new Map(); // name → collection node, with Maps while the tree is built
        for (const entry of entries) {
            if (typeof entry.path !== "string" || !isCollectionPath(entry.path)) continue;
            const segments = entry.path.split("/");
            let level = top;
            let collection = null;
            for (let i = 0; i < segments.length; i += 2) {
                collection = getOrAdd(level, segments[i], () => ({
                    name: segments[i],
                    path: segments.slice(0, i + 1).join("/"),
                    documents: null,
                    children: new Map(),
                }));
                if (i + 1 < segments.length) {
                    const doc = getOrAdd(collection.children, segments[i + 1], () => ({
                        id: segments[i + 1],
                        path: segments.slice(0, i + 2).join("/"),
                        collections: new Map(),
                    }));
                    level = doc.collections;
                }
            }
            collection.documents = typeof entry.documents === "number" ? entry.documents : null;
        }
        return sortedCollections(top);
    }

    function getOrAdd(map, key, make) {
        if (!map.has(key)) map.set(key, make());
        return map.get(key);
    }

    /** The finished tree: the Maps of the tree under construction become sorted arrays. */
    function sortedCollections(map) {
        return sortedValues(map).map((collection) => ({
            name: collection.name,
            path: collection.path,
            documents: collection.documents,
            children: sortedValues(collection.children).map((doc) => ({
                id: doc.id,
                path: doc.path,
                collections: sortedCollections(doc.collections),
            })),
        }));
    }

    function sortedValues(map) {
        return [...map.keys()].sort().map((key) => map.get(key));
    }

    /**
     * Applies a snapshot's changes to `docs` (a Map id → document) and returns what each did to
     * the view: [{kind: "added" | "modified" | "deleted", id, document, known}], where `known`
     * says whether the view held the document before.
     *
     * The kind is decided by what the view holds, as the protocol asks clients to do: `added`
     * for a known id is a modification, `modified` for an unknown id an addition, and any
     * change that carries a tombstone (`deleted: true`) is a deletion. A deletion of a
     * document the view never held is still returned, for the change log.
     */
    function applyChanges(docs, changes) {
        const effects = [];
        for (const change of changes) {
            const doc = withoutKind(change);
            const known = docs.has(change.id);
            let kind;
            if (change.kind === "deleted" || change.deleted === true) {
                docs.delete(change.id);
                kind = "deleted";
            } else {
                docs.set(change.id, doc);
                kind = known ? "modified" : "added";
            }
            effects.push({ kind, id: change.id, document: doc, known });
        }
        return effects;
    }

    /** A snapshot change is a document with a `kind` beside its fields; this is the document. */
    function withoutKind(change) {
        const doc = Object.assign({}, change);
        delete doc.kind;
        return doc;
    }

    /** Reads the editor's text as a document's fields: {fields} or {error}. */
    function parseFields(text) {
        let value;
        try {
            value = JSON.parse(text);
        } catch (error) {
            return { error: "invalid JSON: " + error.message };
        }
        if (value === null || typeof value !== "object" || Array.isArray(value)) {
            return { error: 'the fields must be a JSON object, like {"title": "Rent"}' };
        }
        return { fields: value };
    }

    /**
     * The write op for an editor action. `shown` is what the editor shows:
     * {collection, id, version, isNew, deleted}.
     *
     * Saving a new document creates it, with the id typed if there is one. Saving a deleted
     * document creates it again under its id, which the server allows for a tombstone.
     * Otherwise saving replaces the fields, and both update and delete carry the version shown
     * as `baseVersion`, so that a write someone else made since is a conflict, not lost.
     */
    function makeOp(action, shown, fields, key) {
        if (action === "delete") {
            return {
                op: "delete", collection: shown.collection, id: shown.id,
                baseVersion: shown.version, idempotencyKey: key,
            };
        }
        if (shown.isNew || shown.deleted) {
            const op = { op: "create", collection: shown.collection, fields, idempotencyKey: key };
            if (shown.id) op.id = shown.id;
            return op;
        }
        return {
            op: "update", collection: shown.collection, id: shown.id, fields,
            baseVersion: shown.version, idempotencyKey: key,
        };
    }

    /** What the editor says when a write of `op` meets `server`, the server's document. */
    function conflictText(op, server) {
        const state = server.deleted ? ` (deleted)` : "";
        if (op.op === "create") {
            return `someone else wrote first: '${op.id}' already exists on the server, ` +
                `at version ${server.version}${state}. Nothing was saved.`;
        }
        return `someone else wrote first: the server has version ${server.version}${state}, ` +
            `not ${op.baseVersion}. Nothing was saved.`;
    }

    /** A rate as typed: a number from 0 to 1, or null. */
    function parseRate(text) {
        const trimmed = String(text).trim();
        if (trimmed === "") return null;
        const rate = Number(trimmed);
        return Number.isFinite(rate) && rate >= 0 && rate <= 1 ? rate : null;
    }

    /**
     * The body of POST /admin/faults for the page's switches: {body} or {error}.
     *
     * `choices` maps each fault key to {on, rate} (the rate as typed) and holds
     * `deliveryDelayMs` as typed; `current` is what the server last said, or null. Its seed and
     * its rejected-write rate (which has no switch here) are kept, so that moving one switch
     * does not undo what the server was started with. With nothing on, the body is
     * {"enabled": false}.
     */
    function faultsRequest(choices, current) {
        const known = current && current.enabled ? current : {};
        const body = { enabled: true, seed: Number.isInteger(known.seed) ? known.seed : 1 };
        let anyOn = false;
        for (const kind of FAULT_KINDS) {
            const choice = choices[kind.key] || { on: false };
            if (!choice.on) {
                body[kind.key] = 0;
                continue;
            }
            const rate = parseRate(choice.rate);
            if (rate === null) return { error: `the rate of ${kind.label} must be a number from 0 to 1` };
            body[kind.key] = rate;
            anyOn = anyOn || rate > 0;
        }
        const delay = Number(String(choices.deliveryDelayMs).trim() || "NaN");
        const delayIsValid = Number.isInteger(delay) && delay >= 0;
        if (body.delayedDeliveryRate > 0 && !delayIsValid) {
            return { error: "the delivery delay must be a whole number of milliseconds" };
        }
        const knownDelay = Number.isInteger(known.deliveryDelayMs) ? known.deliveryDelayMs : 200;
        body.deliveryDelayMs = delayIsValid ? delay : knownDelay;
        body.rejectedWriteRate = known.rejectedWriteRate > 0 ? known.rejectedWriteRate : 0;
        if (!anyOn && body.rejectedWriteRate === 0) return { body: { enabled: false } };
        return { body };
    }

    /** The faults that are on, in words ("lost acknowledgements 10%"); empty when none is. */
    function activeFaults(faults) {
        if (!faults || faults.enabled !== true) return [];
        return FAULT_KINDS.concat([REJECTED_WRITES])
            .filter((kind) => Number(faults[kind.key]) > 0)
            .map((kind) => {
                let text = `${kind.label} ${percent(Number(faults[kind.key]))}`;
                if (kind.key === "delayedDeliveryRate" && faults.deliveryDelayMs !== undefined) {
                    text += ` by ${faults.deliveryDelayMs} ms`;
                }
                return text;
            });
    }

    function percent(rate) {
        return `${Math.round(rate * 1000) / 10}%`;
    }

    /** The wait before the reconnection after one that waited `delay`. */
    function nextRetryDelay(delay) {
        return Math.min(delay * 2, LAST_RETRY_MS);
    }

    /** A wait as the status says it, rounded up: 500 → "0.5s", 8000 → "8s", 2300 → "3s". */
    function formatSeconds(ms) {
        if (ms >= 1000) return `${Math.ceil(ms / 1000)}s`;
        return `${Math.ceil(ms / 100) / 10}s`;
    }

    function formatBytes(bytes) {
        if (!(bytes >= 1024)) return `${bytes || 0} B`;
        if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
        return `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
    }

    function pad(number) {
        return String(number).padStart(2, "0");
    }

    /** Milliseconds since 1970 as local time, "2026-11-23 12:03:04"; "—" for none. */
    function localDateTime(ms) {
        if (!ms) return "—";
        const date = new Date(ms);
        return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())} ${localClock(ms)}`;
    }

    /** Milliseconds since 1970 as a local clock time, "12:03:04". */
    function localClock(ms) {
        const date = new Date(ms);
        return `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}`;
    }

    /** A change log line: "12:03:04 modified notes/ID v3", at the time the server wrote it. */
    function changeLine(effect, collection) {
        const time = localClock(effect.document.updateTime || Date.now());
        return `${time} ${effect.kind} ${collection}/${effect.id} v${effect.document.version}`;
    }

    /** One listener of a client, as /admin/clients reports it: "t1 → notes (live, at 7)". */
    function describeListen(listen) {
        const parts = [listen.live ? "live" : "catching up"];
        if (listen.position !== undefined && listen.position !== null) parts.push(`at ${listen.position}`);
        return `${listen.target} → ${listen.collection} (${parts.join(", ")})`;
    }

    /**
     * A random name of `length` letters and digits, for client ids, request labels and
     * idempotency keys. The modulo leans slightly towards the first letters, which does not
     * matter for labels that only need to be unique.
     */
    function randomName(length) {
        const bytes = new Uint8Array(length);
        crypto.getRandomValues(bytes);
        let name = "";
        for (const byte of bytes) name += NAME_ALPHABET[byte % NAME_ALPHABET.length];
        return name;
    }

    // Without a page (node), hand the pure functions to a test and stop here.
    if (typeof document === "undefined") {
        globalThis.tandemConsoleLogic = {
            isCollectionPath, buildTree, applyChanges, parseFields, makeOp, conflictText, parseRate,
            faultsRequest, activeFaults, nextRetryDelay, formatSeconds, formatBytes, localDateTime,
            changeLine, describeListen, randomName,
        };
        return;
    }

    // -----------------------------------------------------------------------------------------
    // The page's state

    const POLL_MS = 3000; // the admin views refresh this often
    const CONNECTED_AGAIN_MS = 3000; // how long "connected again" shows
    const FLASH_MS = 1500; // how long a changed row stays highlighted
    const DELETED_ROW_MS = 1200; // how long a deleted row stays, struck out
    const CHANGE_LOG_LINES = 50;
    const TOKEN_KEYS = { token: "tandem.console.token", adminToken: "tandem.console.adminToken" };

    // The same client id on every reconnection: the server remembers idempotency keys per
    // client id, so a write sent again after a lost answer is recognised.
    const clientId = "console-" + randomName(12);

    const connection = {
        socket: null,
        state: "connecting", // what #status says: connecting, connected, lost, unauthenticated
        welcomed: false, // the current socket got its welcome
        wasConnected: false, // an earlier socket did: the next welcome is a reconnection
        retryDelay: FIRST_RETRY_MS,
        retryTimer: null,
        needsToken: false, // the server refused the token: wait for the user, do not retry
        refusal: "", // the server's words when it refused the token
    };

    // The open collection and its listener.
    const view = {
        collection: null,
        target: null, // the listener's label; a new one for each listen
        resumeToken: null, // from the last snapshot: a reconnection resumes from it
        resuming: false, // the initial pages coming are changes since resumeToken, not the contents
        resetReason: "", // the server's reason for the last `reset`, said once the full snapshot is in
        live: false, // the initial pages are all in
        docs: new Map(), // id → document
        rows: new Map(), // id → <tr>, so that a change touches one row, not the table
    };

    // What the editor shows. `session` changes whenever it shows another document, so that
    // the answer to a write of an earlier one does not overwrite it.
    const editor = { session: 0, collection: null, id: "", version: null, isNew: true, deleted: false };

    // Writes without an answer yet: request → {message, action, session, collection, sent}.
    // They are sent again, unchanged, after a reconnection: same idempotency keys, so the
    // server applies each at most once.
    const pendingWrites = new Map();

    const tokens = { token: readStoredToken("token"), adminToken: readStoredToken("adminToken") };
    let adminNeedsToken = false; // an admin endpoint said 401/403: stop polling until the token changes
    let labelCounter = 0;
    let statusTimer = null;
    let treeSignature = "";
    let knownFaults = null;
    let faultsGeneration = 0; // changes with every POST, so that an older GET does not undo it
    const busy = new Set(); // admin refreshes in flight
    const flashTimers = new WeakMap(); // row → timer that ends its highlight

    function byId(id) {
        return document.getElementById(id);
    }

    /** A new element with a class and text (both optional). */
    function element(tag, className, text) {
        const node = document.createElement(tag);
        if (className) node.className = className;
        if (text !== undefined) node.textContent = text;
        return node;
    }

    function showMessage(node, kind, text) {
        node.className = kind ? `message ${kind}` : "message";
        node.textContent = text;
    }

    function nextLabel(prefix) {
        labelCounter += 1;
        return `${prefix}-${labelCounter}`;
    }

    // -----------------------------------------------------------------------------------------
    // Tokens, kept in sessionStorage (and in memory, for browsers that refuse storage)

    function readStoredToken(name) {
        try {
            return sessionStorage.getItem(TOKEN_KEYS[name]) || "";
        } catch (error) {
            return "";
        }
    }

    function setToken(name, value) {
        tokens[name] = value;
        try {
            if (value) sessionStorage.setItem(TOKEN_KEYS[name], value);
            else sessionStorage.removeItem(TOKEN_KEYS[name]);
        } catch (error) {
            // Storage is off: the token lasts as long as the page.
        }
    }

    function showTokenForm(reason) {
        byId("token-form").hidden = false;
        showMessage(byId("token-reason"), reason ? "error" : "", reason || "");
        byId("token").value = tokens.token;
        byId("admin-token").value = tokens.adminToken;
    }

    function tokenFormSubmitted(event) {
        event.preventDefault();
        setToken("token", byId("token").value.trim());
        setToken("adminToken", byId("admin-token").value.trim());
        byId("token-form").hidden = true;
        adminNeedsToken = false;
        connection.needsToken = false;
        connection.retryDelay = FIRST_RETRY_MS;
        disconnect();
        connect();
        pollAdmin();
    }

    // -----------------------------------------------------------------------------------------
    // Connection: hello, reconnection with backoff, status

    function socketURL() {
        return (location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/";
    }

    function showStatus(state, text, detail) {
        clearTimeout(statusTimer);
        connection.state = state;
        const status = byId("status");
        status.dataset.state = state;
        status.textContent = text;
        byId("status-detail").textContent = detail || "";
    }

    function connect() {
        clearTimeout(connection.retryTimer);
        connection.retryTimer = null;
        connection.welcomed = false;
        listenerGone();
        showStatus("connecting", "connecting…");
        const socket = new WebSocket(socketURL());
        connection.socket = socket;
        // Events of a socket that was replaced (the user reconnected) are ignored.
        socket.addEventListener("open", () => sendHello(socket));
        socket.addEventListener("message", (event) => {
            if (socket === connection.socket) receive(event.data);
        });
        socket.addEventListener("close", (event) => {
            if (socket === connection.socket) connectionClosed(event);
        });
    }

    /** Closes the current socket on purpose, without the reconnection a lost one gets. */
    function disconnect() {
        const socket = connection.socket;
        connection.socket = null;
        connection.welcomed = false;
        if (!socket) return;
        // Closing a socket still connecting makes browsers log an error; wait until it opens.
        if (socket.readyState === WebSocket.CONNECTING) socket.addEventListener("open", () => socket.close(1000));
        else socket.close(1000);
    }

    function sendHello(socket) {
        const hello = { type: "hello", protocol: 1, clientId };
        if (tokens.token) hello.token = tokens.token;
        socket.send(JSON.stringify(hello));
    }

    /** Sends a message once the server welcomed the connection; says whether it went. */
    function send(message) {
        const socket = connection.socket;
        if (!connection.welcomed || !socket || socket.readyState !== WebSocket.OPEN) return false;
        socket.send(JSON.stringify(message));
        return true;
    }

    function welcomed() {
        const again = connection.wasConnected;
        connection.welcomed = true;
        connection.wasConnected = true;
        connection.needsToken = false;
        connection.refusal = "";
        connection.retryDelay = FIRST_RETRY_MS;
        showStatus("connected", again ? "connected again" : "connected");
        if (again) {
            statusTimer = setTimeout(() => showStatus("connected", "connected"), CONNECTED_AGAIN_MS);
        }
        // Writes first: answers come in the order of the messages, so their acks arrive
        // before the listener's catch-up carries the same changes.
        resendPendingWrites();
        if (view.collection) startListening();
        pollAdmin();
    }

    function connectionClosed(event) {
        const hadWelcome = connection.welcomed;
        connection.socket = null;
        connection.welcomed = false;
        listenerGone();
        // 1008 before the welcome: the token was refused (or no hello came in time). Trying
        // again with the same token would be refused again.
        if (connection.needsToken || (event.code === 1008 && !hadWelcome)) {
            connection.needsToken = true;
            showStatus("unauthenticated", "a token is needed", closeDetail(event));
            const reason = connection.refusal || event.reason;
            showTokenForm(reason || "the server refused the connection without a valid token");
            return;
        }
        const delay = connection.retryDelay;
        connection.retryDelay = nextRetryDelay(delay);
        connection.retryTimer = setTimeout(connect, delay);
        countDown(Date.now() + delay, closeDetail(event));
    }

    /** Says how long until the next attempt, and says it again as the time passes. */
    function countDown(retryAt, detail) {
        const remaining = Math.max(0, retryAt - Date.now());
        const text = `connection lost — reconnecting in ${formatSeconds(remaining)}`;
        // Only when the words change: #status is a live region, read out on each change.
        if (byId("status").textContent !== text || connection.state !== "lost") showStatus("lost", text, detail);
        clearTimeout(statusTimer);
        if (remaining > 0) statusTimer = setTimeout(() => countDown(retryAt, detail), 100);
    }

    function closeDetail(event) {
        if (event.code === 1006) return "(closed without a close frame: the network or the server went away)";
        return `(closed ${event.code}${event.reason ? ": " + event.reason : ""})`;
    }

    function receive(text) {
        let message;
        try {
            message = JSON.parse(text);
        } catch (error) {
            byId("status-detail").textContent = "the server sent a message that is not JSON";
            return;
        }
        switch (message.type) {
            case "welcome": return welcomed();
            case "snapshot": return snapshotReceived(message);
            case "reset": return resetReceived(message);
            case "ack": return ackReceived(message);
            case "conflict": return conflictReceived(message);
            case "error": return errorReceived(message);
            default: return; // `document` (the console sends no get) and types of later versions
        }
    }

    function errorReceived(message) {
        const text = `${message.code}: ${message.message}`;
        if (message.code === "unauthenticated") {
            connection.needsToken = true;
            connection.refusal = text;
            showTokenForm(text);
        } else if (message.request !== undefined && pendingWrites.has(message.request)) {
            writeFailed(message);
        } else if (message.target !== undefined) {
            if (message.target === view.target) listenFailed(message);
        } else {
            byId("status-detail").textContent = `server error: ${text}`;
        }
    }

    // -----------------------------------------------------------------------------------------
    // The open collection: listen, apply snapshots, keep the resume token

    function openCollection(path) {
        const documentsMessage = byId("documents-message");
        if (!isCollectionPath(path)) {
            showMessage(documentsMessage, "error", `'${path}' is not a collection path: ` +
                "it needs an odd number of segments (notes, accounts/A1/transactions)");
            return;
        }
        stopListening();
        view.collection = path;
        view.resumeToken = null;
        clearView();
        byId("collection-input").value = path;
        // The address names the open collection, so that a reload or a link opens it again.
        if (location.hash !== "#" + path) history.replaceState(null, "", "#" + path);
        byId("open-collection").textContent = path;
        byId("documents").dataset.collection = path;
        markOpenInTree();
        if (editor.collection !== path) editNewDocument(path);
        if (!startListening()) showMessage(documentsMessage, "", "waiting for the connection…");
    }

    /** Listens to the open collection, from the resume token if there is one. */
    function startListening() {
        if (!connection.welcomed) return false; // the welcome will
        view.target = nextLabel("console");
        view.resuming = view.resumeToken !== null;
        view.resetReason = "";
        setLive(false);
        const listen = { type: "listen", target: view.target, collection: view.collection };
        if (view.resumeToken) listen.resumeToken = view.resumeToken;
        send(listen);
        showMessage(byId("documents-message"), "", view.resuming ? "catching up…" : "loading…");
        return true;
    }

    function stopListening() {
        // A new label for every listen means a late snapshot of this listener, sent before
        // the server read the unlisten, cannot be taken for one of the next.
        if (view.target) send({ type: "unlisten", target: view.target });
        view.target = null;
        setLive(false);
    }

    /** The connection went: its listener with it. The next welcome listens again. */
    function listenerGone() {
        view.target = null;
        setLive(false);
    }

    function setLive(live) {
        view.live = live;
        byId("documents").dataset.live = String(live);
    }

    function clearView() {
        view.docs.clear();
        view.rows.clear();
        byId("document-rows").replaceChildren();
        showDocumentCount();
    }

    function snapshotReceived(message) {
        if (message.target !== view.target) return; // a listener stopped since
        // The initial pages of a listen without a token are the collection's contents, not
        // changes: they are not highlighted or logged.
        const quiet = message.initial === true && !view.resuming;
        const effects = applyChanges(view.docs, Array.isArray(message.changes) ? message.changes : []);
        showEffects(effects, quiet);
        if (typeof message.resumeToken === "string") view.resumeToken = message.resumeToken;
        if (!message.hasMore) {
            view.resuming = false;
            if (!view.live) {
                setLive(true);
                const reason = view.resetReason;
                showMessage(byId("documents-message"), "", reason ? `reset by the server: ${reason}` : "");
                view.resetReason = "";
            }
        } else {
            showMessage(byId("documents-message"), "", `loading… ${view.docs.size} documents so far`);
        }
    }

    function resetReceived(message) {
        if (message.target !== view.target) return;
        // The resume token could not be used: what the view holds may be wrong. The full
        // snapshot follows and is the whole truth.
        clearView();
        view.resuming = false;
        view.resetReason = message.reason || "its token could not be used";
        setLive(false);
        showMessage(byId("documents-message"), "", `reset by the server: ${view.resetReason}`);
    }

    function listenFailed(message) {
        view.target = null;
        setLive(false);
        // A token the server does not recognise (its data was replaced): listen afresh.
        if (message.code === "bad-message" && view.resumeToken !== null) {
            view.resumeToken = null;
            clearView();
            startListening();
            return;
        }
        const text = `cannot listen to ${view.collection}: ${message.code}: ${message.message}`;
        showMessage(byId("documents-message"), "error", text);
    }

    /** Shows the effects of one snapshot: one row per changed document, new rows appended at once. */
    function showEffects(effects, quiet) {
        const newRows = document.createDocumentFragment();
        for (const effect of effects) {
            const row = view.rows.get(effect.id);
            if (effect.kind === "deleted") {
                if (row) removeRow(effect.id, row, quiet);
            } else if (row) {
                fillRow(row, effect.document);
                if (!quiet) flash(row, "change-modified");
            } else {
                const added = makeRow(effect.document);
                view.rows.set(effect.id, added);
                newRows.appendChild(added);
                if (!quiet) flash(added, "change-added");
            }
            noticeEditedDocumentChanged(effect);
        }
        byId("document-rows").appendChild(newRows);
        if (!quiet) logChanges(effects);
        showDocumentCount();
    }

    function showDocumentCount() {
        const count = view.docs.size;
        byId("document-count").textContent = view.collection ? `${count} document${count === 1 ? "" : "s"}` : "";
    }

    function makeRow(doc) {
        const row = document.createElement("tr");
        row.tabIndex = 0; // rows open with Enter as well as a click
        for (const name of ["id", "version", "updated", "fields"]) row.appendChild(element("td", `cell-${name}`));
        fillRow(row, doc);
        return row;
    }

    function fillRow(row, doc) {
        row.dataset.id = doc.id;
        row.dataset.version = String(doc.version);
        const [id, version, updated, fields] = row.cells;
        id.textContent = doc.id;
        version.textContent = String(doc.version);
        updated.textContent = localDateTime(doc.updateTime);
        const json = JSON.stringify(doc.fields === undefined ? {} : doc.fields);
        fields.textContent = json; // cut by CSS; the tooltip shows more
        fields.title = json.length > 2000 ? json.slice(0, 2000) + "…" : json;
        row.classList.toggle("selected", editorShows(view.collection, doc.id));
    }

    function flash(row, className) {
        clearTimeout(flashTimers.get(row));
        row.classList.remove("change-added", "change-modified");
        row.classList.add(className);
        flashTimers.set(row, setTimeout(() => row.classList.remove(className), FLASH_MS));
    }

    /** A deleted row leaves the Map at once, and the table after a moment struck out. */
    function removeRow(id, row, quiet) {
        view.rows.delete(id);
        if (quiet) {
            row.remove();
            return;
        }
        clearTimeout(flashTimers.get(row));
        row.classList.remove("change-added", "change-modified", "selected");
        row.classList.add("change-deleted");
        row.dataset.deleted = "true";
        row.removeAttribute("tabindex");
        setTimeout(() => row.remove(), DELETED_ROW_MS);
    }

    function logChanges(effects) {
        const list = byId("changes");
        for (const effect of effects.slice(-CHANGE_LOG_LINES)) {
            const item = element("li", "", changeLine(effect, view.collection));
            item.dataset.kind = effect.kind;
            item.dataset.id = effect.id;
            list.prepend(item);
        }
        while (list.children.length > CHANGE_LOG_LINES) list.lastElementChild.remove();
    }

    /** Opens the document of a clicked row in the editor (not a deleted row on its way out). */
    function rowChosen(event) {
        if (event.type === "keydown" && event.key !== "Enter") return;
        const row = event.target.closest("tr[data-id]");
        if (!row || view.rows.get(row.dataset.id) !== row) return;
        editDocument(view.collection, view.docs.get(row.dataset.id));
        showEditorMessage("", "");
    }

    // -----------------------------------------------------------------------------------------
    // Editor: create, update, delete; ack, conflict, error

    function editorShows(collection, id) {
        return !editor.isNew && editor.collection === collection && editor.id === id;
    }

    function editDocument(collection, doc) {
        Object.assign(editor, {
            session: editor.session + 1, collection, id: doc.id, version: doc.version,
            isNew: false, deleted: doc.deleted === true,
        });
        byId("editor-fields").value = JSON.stringify(doc.fields || {}, null, 2);
        showEditor();
        if (editor.deleted) byId("editor-note").textContent = "This document is deleted: Save creates it again.";
    }

    function editNewDocument(collection) {
        Object.assign(editor, {
            session: editor.session + 1, collection, id: "", version: null, isNew: true, deleted: false,
        });
        byId("editor-fields").value = "{\n  \n}";
        showEditor();
        showEditorMessage("", "");
    }

    function showEditor() {
        const idField = byId("editor-id");
        idField.value = editor.id;
        idField.readOnly = !editor.isNew;
        byId("editor-version").textContent = editor.isNew ? "new" : String(editor.version);
        byId("editor-collection").textContent = editor.collection || "(open a collection first)";
        byId("editor-note").textContent = "";
        updateEditorButtons();
        markSelectedRow();
    }

    function updateEditorButtons() {
        const writing = [...pendingWrites.values()].some((write) => write.session === editor.session);
        byId("save").disabled = !editor.collection || writing;
        byId("delete").disabled = !editor.collection || editor.isNew || editor.deleted || writing;
    }

    function markSelectedRow() {
        for (const row of byId("document-rows").querySelectorAll("tr.selected")) row.classList.remove("selected");
        const row = editorShows(view.collection, editor.id) ? view.rows.get(editor.id) : undefined;
        if (row) row.classList.add("selected");
    }

    /**
     * Sets #editor-message: `outcome` is saved, deleted, conflict, error or pending (its class
     * and data-outcome), or "" for a plain message. Returns the element, for more content.
     */
    function showEditorMessage(outcome, text) {
        const box = byId("editor-message");
        box.replaceChildren();
        box.className = outcome ? `message ${outcome}` : "message";
        if (outcome) box.dataset.outcome = outcome;
        else delete box.dataset.outcome;
        if (text) box.appendChild(element("p", "", text));
        return box;
    }

    /** Tells the user that the document being edited changed on the server since it was loaded. */
    function noticeEditedDocumentChanged(effect) {
        if (!editorShows(view.collection, effect.id) || !(effect.document.version > editor.version)) return;
        const what = effect.kind === "deleted" ? "deleted" : "changed";
        byId("editor-note").textContent = `${what} on the server since you loaded it ` +
            `(now version ${effect.document.version}): saving will conflict.`;
    }

    function write(action) {
        if (!editor.collection) {
            showEditorMessage("error", "open a collection first");
            return;
        }
        let fields = null;
        if (action === "save") {
            const parsed = parseFields(byId("editor-fields").value);
            if (parsed.error) {
                showEditorMessage("error", `${parsed.error} (nothing was sent)`);
                return;
            }
            fields = parsed.fields;
            if (editor.isNew) editor.id = byId("editor-id").value.trim();
        }
        // The version shown is the one the user means to overwrite: it is the baseVersion sent.
        const shown = Number(byId("editor-version").textContent);
        if (!editor.isNew && Number.isInteger(shown) && shown > 0) editor.version = shown;
        sendWrite(action, makeOp(action, editor, fields, randomName(24)));
    }

    function sendWrite(action, op) {
        const request = nextLabel("write");
        const message = { type: "write", request, ops: [op] };
        const pending = { message, action, session: editor.session, collection: op.collection, sent: false };
        pendingWrites.set(request, pending);
        pending.sent = send(message);
        const doing = action === "delete" ? "deleting…" : "saving…";
        showEditorMessage("pending", pending.sent ? doing : `${doing} waiting for the connection`);
        updateEditorButtons();
    }

    function resendPendingWrites() {
        for (const pending of pendingWrites.values()) {
            const again = pending.sent;
            pending.sent = send(pending.message);
            if (pending.session !== editor.session) continue;
            if (again) {
                showEditorMessage("pending",
                    "the connection was lost before the answer: sent again with the same idempotency key, " +
                    "so it is applied at most once");
            } else {
                showEditorMessage("pending", pending.action === "delete" ? "deleting…" : "saving…");
            }
        }
    }

    function takePending(request) {
        const pending = pendingWrites.get(request);
        pendingWrites.delete(request);
        if (pending) updateEditorButtons();
        return pending;
    }

    /** "" for a write of the document the editor shows; otherwise which one it was about. */
    function aboutEarlierWrite(pending, id) {
        if (pending.session === editor.session) return "";
        return `earlier write to ${pending.collection}/${id || "(new)"}: `;
    }

    function ackReceived(message) {
        const pending = takePending(message.request);
        if (!pending) return;
        const result = (Array.isArray(message.results) && message.results[0]) || {};
        const deleted = pending.action === "delete";
        const about = aboutEarlierWrite(pending, result.id);
        if (!about) {
            Object.assign(editor, { id: result.id, version: result.version, isNew: false, deleted });
            showEditor();
        }
        const outcome = deleted ? "deleted" : "saved";
        showEditorMessage(outcome, `${about}${outcome}: version ${result.version}`);
        refreshCollections();
    }

    function conflictReceived(message) {
        const pending = takePending(message.request);
        if (!pending) return;
        const server = message.server || {};
        const op = pending.message.ops[message.op || 0];
        const box = showEditorMessage("conflict", aboutEarlierWrite(pending, op.id) + conflictText(op, server));
        box.appendChild(element("p", "", `The server's version ${server.version}:`));
        box.appendChild(element("pre", "", JSON.stringify(server.fields || {}, null, 2)));
        const take = element("button", "", "Load the server's version");
        take.type = "button";
        take.id = "take-server";
        take.addEventListener("click", () => {
            editDocument(pending.collection, server);
            showEditorMessage("", `loaded the server's version ${server.version}: edit it and save again`);
        });
        box.appendChild(take);
    }

    function writeFailed(message) {
        const pending = takePending(message.request);
        const about = aboutEarlierWrite(pending, pending.message.ops[0].id);
        showEditorMessage("error", `${about}${message.code}: ${message.message}`);
    }

    // -----------------------------------------------------------------------------------------
    // Admin endpoints: fetch with the admin token

    class AdminError extends Error {
        constructor(status, message) {
            super(message);
            this.status = status; // 0 when the server could not be reached
        }
    }

    /** Calls an admin endpoint; throws an AdminError with the server's message when it fails. */
    async function admin(method, path, body) {
        const token = tokens.adminToken;
        const headers = {};
        if (token) headers.Authorization = `Bearer ${token}`;
        if (body !== undefined) headers["Content-Type"] = "application/json";
        let response;
        try {
            response = await fetch(path, {
                method, headers, cache: "no-store",
                body: body === undefined ? undefined : JSON.stringify(body),
            });
        } catch (error) {
            throw new AdminError(0, "the server cannot be reached");
        }
        if (!response.ok) {
            // Only when the token refused is still the one in use: not for an answer to a request
            // that left before the user typed a new one.
            if ((response.status === 401 || response.status === 403) && token === tokens.adminToken) {
                adminNeedsToken = true;
            }
            throw new AdminError(response.status, await errorText(response));
        }
        return response;
    }

    async function adminJSON(method, path, body) {
        const response = await admin(method, path, body);
        try {
            return await response.json();
        } catch (error) {
            throw new AdminError(response.status, `${path} answered something that is not JSON`);
        }
    }

    /** The message of an admin error, {"error": "code", "message": "…"}, or the body as text. */
    async function errorText(response) {
        const text = (await response.text().catch(() => "")).trim();
        try {
            const data = JSON.parse(text);
            if (data && data.message) return data.error ? `${data.error}: ${data.message}` : data.message;
        } catch (error) {
            // Not JSON: the text itself says what went wrong.
        }
        return text || `HTTP ${response.status}`;
    }

    /** What to say when an admin call to do `what` failed. */
    function adminProblem(error, what) {
        if (error.status === 401 || error.status === 403) {
            return `The admin token is needed to ${what} (HTTP ${error.status}: ${error.message}). ` +
                "Enter it under Tokens.";
        }
        if (error.status === 0) return `Cannot ${what}: the server cannot be reached.`;
        return `Cannot ${what}: ${error.message}`;
    }

    /** Runs `work` unless a run of the same name is still going (a slow server, a 3 s poll). */
    async function exclusive(name, work) {
        if (busy.has(name)) return;
        busy.add(name);
        try {
            await work();
        } finally {
            busy.delete(name);
        }
    }

    function pollAdmin() {
        // While the server is unreachable or refuses the admin token, polling would only
        // fill the browser's console with failed requests.
        if (connection.state === "lost" || adminNeedsToken) return;
        refreshCollections();
        refreshClients();
        refreshFaults();
    }

    // -----------------------------------------------------------------------------------------
    // Collections tree

    function refreshCollections() {
        return exclusive("collections", async () => {
            const message = byId("collections-message");
            try {
                const data = await adminJSON("GET", "/admin/collections");
                const entries = Array.isArray(data.collections) ? data.collections : [];
                showMessage(message, "", "");
                // Rebuilt only when it changed, so that a poll does not steal focus or flicker.
                const signature = JSON.stringify(entries);
                if (signature !== treeSignature) {
                    treeSignature = signature;
                    renderTree(buildTree(entries));
                }
            } catch (error) {
                showMessage(message, "error", adminProblem(error, "list the collections"));
            }
        });
    }

    function renderTree(collections) {
        const container = byId("collections");
        if (collections.length === 0) {
            const text = "No collections yet: open one by its path and create a document.";
            container.replaceChildren(element("p", "empty", text));
            return;
        }
        container.replaceChildren(collectionList(collections));
        markOpenInTree();
    }

    function collectionList(collections) {
        const list = element("ul", "tree");
        for (const collection of collections) list.appendChild(collectionItem(collection));
        return list;
    }

    function collectionItem(collection) {
        const item = element("li", "tree-collection");
        const link = element("button", "tree-link", collection.name);
        link.type = "button";
        link.dataset.collection = collection.path;
        link.title = collection.path;
        if (collection.documents !== null) link.appendChild(element("span", "count", String(collection.documents)));
        item.appendChild(link);
        if (collection.children.length > 0) {
            const documents = element("ul", "tree");
            for (const doc of collection.children) documents.appendChild(documentItem(doc));
            item.appendChild(documents);
        }
        return item;
    }

    function documentItem(doc) {
        const item = element("li", "tree-document");
        item.appendChild(element("span", "tree-document-id", doc.id));
        item.appendChild(collectionList(doc.collections));
        return item;
    }

    function markOpenInTree() {
        for (const link of byId("collections").querySelectorAll("[data-collection]")) {
            const open = link.dataset.collection === view.collection;
            link.classList.toggle("current", open);
            if (open) link.setAttribute("aria-current", "true");
            else link.removeAttribute("aria-current");
        }
    }

    function treeClicked(event) {
        const link = event.target.closest("[data-collection]");
        if (link) openCollection(link.dataset.collection);
    }

    // -----------------------------------------------------------------------------------------
    // Clients

    function refreshClients() {
        return exclusive("clients", async () => {
            const message = byId("clients-message");
            try {
                const data = await adminJSON("GET", "/admin/clients");
                renderClients(Array.isArray(data.clients) ? data.clients : []);
                showMessage(message, "", "");
            } catch (error) {
                showMessage(message, "error", adminProblem(error, "list the clients"));
            }
        });
    }

    function renderClients(clients) {
        const rows = clients.map(clientRow);
        if (rows.length === 0) {
            const row = document.createElement("tr");
            const cell = element("td", "empty", "no clients connected");
            cell.colSpan = 6;
            row.appendChild(cell);
            rows.push(row);
        }
        byId("client-rows").replaceChildren(...rows);
    }

    function clientRow(client) {
        const row = document.createElement("tr");
        row.dataset.session = client.session || "";
        row.dataset.clientId = client.clientId || "";
        const itself = client.clientId === clientId;
        row.classList.toggle("this-console", itself);
        row.appendChild(element("td", "mono", itself ? `${client.clientId} (this console)` : client.clientId));
        const user = client.user === null || client.user === undefined ? "—" : String(client.user);
        row.appendChild(element("td", "", user));
        row.appendChild(element("td", "mono", client.peer || ""));
        row.appendChild(element("td", "mono", client.session || ""));
        row.appendChild(element("td", "", formatBytes(client.queuedBytes)));
        const listens = element("ul", "listens");
        for (const listen of client.listens || []) listens.appendChild(element("li", "", describeListen(listen)));
        const cell = element("td");
        cell.appendChild(listens);
        row.appendChild(cell);
        return row;
    }

    // -----------------------------------------------------------------------------------------
    // Fault switches

    function refreshFaults() {
        return exclusive("faults", async () => {
            const generation = faultsGeneration;
            try {
                const data = await adminJSON("GET", "/admin/faults");
                if (generation === faultsGeneration) faultsKnown(data);
            } catch (error) {
                showMessage(byId("faults-message"), "error", adminProblem(error, "read the fault switches"));
            }
        });
    }

    /** Shows what the server says of its faults: the switches and the banner. */
    function faultsKnown(faults) {
        knownFaults = faults;
        const active = activeFaults(faults);
        const focused = document.activeElement;
        for (const kind of FAULT_KINDS) {
            const rate = faults.enabled === true ? Number(faults[kind.key]) || 0 : 0;
            byId(kind.id).checked = rate > 0;
            // The rate typed stays while its fault is off, and while the user is typing.
            const rateField = byId(`${kind.id}-rate`);
            if (rate > 0 && rateField !== focused) rateField.value = String(rate);
        }
        const delayField = byId("fault-delivery-delay-ms");
        if (Number.isInteger(faults.deliveryDelayMs) && delayField !== focused) {
            delayField.value = String(faults.deliveryDelayMs);
        }
        byId("faults").dataset.enabled = String(active.length > 0);
        const banner = byId("faults-banner");
        banner.hidden = active.length === 0;
        banner.textContent = active.length === 0 ? "" :
            `Fault injection is ON: ${active.join(", ")}. The server misbehaves on purpose for every client, ` +
            "this console included: its connection may drop and answers may be lost.";
    }

    function readFaultSwitches() {
        const choices = { deliveryDelayMs: byId("fault-delivery-delay-ms").value };
        for (const kind of FAULT_KINDS) {
            choices[kind.key] = { on: byId(kind.id).checked, rate: byId(`${kind.id}-rate`).value };
        }
        return choices;
    }

    function faultSwitchChanged() {
        const request = faultsRequest(readFaultSwitches(), knownFaults);
        if (request.error) {
            showMessage(byId("faults-message"), "error", request.error);
            return;
        }
        postFaults(request.body);
    }

    async function postFaults(body) {
        const message = byId("faults-message");
        faultsGeneration += 1;
        try {
            const data = await adminJSON("POST", "/admin/faults", body);
            faultsGeneration += 1;
            // The answer is the new state when it has its shape; otherwise take what was sent.
            faultsKnown(data && typeof data.enabled === "boolean" ? data : body);
            showMessage(message, "", body.enabled ? "fault injection is on" : "fault injection is off");
        } catch (error) {
            faultsGeneration += 1;
            showMessage(message, "error", adminProblem(error, "change the fault switches"));
            refreshFaults();
        }
    }

    // -----------------------------------------------------------------------------------------
    // Reset and export

    async function resetClicked() {
        const message = byId("admin-message");
        const everything = byId("reset-scope").value === "everything";
        if (!everything && !view.collection) {
            showMessage(message, "error", "Open a collection first, or choose everything.");
            return;
        }
        const question = everything
            ? "Reset everything: delete every document of every collection on this server? This cannot be undone."
            : `Reset the collection '${view.collection}': delete all its documents? This cannot be undone.`;
        if (!window.confirm(question)) return;
        const path = everything ? "/admin/reset" : `/admin/reset?collection=${encodeURIComponent(view.collection)}`;
        try {
            const data = await adminJSON("POST", path);
            const what = data.reset || (everything ? "everything" : view.collection);
            showMessage(message, "", `reset ${what}: ${data.documents} documents removed`);
        } catch (error) {
            showMessage(message, "error", adminProblem(error, "reset"));
            return;
        }
        // Nothing to do for the open collection: the server sends its listener a `reset`,
        // as to any client's.
        refreshCollections();
    }

    async function exportClicked() {
        const message = byId("admin-message");
        showMessage(message, "", "exporting…");
        try {
            const response = await admin("GET", "/admin/export");
            const blob = await response.blob();
            const url = URL.createObjectURL(blob);
            const link = element("a");
            link.href = url;
            link.download = "tandem-export.ndjson";
            document.body.appendChild(link);
            link.click();
            link.remove();
            // Some browsers start the download after click() returns: keep the URL a while.
            setTimeout(() => URL.revokeObjectURL(url), 10000);
            showMessage(message, "", `exported ${formatBytes(blob.size)} as tandem-export.ndjson`);
        } catch (error) {
            showMessage(message, "error", adminProblem(error, "export"));
        }
    }

    // -----------------------------------------------------------------------------------------
    // Start

    function start() {
        byId("server-url").textContent = socketURL();
        byId("token-form").addEventListener("submit", tokenFormSubmitted);
        byId("show-tokens").addEventListener("click", () => {
            if (byId("token-form").hidden) showTokenForm("");
            else byId("token-form").hidden = true;
        });
        byId("open-form").addEventListener("submit", (event) => {
            event.preventDefault();
            openCollection(byId("collection-input").value.trim());
        });
        byId("collections").addEventListener("click", treeClicked);
        byId("document-rows").addEventListener("click", rowChosen);
        byId("document-rows").addEventListener("keydown", rowChosen);
        byId("new").addEventListener("click", () => editNewDocument(view.collection || editor.collection));
        byId("save").addEventListener("click", () => write("save"));
        byId("delete").addEventListener("click", () => write("delete"));
        byId("faults").addEventListener("change", faultSwitchChanged);
        byId("faults-off").addEventListener("click", () => postFaults({ enabled: false }));
        byId("reset").addEventListener("click", resetClicked);
        byId("export").addEventListener("click", exportClicked);
        editNewDocument(null);
        const linked = decodeURIComponent(location.hash.slice(1));
        if (linked) openCollection(linked);
        connect();
        pollAdmin();
        setInterval(pollAdmin, POLL_MS);
    }

    start();
})();
