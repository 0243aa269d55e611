// The pagekv inspector page. Hand-written, no dependencies, no build step.
//
// Rules this file keeps (the server's Content-Security-Policy enforces the first two):
// - no inline script, no eval, no HTML parsing: every node is made with createElement and
//   every value from an actor (state, rows, errors, names, keys) is set as text, so markup in
//   the data stays text;
// - the bearer token lives in sessionStorage (this tab only) and leaves the page only as an
//   Authorization header on fetches to this origin, never in a URL; a server that needs none
//   (/ui/auth.json says so) is never asked for one;
// - links are built here from "#/" and URI-encoded parts, so no data can make one a
//   javascript: URL.
"use strict";

(() => {
  const TOKEN_KEY = "pagekv.token";
  const ACTORS_PAGE = 50;
  const ROWS_PAGE = 20;
  const QUERY_ROWS = 200;
  const METRICS_EVERY_MS = 1000;
  const METRICS_POINTS = 120;

  const main = document.getElementById("main");
  const login = document.getElementById("login");
  const tokenInput = document.getElementById("token");
  const loginError = document.getElementById("login-error");
  const logout = document.getElementById("logout");
  const navMetrics = document.getElementById("nav-metrics");
  const banner = document.getElementById("banner");
  let leaveView = () => {};
  /** Whether this server needs a token (GET /ui/auth.json, read once before the first view). */
  let tokenRequired = true;
  /** What answers (a promise of GET /inspect): a server, or `pagekv ui`'s read-only view. */
  let about = null;

  // -- DOM ------------------------------------------------------------------------------------

  /** An element; `props` holds constant attributes of ours, `text`, `class` and `on*`
   * listeners; children are nodes or strings (appended as text nodes, never parsed). */
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "text") node.textContent = String(value);
      else if (name === "class") node.className = value;
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  }

  /** A link inside the page: always "#/" and encoded parts. */
  function link(text, ...parts) {
    return el("a", { href: "#/" + parts.map(encodeURIComponent).join("/"), text });
  }

  function errorText(error) {
    return error.code ? `${error.code}: ${error.message}` : String(error.message || error);
  }

  function errorLine(error, props) {
    return el("p", { class: "error", role: "alert", ...props, text: errorText(error) });
  }

  function section(title, id, ...children) {
    return el("section", { id }, el("h2", { text: title }), ...children);
  }

  /** A placeholder filled by `load()` once it resolves (or with its error). */
  function loading(load) {
    const box = el("div", { class: "muted", text: "loading…" });
    load().then(
      (node) => box.replaceChildren(node),
      (error) => box.replaceChildren(errorLine(error)),
    );
    return box;
  }

  // -- values as text -------------------------------------------------------------------------

  function isBytes(value) {
    return isTagged(value, "$bytes");
  }

  function isTagged(value, tag) {
    return value !== null && typeof value === "object" && !Array.isArray(value)
      && Object.keys(value).length === 1 && typeof value[tag] === "string";
  }

  /** One value as a line of text: JSON for structures, tagged bytes and floats spelled out. */
  function valueText(value) {
    if (isBytes(value)) return `bytes(${Math.floor((value.$bytes.length * 3) / 4)}) ${value.$bytes}`;
    if (isTagged(value, "$float")) return value.$float;
    if (typeof value === "string") return value;
    return JSON.stringify(value);
  }

  function kind(value) {
    if (value === null) return "null";
    if (isBytes(value)) return "bytes";
    return typeof value;
  }

  /** A value as a collapsible tree: objects and arrays are <details>, the rest leaves. */
  function tree(value, label, depth) {
    const nested = value !== null && typeof value === "object" && !isBytes(value)
      && !isTagged(value, "$float");
    if (!nested) {
      const shown = typeof value === "string" ? JSON.stringify(value) : valueText(value);
      return el("div", { class: "leaf" },
        el("span", { class: "k", text: `${label}: ` }),
        el("span", { class: `v v-${kind(value)}`, text: shown }));
    }
    const entries = Array.isArray(value) ? value.map((v, i) => [String(i), v]) : Object.entries(value);
    const shape = Array.isArray(value) ? `[${entries.length}]` : `{${entries.length}}`;
    return el("details", { class: "tree", open: depth < 2 },
      el("summary", { text: `${label} ${shape}` }),
      entries.map(([k, v]) => tree(v, k, depth + 1)));
  }

  function when(seconds) {
    return typeof seconds === "number" ? new Date(seconds * 1000).toISOString() : "";
  }

  function bytes(n) {
    if (typeof n !== "number") return "";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return `${i ? n.toFixed(1) : n} ${units[i]}`;
  }

  function duration(seconds) {
    if (typeof seconds !== "number" || seconds < 0) return "";
    if (seconds < 1) return `${(seconds * 1000).toFixed(1)} ms`;
    if (seconds < 120) return `${seconds.toFixed(2)} s`;
    return `${(seconds / 60).toFixed(1)} min`;
  }

  /** A key as a line of text: the empty key is a key too, and its link must show. */
  function keyText(key) {
    return key === "" ? "(empty key)" : key;
  }

  /** Who holds an actor's lease: the owning server's address ("this server" for the one
   * answering), or "-" while nobody does (asleep, or its owner's lease ran out). */
  function ownerText(owner) {
    if (!owner) return "-";
    const where = owner.address || `registry ${owner.registry} (no address)`;
    return owner.here ? `${where} (this server)` : where;
  }

  /** Rows as a table; `types` (column -> declared type) adds a line under each header. */
  function grid(columns, rows, types) {
    return el("table", {},
      el("thead", {}, el("tr", {}, columns.map((c) => el("th", {},
        c, types && types[c] !== undefined ? el("span", { class: "type", text: types[c] || "any" }) : null)))),
      el("tbody", {}, rows.map((row) => el("tr", {}, row.map((v) => el("td", { text: valueText(v) }))))));
  }

  // -- the API --------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  /** A request to this server with the token as a header; JSON answers parsed (or text). */
  async function api(path, { params, body, text } = {}) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (tokenRequired && !token) {
      askToken("");
      throw new ApiError(401, "unauthorized", "sign in with the server's token first");
    }
    const url = new URL(path, window.location.origin);
    for (const [name, value] of Object.entries(params || {})) {
      if (value !== undefined && value !== null) url.searchParams.set(name, value); // "" is a key
    }
    const headers = { Accept: "application/json" };
    if (tokenRequired) headers.Authorization = `Bearer ${token}`;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(url, {
      method: body === undefined ? "GET" : "POST",
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer",
    });
    const answer = await response.text();
    if (!response.ok) {
      let code = `http_${response.status}`;
      let message = answer;
      try {
        const error = JSON.parse(answer).error;
        code = error.code;
        message = error.message;
      } catch (_) { /* not JSON: the text is the message */ }
      if (response.status === 401) {
        sessionStorage.removeItem(TOKEN_KEY);
        askToken(`the server refused the token (${message})`);
      }
      throw new ApiError(response.status, code, message);
    }
    return text ? answer : JSON.parse(answer);
  }

  function actorPath(name, suffix) {
    return `/inspect/actors/${encodeURIComponent(name)}${suffix || ""}`;
  }

  /** GET /inspect once per sign-in (the promise is kept, so concurrent views share one
   * request, and dropped on failure, so the next view asks again): a read-only store view
   * shows a banner and no metrics. */
  function learnAbout() {
    if (about === null) {
      about = api("/inspect").then((server) => {
        navMetrics.hidden = server.read_only;
        banner.hidden = !server.read_only;
        banner.textContent = server.read_only
          ? `Read-only view of ${server.store || "the store"} (pagekv ui): nothing here changes it, and no actor runs here.`
          : "";
        return server;
      }, (error) => {
        about = null;
        throw error;
      });
    }
    return about;
  }

  // -- the token ------------------------------------------------------------------------------

  function askToken(message) {
    leaveView();
    leaveView = () => {};
    main.replaceChildren();
    logout.hidden = true;
    login.hidden = false;
    loginError.textContent = message;
    tokenInput.focus();
  }

  login.addEventListener("submit", async (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, tokenInput.value.trim());
    tokenInput.value = "";
    try {
      await api("/inspect/actors", { params: { limit: 1 } });
    } catch (error) {
      if (error.status !== 401) askToken(errorText(error));
      return;
    }
    about = null;
    login.hidden = true;
    logout.hidden = false;
    route();
  });

  logout.addEventListener("click", () => {
    about = null;
    sessionStorage.removeItem(TOKEN_KEY);
    askToken("");
  });

  // -- actors ---------------------------------------------------------------------------------

  function actorsView() {
    const cursors = [null];
    const filter = el("input", { id: "actor-filter", type: "search", placeholder: "actor type (exact name)" });
    const keyFilter = el("input", { id: "key-filter", type: "search", placeholder: "key starts with (needs the type)" });
    const list = el("div", { id: "actor-list" });
    const position = el("span", { class: "muted", id: "actor-page" });
    const previous = el("button", { type: "button", id: "actors-previous", text: "Previous", disabled: true });
    const next = el("button", { type: "button", id: "actors-next", text: "Next", disabled: true });

    async function show() {
      const after = cursors[cursors.length - 1];
      try {
        const page = await api("/inspect/actors", {
          params: { name: filter.value.trim() || null, key_prefix: keyFilter.value || null, after, limit: ACTORS_PAGE, usage: 1, owners: 1 },
        });
        list.replaceChildren(page.actors.length ? el("table", { id: "actors" },
          el("thead", {}, el("tr", {}, ["name", "key", "status", "owner", "created", "size"].map((c) => el("th", { text: c })))),
          el("tbody", {}, page.actors.map((a) => el("tr", {},
            el("td", {}, a.name),
            el("td", {}, link(keyText(a.key), "actor", a.name, a.key)),
            el("td", { class: a.live || a.owner ? "awake" : "asleep", text: a.live || a.owner ? "awake" : "asleep" }),
            el("td", { class: "owner", text: ownerText(a.owner) }),
            el("td", { text: when(a.created) }),
            el("td", { text: bytes(a.used_bytes) })))))
          : el("p", { class: "muted", text: "no actors" }));
        position.textContent = `page ${cursors.length}`;
        previous.disabled = cursors.length === 1;
        next.disabled = page.next_after === null;
        next.dataset.after = page.next_after === null ? "" : page.next_after;
      } catch (error) {
        list.replaceChildren(errorLine(error));
      }
    }

    previous.addEventListener("click", () => { cursors.pop(); show(); });
    next.addEventListener("click", () => { cursors.push(next.dataset.after); show(); });
    const search = el("form", { class: "toolbar", id: "actor-search" }, filter, keyFilter,
      el("button", { type: "submit", text: "Search" }));
    search.addEventListener("submit", (event) => {
      event.preventDefault();
      cursors.splice(1);
      show();
    });
    show();
    return section("Actors", "actors-view", search, list, el("div", { class: "pager" }, previous, position, next));
  }

  // -- one actor ------------------------------------------------------------------------------

  function summaryView(name, key) {
    return loading(async () => {
      const s = await api(actorPath(name), { params: { key } });
      const facts = [
        ["actor id", s.actor_id],
        ["status", s.live ? `awake (${s.instance.phase}, ${s.instance.active_calls} calls in flight)` : s.owner ? "awake" : "asleep"],
        ["owner", ownerText(s.owner)],
        ["created", when(s.created)],
        ["generation", String(s.generation)],
        ["database size", bytes(s.storage.size_bytes)],
        ["commits", String(s.storage.commits ?? "")],
      ];
      const usage = s.kv_usage;
      const share = usage.quota_bytes ? usage.used_bytes / usage.quota_bytes : 0;
      const bar = el("div", {});
      bar.style.width = `${Math.min(100, share * 100)}%`; // CSSOM: no inline style to allow
      return el("div", {},
        el("table", { id: "summary" }, el("tbody", {}, facts.map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", { text: v }))))),
        el("h3", { text: "KV usage" }),
        el("p", { id: "kv-usage", text: `${bytes(usage.used_bytes)} of ${bytes(usage.quota_bytes)} (${(share * 100).toFixed(3)} %)` }),
        el("div", { class: "usage" }, bar));
    });
  }

  function stateView(name, key) {
    return loading(async () => {
      const { state } = await api(actorPath(name, "/state"), { params: { key } });
      return el("div", { id: "state" }, tree(state, "state", 0));
    });
  }

  function tablesView(name, key) {
    const rowsBox = el("div", { id: "table-rows" });

    async function columnTypes(table) {
      const info = await api(actorPath(name, "/query"), {
        params: { key },
        body: { sql: "SELECT name, type FROM pragma_table_info(?)", params: [table] },
      });
      return Object.fromEntries(info.rows.map(([column, type]) => [column, type]));
    }

    async function open(table) {
      rowsBox.replaceChildren(el("h3", { text: table }), el("div", { class: "muted", text: "loading…" }));
      let types;
      try {
        types = await columnTypes(table);
      } catch (error) {
        types = undefined;
      }
      let offset = 0;
      const body = el("div", {});
      const position = el("span", { class: "muted", id: "rows-position" });
      const previous = el("button", { type: "button", id: "rows-previous", text: "Previous" });
      const next = el("button", { type: "button", id: "rows-next", text: "Next" });

      async function page() {
        try {
          const rows = await api(actorPath(name, `/tables/${encodeURIComponent(table)}`), {
            params: { key, limit: ROWS_PAGE, offset },
          });
          body.replaceChildren(grid(rows.columns, rows.rows, types));
          position.textContent = rows.rows.length
            ? `rows ${offset + 1}-${offset + rows.rows.length}` : "no rows";
          previous.disabled = offset === 0;
          next.disabled = !rows.truncated;
        } catch (error) {
          body.replaceChildren(errorLine(error));
        }
      }

      previous.addEventListener("click", () => { offset = Math.max(0, offset - ROWS_PAGE); page(); });
      next.addEventListener("click", () => { offset += ROWS_PAGE; page(); });
      rowsBox.replaceChildren(el("h3", { text: table }), body, el("div", { class: "pager" }, previous, position, next));
      await page();
    }

    return el("div", {}, loading(async () => {
      const { tables } = await api(actorPath(name, "/tables"), { params: { key } });
      return el("table", { id: "tables" },
        el("thead", {}, el("tr", {}, ["table", "rows", "columns", ""].map((c) => el("th", { text: c })))),
        el("tbody", {}, tables.map((t) => el("tr", { class: t.internal ? "muted" : undefined },
          el("td", { text: t.internal ? `${t.name} (runtime)` : t.name }),
          el("td", { text: String(t.rows) }),
          el("td", { text: t.columns.join(", ") }),
          el("td", {}, el("button", { type: "button", class: "open-table", "data-table": t.name, text: "Open", onclick: () => open(t.name) }))))));
    }), rowsBox);
  }

  function consoleView(name, key) {
    const sql = el("textarea", { id: "sql", spellcheck: "false", placeholder: "SELECT … (one read-only statement)" });
    const result = el("div", { id: "sql-result" });
    const run = el("button", { type: "submit", id: "sql-run", text: "Run" });
    const form = el("form", {}, sql, el("div", { class: "toolbar" }, run,
      el("span", { class: "muted", text: `read-only, one statement, at most ${QUERY_ROWS} rows` })));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      run.disabled = true;
      result.replaceChildren(el("div", { class: "muted", text: "running…" }));
      try {
        const rows = await api(actorPath(name, "/query"), {
          params: { key },
          body: { sql: sql.value, params: [], max_rows: QUERY_ROWS },
        });
        result.replaceChildren(grid(rows.columns, rows.rows),
          el("p", { class: "muted", text: `${rows.rows.length} rows${rows.truncated ? " (more matched)" : ""}` }));
      } catch (error) {
        result.replaceChildren(errorLine(error, { id: "sql-error" }));
      } finally {
        run.disabled = false;
      }
    });
    return el("div", {}, form, result);
  }

  function rowsView(name, key, suffix, id) {
    return loading(async () => {
      const rows = await api(actorPath(name, suffix), { params: { key } });
      return rows.rows.length
        ? el("div", { id }, grid(rows.columns, rows.rows))
        : el("p", { id, class: "muted", text: "none" });
    });
  }

  function workflowLink(name, key) {
    return loading(async () => {
      try {
        const { workflow } = await api(actorPath(name, "/workflow"), { params: { key } });
        return el("p", {}, `${workflow.state}, ${workflow.entries.length} entries: `,
          link("open the timeline", "workflow", name, key));
      } catch (error) {
        if (error.code === "no_workflow") return el("p", { class: "muted", text: "no workflow" });
        throw error;
      }
    });
  }

  function actorView(name, key) {
    return el("div", { id: "actor-view" },
      el("p", {}, link("← actors", "actors")),
      section(`${name} / ${keyText(key)}`, "summary-section", summaryView(name, key)),
      section("State", "state-section", stateView(name, key)),
      section("Tables", "tables-section", tablesView(name, key)),
      section("SQL console", "console-section", consoleView(name, key)),
      section("Queue", "queue-section", rowsView(name, key, "/queue", "queue")),
      section("Schedules", "schedules-section", rowsView(name, key, "/schedules", "schedules")),
      section("Workflow", "workflow-section", workflowLink(name, key)));
  }

  // -- a workflow -----------------------------------------------------------------------------

  const UNFINISHED = new Set(["pending", "running", "failed", "exhausted"]);
  const FINAL = new Set(["completed", "cancelled"]);

  /** Where the workflow is: its first unfinished entry, else its last while it still runs. */
  function currentIndex(workflow) {
    const open = workflow.entries.findIndex((e) => UNFINISHED.has(e.status));
    if (open >= 0) return open;
    return FINAL.has(workflow.state) ? -1 : workflow.entries.length - 1;
  }

  function entryView(entry, current, replay) {
    const end = entry.completed ?? entry.last_attempt;
    const took = end === null || end === undefined ? null : end - entry.created;
    return el("li", { class: `entry status-${entry.status}${current ? " current" : ""}`, "aria-current": current ? "step" : undefined },
      el("div", { class: "entry-head" },
        el("span", { class: "badge", text: entry.kind }),
        el("span", { class: "entry-name", text: entry.name }),
        el("span", { class: "entry-status", text: entry.status }),
        el("span", { class: "muted", text: `attempts ${entry.attempts}` }),
        el("span", { class: "muted", text: took === null ? "" : `${entry.completed ? "took" : "so far"} ${duration(took)}` }),
        el("span", { class: "muted", text: when(entry.created) }),
        replay ? el("button", { type: "button", class: "replay", "data-location": entry.location, text: "Replay from here", onclick: () => replay(entry.location) }) : null),
      el("div", { class: "muted", text: entry.location }),
      entry.error ? el("pre", { class: "error entry-error", text: entry.error }) : null,
      entry.rollback_error ? el("pre", { class: "error", text: `rollback: ${entry.rollback_error}` }) : null,
      entry.data && Object.keys(entry.data).length ? tree(entry.data, "data", 1) : null);
  }

  /** A question with two buttons in place of `box`'s content; `yes()` runs only on "yes". */
  function confirmIn(box, question, yesText, yes) {
    const answerYes = el("button", { type: "button", id: "confirm-yes", class: "danger", text: yesText });
    const answerNo = el("button", { type: "button", id: "confirm-no", text: "Keep it as it is" });
    answerNo.addEventListener("click", () => box.replaceChildren());
    answerYes.addEventListener("click", async () => {
      answerYes.disabled = answerNo.disabled = true;
      try {
        await yes();
      } catch (error) {
        box.replaceChildren(errorLine(error, { id: "workflow-change-error" }));
      }
    });
    box.replaceChildren(el("div", { class: "confirm", role: "alertdialog", id: "confirm" },
      el("p", { text: question }), el("div", { class: "toolbar" }, answerYes, answerNo)));
  }

  /** What a replay from `location` forgets, as the server does it: the entry and every later
   * one, or, inside a loop, the outermost loop holding it with all its iterations (a loop's
   * entry records the iteration it is at, so forgetting less would resume it past the entry). */
  function replayQuestion(location) {
    const segments = location.split("/");
    const iteration = segments.findIndex((s) => s.startsWith("~"));
    const forgotten = iteration < 0 ? location
      : `the loop ${segments.slice(0, iteration).join("/")} (all its iterations, ${location} among them)`;
    return `Forget ${forgotten} and every entry after it, then run the workflow again from there?`;
  }

  function workflowView(name, key) {
    const body = el("div", {});
    const ask = el("div", { id: "workflow-ask" });

    async function change(what, payload, question, yesText) {
      confirmIn(ask, question, yesText, async () => {
        const done = await api(actorPath(name, `/workflow/${what}`), { params: { key }, body: payload });
        show(`${what === "cancel" ? "cancelled" : "replaying"}: the workflow is ${done.state} now`);
      });
    }

    function show(notice) {
      ask.replaceChildren(notice ? el("p", { id: "workflow-notice", role: "status", text: notice }) : "");
      body.replaceChildren(loading(async () => {
        const [{ workflow }, server] = await Promise.all([
          api(actorPath(name, "/workflow"), { params: { key } }), learnAbout()]);
        const current = currentIndex(workflow);
        const steerable = !server.read_only;
        const replay = steerable ? (location) => change("replay", { from: location },
          replayQuestion(location), "Yes, replay from here") : null;
        const controls = steerable
          ? el("div", { class: "toolbar" },
            FINAL.has(workflow.state) ? null : el("button", { type: "button", id: "workflow-cancel", class: "danger", text: "Cancel workflow",
              onclick: () => change("cancel", {}, `Cancel the workflow of ${name} / ${keyText(key)}? No step runs after this, and later wakes do not run it.`, "Yes, cancel it") }),
            el("button", { type: "button", id: "workflow-replay-all", text: "Replay from the start",
              onclick: () => change("replay", { from: null }, `Forget the whole history of ${name} / ${keyText(key)} and run the workflow again from the start?`, "Yes, replay all") }))
          : el("p", { class: "muted", id: "workflow-read-only", text: "read-only view (pagekv ui): cancel and replay through the server that runs the actor" });
        return el("div", {},
          el("p", { id: "workflow-state", text: `state: ${workflow.state}` }),
          controls,
          workflow.error ? el("pre", { class: "error", id: "workflow-error", text: valueText(workflow.error) }) : null,
          workflow.output !== null && workflow.output !== undefined ? tree(workflow.output, "output", 0) : null,
          el("ol", { class: "timeline", id: "timeline" }, workflow.entries.map((e, i) => entryView(e, i === current, replay))));
      }));
    }

    show("");
    return el("div", { id: "workflow-view" },
      el("p", {}, link("← actor", "actor", name, key)),
      section(`Workflow of ${name} / ${keyText(key)}`, "workflow", ask, body));
  }

  // -- metrics --------------------------------------------------------------------------------

  /** Prometheus text exposition -> {metric name: summed value}, labels summed over; a
   * histogram's buckets as "NAME_bucket@LE" (summed over the other labels), for quantiles. */
  function parseMetrics(text) {
    const totals = {};
    for (const line of text.split("\n")) {
      if (!line || line.startsWith("#")) continue;
      const cut = line.lastIndexOf(" ");
      const series = line.slice(0, cut);
      const value = Number(line.slice(cut + 1));
      const name = series.split("{")[0];
      const le = /[{,]le="([^"]*)"/.exec(series);
      const id = le ? `${name}@${le[1]}` : name;
      totals[id] = (totals[id] || 0) + value;
    }
    return totals;
  }

  /** The `q` quantile of a histogram over the interval from `before` to `now`: the upper bound
   * of the first bucket holding it (null while nothing was observed; past the last finite
   * bucket, that bucket's bound: the quantile is at least that; Infinity if there is no
   * finite bucket: no bound to name). */
  function quantile(name, q, now, before) {
    const prefix = `${name}_bucket@`;
    const bounds = Object.keys(now).filter((k) => k.startsWith(prefix))
      .map((k) => [k.slice(prefix.length), (now[k] ?? 0) - (before[k] ?? 0)])
      .map(([le, n]) => [le === "+Inf" ? Infinity : Number(le), n])
      .sort((a, b) => a[0] - b[0]);
    const total = bounds.length ? bounds[bounds.length - 1][1] : 0;
    if (total <= 0) return null;
    const found = bounds.find(([, n]) => n >= q * total)[0];
    if (Number.isFinite(found)) return found;
    const finite = bounds.map(([le]) => le).filter(Number.isFinite);
    return finite.length ? Math.max(...finite) : Infinity;
  }

  const CHARTS = [
    { id: "actions", title: "actions/s", rate: "pagekv_actions_total" },
    { id: "latency", title: "mean action latency (ms)", ratio: ["pagekv_action_duration_seconds_sum", "pagekv_action_duration_seconds_count"], scale: 1000 },
    { id: "latency-p95", title: "p95 action latency (ms, bucket bound)", quantile: ["pagekv_action_duration_seconds", 0.95], scale: 1000 },
    { id: "wakes", title: "wakes/s", rate: "pagekv_wakes_total" },
    { id: "round-trips", title: "KV round trips/s", rate: "pagekv_kv_round_trips_total" },
    { id: "commit-bytes", title: "mean commit size (bytes)", ratio: ["pagekv_commit_bytes_sum", "pagekv_commit_bytes_count"] },
    { id: "hit-rate", title: "page-cache hit rate (%)", gauge: "pagekv_vfs_cache_hit_ratio", scale: 100 },
    { id: "awake", title: "actors awake", gauge: "pagekv_actors_live" },
  ];

  function point(chart, now, before, seconds) {
    const scale = chart.scale || 1;
    if (chart.gauge) return (now[chart.gauge] ?? 0) * scale;
    if (!before) return null;
    if (chart.rate) return ((now[chart.rate] ?? 0) - (before[chart.rate] ?? 0)) / seconds;
    if (chart.quantile) {
      const bound = quantile(...chart.quantile, now, before);
      if (bound === null) return 0;
      return Number.isFinite(bound) ? bound * scale : null; // null: nothing to chart
    }
    const [sum, count] = chart.ratio;
    const n = (now[count] ?? 0) - (before[count] ?? 0);
    return n > 0 ? (((now[sum] ?? 0) - (before[sum] ?? 0)) / n) * scale : 0;
  }

  function draw(canvas, values) {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth * ratio;
    const height = canvas.clientHeight * ratio;
    canvas.width = width;
    canvas.height = height;
    const g = canvas.getContext("2d");
    g.clearRect(0, 0, width, height);
    const top = Math.max(...values, 0) || 1;
    g.strokeStyle = "#d7dbe3";
    g.strokeRect(0, 0, width, height);
    g.fillStyle = "#687083";
    g.font = `${11 * ratio}px system-ui, sans-serif`;
    g.fillText(top.toPrecision(3), 4 * ratio, 12 * ratio);
    g.strokeStyle = "#2f5bd3";
    g.lineWidth = 1.5 * ratio;
    g.beginPath();
    values.forEach((v, i) => {
      const x = (i / (METRICS_POINTS - 1)) * width;
      const y = height - (v / top) * (height - 16 * ratio) - 2 * ratio;
      if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
    });
    g.stroke();
  }

  function metricsView() {
    const history = Object.fromEntries(CHARTS.map((c) => [c.id, []]));
    const status = el("p", { class: "muted", id: "metrics-status" });
    const tiles = CHARTS.map((chart) => {
      const value = el("div", { class: "value", id: `metric-${chart.id}` });
      const canvas = el("canvas", { id: `chart-${chart.id}` });
      return { chart, value, canvas, node: el("div", { class: "chart" }, el("h3", { text: chart.title }), value, canvas) };
    });
    let before = null;
    let beforeAt = 0;
    let timer = null;
    let stopped = false;

    async function refresh() {
      try {
        const now = parseMetrics(await api("/metrics", { text: true }));
        const at = performance.now();
        for (const { chart, value, canvas } of tiles) {
          const v = point(chart, now, before, (at - beforeAt) / 1000);
          if (v === null) continue;
          const series = history[chart.id];
          series.push(v);
          if (series.length > METRICS_POINTS) series.shift();
          value.textContent = Number.isInteger(v) ? String(v) : v.toFixed(2);
          draw(canvas, series);
        }
        before = now;
        beforeAt = at;
        status.textContent = `updated ${new Date().toLocaleTimeString()}, every ${METRICS_EVERY_MS / 1000} s`;
      } catch (error) {
        status.replaceChildren(errorLine(error));
      }
      if (!stopped) timer = setTimeout(refresh, METRICS_EVERY_MS);
    }

    learnAbout().then((server) => {
      if (server.read_only) {
        status.textContent = "no metrics here: pagekv ui runs no actor; open the page of a server (pagekv serve)";
        return;
      }
      refresh();
    }, (error) => status.replaceChildren(errorLine(error)));
    leaveView = () => { stopped = true; clearTimeout(timer); };
    return section("Metrics", "metrics-view", status, el("div", { class: "charts" }, tiles.map((t) => t.node)));
  }

  // -- routing --------------------------------------------------------------------------------

  function route() {
    leaveView();
    leaveView = () => {};
    if (tokenRequired && !sessionStorage.getItem(TOKEN_KEY)) {
      askToken("");
      return;
    }
    login.hidden = true;
    logout.hidden = !tokenRequired;
    learnAbout().catch((error) => {
      banner.hidden = false;
      banner.textContent = `cannot tell what serves this page: ${errorText(error)}`;
    });
    let parts;
    try {
      parts = window.location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
    } catch (_) {
      parts = []; // a malformed address: the actor list
    }
    let view;
    if (parts[0] === "actor" && parts.length === 3) view = actorView(parts[1], parts[2]);
    else if (parts[0] === "workflow" && parts.length === 3) view = workflowView(parts[1], parts[2]);
    else if (parts[0] === "metrics") view = metricsView();
    else view = actorsView();
    main.replaceChildren(view);
  }

  /** Whether to ask for a token at all; if the answer cannot be read, the page asks for one
   * (a wrong guess there costs a prompt, the other way a page of 401s). */
  async function start() {
    try {
      const response = await fetch("/ui/auth.json", { cache: "no-store", credentials: "omit" });
      if (response.ok) tokenRequired = (await response.json()).token_required !== false;
    } catch (_) { /* unreachable or not JSON: keep asking for a token */ }
    window.addEventListener("hashchange", route);
    route();
  }

  start();
})();
