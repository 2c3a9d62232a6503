/// The console's style sheet, served at `/console.css`: a light theme in the system font, three
/// columns that fold into one on narrow screens, monospace for ids and JSON, and highlights for
/// the rows a snapshot just changed. No images, no web fonts.
extension ConsolePage {
    static let style = #"""
        /* Tandem console: a light theme in the system font, monospace for JSON and ids. No images. */

        :root {
            --text: #1d232a;
            --muted: #5c6670;
            --line: #d9dee3;
            --panel: #ffffff;
            --page: #f3f5f7;
            --accent: #1f6feb;
            --ok: #1a7f37;
            --ok-bg: #e6f4ea;
            --warn: #8a5a00;
            --warn-bg: #fff6d9;
            --bad: #b42318;
            --bad-bg: #fdecea;
            --added: #d6f5dd;
            --modified: #fff0b3;
            --deleted: #fbdada;
            --mono: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace;
            font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", sans-serif;
            color: var(--text);
            background: var(--page);
        }

        * { box-sizing: border-box; }
        body { margin: 0; font-size: 14px; line-height: 1.45; }
        h1 { font-size: 1.2rem; margin: 0; }
        h2 { font-size: 1rem; margin: 0 0 0.6rem; }
        h3 { font-size: 0.9rem; margin: 1rem 0 0.4rem; }
        code, output, pre, textarea, .mono { font-family: var(--mono); font-size: 0.85rem; }
        [hidden] { display: none !important; }

        /* Header: title, connection status, server address. */

        .top {
            display: flex;
            flex-wrap: wrap;
            align-items: center;
            gap: 0.5rem 1rem;
            padding: 0.6rem 1rem;
            background: var(--panel);
            border-bottom: 1px solid var(--line);
        }
        .top p { margin: 0; }
        .top .server { margin-left: auto; color: var(--muted); }
        #status {
            font-weight: 600;
            padding: 0.1rem 0.7rem;
            border-radius: 999px;
            background: var(--warn-bg);
            color: var(--warn);
        }
        #status[data-state="connected"] { background: var(--ok-bg); color: var(--ok); }
        #status[data-state="lost"],
        #status[data-state="unauthenticated"] { background: var(--bad-bg); color: var(--bad); }
        .detail, .hint { color: var(--muted); font-size: 0.85rem; font-weight: normal; }

        /* The fault banner is loud on purpose: while it shows, the server misbehaves. */
        #faults-banner {
            padding: 0.6rem 1rem;
            background: var(--bad);
            color: #fff;
            font-weight: 600;
        }

        #token-form {
            display: flex;
            flex-wrap: wrap;
            align-items: flex-end;
            gap: 0.6rem 1rem;
            margin: 1rem 1rem 0;
        }
        #token-form .message, #token-form .hint { flex-basis: 100%; margin: 0; }
        #token-form label { display: flex; flex-direction: column; gap: 0.2rem; min-width: 16rem; }

        /* Layout: three columns, then the admin row; one column on narrow screens. */

        main, .admin { display: grid; gap: 1rem; padding: 1rem; }
        main { grid-template-columns: minmax(13rem, 1fr) minmax(0, 2.6fr) minmax(18rem, 1.6fr); align-items: start; }
        .admin {
            grid-template-columns: minmax(0, 2fr) minmax(0, 1.3fr) minmax(0, 1fr);
            padding-top: 0;
            align-items: start;
        }
        @media (max-width: 70rem) {
            main, .admin { grid-template-columns: minmax(0, 1fr); }
        }
        .panel {
            min-width: 0;
            padding: 0.8rem;
            background: var(--panel);
            border: 1px solid var(--line);
            border-radius: 6px;
        }

        /* Controls. */

        input, select, textarea, button { font: inherit; }
        input, select, textarea {
            padding: 0.3rem 0.45rem;
            border: 1px solid var(--line);
            border-radius: 4px;
            background: #fff;
            color: var(--text);
        }
        input[readonly] { background: var(--page); color: var(--muted); }
        input[type="number"] { width: 6rem; }
        button {
            padding: 0.3rem 0.8rem;
            border: 1px solid var(--line);
            border-radius: 4px;
            background: #f6f8fa;
            color: var(--text);
            cursor: pointer;
        }
        button:hover:not(:disabled) { border-color: var(--muted); }
        button:disabled { opacity: 0.5; cursor: default; }
        button.primary { background: var(--accent); border-color: var(--accent); color: #fff; }
        button.danger { color: var(--bad); }
        :focus-visible { outline: 2px solid var(--accent); outline-offset: 1px; }
        .inline { display: flex; gap: 0.4rem; margin-bottom: 0.6rem; }
        .inline input { flex: 1; min-width: 0; }
        .buttons { display: flex; gap: 0.4rem; margin-top: 0.6rem; }

        .message { margin: 0.4rem 0; min-height: 1em; }
        .message:empty { display: none; }
        .message.error, .message.conflict { color: var(--bad); }
        .message.conflict { padding: 0.5rem; background: var(--bad-bg); border-radius: 4px; }
        .message.saved, .message.deleted { color: var(--ok); }
        .message.pending { color: var(--muted); }
        .message pre {
            max-height: 12rem;
            overflow: auto;
            padding: 0.4rem;
            background: #fff;
            border: 1px solid var(--line);
        }
        .note { margin: 0.4rem 0; color: var(--warn); }
        .note:empty { display: none; }

        /* Collections tree. */

        .tree { list-style: none; margin: 0; padding-left: 0.9rem; }
        #collections > .tree { padding-left: 0; }
        .tree-link {
            display: inline-flex;
            gap: 0.4rem;
            align-items: baseline;
            padding: 0.1rem 0.4rem;
            border: none;
            background: none;
            color: var(--accent);
            font-family: var(--mono);
            font-size: 0.85rem;
            text-align: left;
        }
        .tree-link.current { background: #ddeafe; border-radius: 4px; font-weight: 600; }
        .tree-link .count { color: var(--muted); font-family: inherit; }
        .tree-document-id { font-family: var(--mono); font-size: 0.8rem; color: var(--muted); padding-left: 0.4rem; }
        .tree-document-id::before { content: "▸ "; }
        .empty { color: var(--muted); }

        /* Tables. */

        .scroll { overflow: auto; }
        .documents-scroll { max-height: 60vh; border: 1px solid var(--line); border-radius: 4px; }
        table { width: 100%; border-collapse: collapse; }
        th, td { padding: 0.25rem 0.5rem; text-align: left; vertical-align: top; border-bottom: 1px solid var(--line); }
        th { position: sticky; top: 0; background: #f6f8fa; font-weight: 600; font-size: 0.85rem; }
        #documents td { font-family: var(--mono); font-size: 0.8rem; white-space: nowrap; }
        #documents td.cell-fields { max-width: 28rem; overflow: hidden; text-overflow: ellipsis; }
        #documents tbody tr { cursor: pointer; transition: background-color 0.8s ease-out; }
        #documents tbody tr:hover { background: #f0f4f9; }
        #documents tbody tr.selected { background: #ddeafe; }
        /* Rows that just changed: the colour fades when the class goes (the transition above). */
        #documents tbody tr.change-added { background: var(--added); transition: none; }
        #documents tbody tr.change-modified { background: var(--modified); transition: none; }
        #documents tbody tr.change-deleted {
            background: var(--deleted);
            text-decoration: line-through;
            opacity: 0.6;
            cursor: default;
        }
        #clients td { font-size: 0.85rem; }
        #clients tr.this-console td:first-child { font-weight: 600; }
        .listens { margin: 0; padding-left: 1rem; font-family: var(--mono); font-size: 0.8rem; }

        /* Change log. */

        .changes {
            list-style: none;
            margin: 0;
            padding: 0;
            max-height: 14rem;
            overflow: auto;
            font-family: var(--mono);
            font-size: 0.8rem;
        }
        .changes li { padding: 0.05rem 0.3rem; border-left: 3px solid transparent; }
        .changes li[data-kind="added"] { border-left-color: var(--ok); }
        .changes li[data-kind="modified"] { border-left-color: #d4a72c; }
        .changes li[data-kind="deleted"] { border-left-color: var(--bad); }

        /* Editor. */

        #editor label { display: flex; flex-direction: column; gap: 0.2rem; margin-bottom: 0.5rem; }
        #editor-fields { width: 100%; resize: vertical; min-height: 12rem; }
        .editor-where { margin: 0 0 0.5rem; color: var(--muted); }

        /* Fault injection: marked so nobody mistakes it for a setting. */

        .faults { border: 2px dashed var(--bad); }
        .faults[data-enabled="true"] { background: var(--bad-bg); }
        .faults h2 { color: var(--bad); }
        .fault { display: flex; flex-wrap: wrap; gap: 0.4rem 1rem; align-items: center; margin: 0.4rem 0; }
        .fault label:first-child { min-width: 13rem; }

        @media (prefers-reduced-motion: reduce) {
            #documents tbody tr { transition: none; }
        }
        """#
}
