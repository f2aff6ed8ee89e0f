// crl-bench viewer: shared plumbing (data loading, routing, safe DOM building).
// Security rule for every file of this app: untrusted text (observations, actions, model output, run
// metadata) reaches the page only through text nodes (V.el children, textContent), never innerHTML.
"use strict";
(function () {
  const V = (window.CRLVIEW = { store: Object.create(null), waiting: Object.create(null), pages: Object.create(null) });

  // Data files call put(key, data); load(key, src) adds a <script> tag once and resolves when it has.
  V.put = function (key, data) {
    V.store[key] = data;
    const w = V.waiting[key];
    if (w) { delete V.waiting[key]; w.resolve(data); }
  };
  const pending = Object.create(null);
  V.load = function (key, src) {
    if (key in V.store) return Promise.resolve(V.store[key]);
    if (pending[key]) return pending[key];
    pending[key] = new Promise(function (resolve, reject) {
      V.waiting[key] = { resolve: resolve };
      const s = document.createElement("script");
      s.src = src;
      s.onerror = function () {
        delete pending[key]; delete V.waiting[key];
        reject(new Error("could not load " + src + " (was the site copied whole?)"));
      };
      document.head.appendChild(s);
    });
    return pending[key];
  };

  // el("div", {className: "x", href: "#/..."}, "text", child, ...): strings become text nodes.
  V.el = function (tag, attrs) {
    const e = document.createElement(tag);
    if (attrs) {
      for (const k of Object.keys(attrs)) {
        const v = attrs[k];
        if (v === undefined || v === null || v === false) continue;
        if (k === "className") e.className = v;
        else if (k === "href") e.setAttribute("href", V.safeHref(v));
        else if (k === "title") e.title = String(v);
        else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
        else if (k === "dataset") Object.assign(e.dataset, v);
        else e.setAttribute(k, v === true ? "" : String(v));
      }
    }
    for (let i = 2; i < arguments.length; i++) V.append(e, arguments[i]);
    return e;
  };
  V.append = function (parent, c) {
    if (c === null || c === undefined || c === false) return;
    if (Array.isArray(c)) { for (const x of c) V.append(parent, x); return; }
    parent.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  };
  // Only in-site hash links and http(s) links are ever made clickable.
  V.safeHref = function (h) {
    h = String(h);
    return h.startsWith("#") || /^https?:\/\//i.test(h) ? h : "#/";
  };

  // Where q occurs in text, case-insensitively, as [start, end, "hit"] ranges (at most MAX_HITS of them).
  V.MAX_HITS = 200;
  V.findAll = function (text, q) {
    const out = [];
    if (!q || !text) return out;
    const re = new RegExp(q.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"), "gi");
    for (let m = re.exec(text); m && out.length < V.MAX_HITS; m = re.exec(text)) out.push([m.index, m.index + m[0].length, "hit"]);
    return out;
  };
  // Text as nodes with [start, end, kind] ranges wrapped: "hit" in <mark class=hit>, "chg" in <span class=chg>.
  // Characters that change how text around them is shown while being invisible themselves (bidi overrides and
  // isolates, which can show "gnp.exe" as "exe.png"; zero-width spaces and joiners; the BOM; soft hyphens) are
  // shown as visible tags such as ‹U+202E›, so an observation or an action reads as what it is.
  V.CONTROLS = /[\u00AD\u061C\u180E\u200B-\u200F\u202A-\u202E\u2060-\u2064\u2066-\u2069\uFEFF]/g;
  V.visible = function (text) {
    V.CONTROLS.lastIndex = 0;
    if (!V.CONTROLS.test(text)) return [text];
    const out = [];
    let at = 0;
    V.CONTROLS.lastIndex = 0;
    for (let m = V.CONTROLS.exec(text); m; m = V.CONTROLS.exec(text)) {
      if (m.index > at) out.push(text.slice(at, m.index));
      const code = "U+" + m[0].charCodeAt(0).toString(16).toUpperCase().padStart(4, "0");
      out.push(V.el("span", { className: "ctl", title: "an invisible control character, " + code + ", shown as a tag" }, "‹" + code + "›"));
      at = m.index + 1;
    }
    if (at < text.length) out.push(text.slice(at));
    return out;
  };
  V.decorate = function (text, ranges) {
    if (!ranges.length) return V.visible(text);
    const points = [0, text.length];
    for (const r of ranges) points.push(r[0], r[1]);
    const cuts = Array.from(new Set(points)).sort(function (a, b) { return a - b; });
    const out = [];
    for (let i = 0; i + 1 < cuts.length; i++) {
      const a = cuts[i], b = cuts[i + 1], piece = text.slice(a, b);
      let hit = false, chg = false;
      for (const r of ranges) if (r[0] <= a && b <= r[1]) { if (r[2] === "hit") hit = true; else chg = true; }
      const shown = V.visible(piece);
      out.push(hit ? V.el("mark", { className: "hit" + (chg ? " chg" : "") }, shown) : chg ? V.el("span", { className: "chg" }, shown) : shown);
    }
    return out;
  };
  // Text with the search q marked; an element holding the text, for <pre> and <code> alike.
  V.marked = function (tag, attrs, text, q) {
    text = text === null || text === undefined ? "" : String(text);
    return V.el(tag, attrs, V.decorate(text, V.findAll(text, q)));
  };

  // Long strings (a 1 MB line) are shown cut, with a button for the rest, so layout stays fast.
  V.SHOW_CHARS = 20000;
  V.pre = function (text, className, q) {
    text = text === null || text === undefined ? "" : String(text);
    const attrs = { className: className || "text" };
    if (text.length <= V.SHOW_CHARS) return V.marked("pre", attrs, text, q);
    const p = V.marked("pre", attrs, text.slice(0, V.SHOW_CHARS), q);
    // Matches past the cut are shown in excerpts of their own, so every match is on the page (n / N reach it).
    const later = V.findAll(text, q).filter(function (h) { return h[1] > V.SHOW_CHARS; });
    const windows = [];
    for (const h of later) {
      const a = Math.max(V.SHOW_CHARS, h[0] - V.EXCERPT), b = Math.min(text.length, h[1] + V.EXCERPT), last = windows[windows.length - 1];
      if (last && a <= last[1]) last[1] = Math.max(last[1], b); else windows.push([a, b]);
    }
    const excerpts = windows.map(function (w) {
      const ranges = later.filter(function (h) { return h[0] < w[1] && h[1] > w[0]; })
        .map(function (h) { return [Math.max(h[0], w[0]) - w[0], Math.min(h[1], w[1]) - w[0], "hit"]; });
      return V.el("div", { className: "excerpt" }, V.el("div", { className: "note" }, "… characters " + (w[0] + 1).toLocaleString() + "–" +
        w[1].toLocaleString() + " of " + text.length.toLocaleString() + " (a match):"), V.el("pre", attrs, V.decorate(text.slice(w[0], w[1]), ranges)));
    });
    const more = V.el("button", { type: "button", className: "more" },
      "show all " + text.length.toLocaleString() + " characters");
    const box = V.el("div", null, p, excerpts, more);
    more.addEventListener("click", function () {
      p.textContent = ""; V.append(p, V.decorate(text, V.findAll(text, q)));
      for (const x of box.querySelectorAll(".excerpt")) x.remove();
      more.remove();
    });
    return box;
  };
  V.EXCERPT = 300; // characters shown either side of a match past the cut

  // Collapsed <details> whose body is built only when first opened (messages can be large).
  // open: built and opened at once (it holds a search match nothing else on the page shows).
  V.lazyDetails = function (summary, build, className, open) {
    const d = V.el("details", { className: className || "" }, V.el("summary", null, summary));
    d.addEventListener("toggle", function () {
      if (d.open && !d.dataset.built) { d.dataset.built = "1"; V.append(d, build()); }
    });
    if (open) { d.dataset.built = "1"; V.append(d, build()); d.open = true; }
    return d;
  };

  V.pct = function (x) { return x === null || x === undefined || Number.isNaN(x) ? "n/a" : (100 * x).toFixed(1); };
  V.fmt = function (x, digits) {
    if (x === null || x === undefined || Number.isNaN(x)) return "–";
    return typeof x === "number" ? (Number.isInteger(x) ? String(x) : x.toFixed(digits === undefined ? 2 : digits)) : String(x);
  };
  V.shortTask = function (envId) { return String(envId).replace(/^crl\//, "").replace(/-v\d+$/, ""); };

  // Routes are "#/page?key=value&..."; every view restores itself from its hash alone.
  V.route = function () {
    const h = location.hash.replace(/^#\/?/, "");
    const q = h.indexOf("?");
    return { page: (q < 0 ? h : h.slice(0, q)) || "", params: new URLSearchParams(q < 0 ? "" : h.slice(q + 1)) };
  };
  V.link = function (page, params) {
    const p = new URLSearchParams();
    for (const k of Object.keys(params || {})) {
      const v = params[k];
      if (v !== undefined && v !== null && v !== "") p.set(k, String(v));
    }
    const qs = p.toString();
    return "#/" + page + (qs ? "?" + qs : "");
  };
  // Change the hash without re-rendering (step moves, filters): keeps the permalink current.
  V.replaceHash = function (hash) {
    if (location.hash !== hash) history.replaceState(null, "", hash);
  };

  V.site = function () { return V.store.site; };
  V.run = function (id) {
    const r = V.site().runs.find(function (x) { return x.id === id; });
    if (!r) throw new Error("no run " + JSON.stringify(String(id)) + " in this site");
    return r;
  };

  // A run's episode index as objects, plus a lookup by task#seed#sample.
  V.index = function (run) {
    return V.load(run.id + "/index", "data/" + run.id + "/index.js").then(function (idx) {
      if (idx.episodes) return idx;
      const f = idx.fields;
      idx.episodes = idx.rows.map(function (row, i) {
        const ep = { i: i };
        for (let j = 0; j < f.length; j++) ep[f[j]] = row[j];
        ep.env = run.tasks[ep.task];
        ep.outcome = ep.error ? "errored" : ep.success ? "success" : "failure";
        return ep;
      });
      idx.byKey = new Map(idx.episodes.map(function (e) { return [e.env + "#" + e.seed + "#" + e.sample, e]; }));
      return idx;
    });
  };
  V.findEpisode = function (idx, env, seed, sample) {
    return idx.byKey.get(env + "#" + seed + "#" + (sample === null || sample === undefined || sample === "" ? 0 : sample));
  };
  V.episodeData = function (run, ep) {
    if (!ep.chunk) return Promise.resolve(null);
    const key = run.id + "/traj-" + ep.chunk[0];
    return V.load(key, "data/" + run.id + "/traj-" + ep.chunk[0] + ".js").then(function (c) { return c[ep.chunk[1]]; });
  };
  V.searchTexts = function (run) {
    return Promise.all(run.search_starts.map(function (_, c) {
      return V.load(run.id + "/search-" + c, "data/" + run.id + "/search-" + c + ".js");
    })).then(function (parts) { return [].concat.apply([], parts); });
  };
  V.actions = function (run) {
    return V.load(run.id + "/actions", "data/" + run.id + "/actions.js").then(function (a) {
      if (!a.lists) a.lists = a.episodes.map(function (ids) { return ids && ids.map(function (k) { return a.vocab[k]; }); });
      return a;
    });
  };
  // A step row (array) as an object with the field names of site.step_fields.
  V.step = function (row) {
    const f = V.site().step_fields, s = {};
    for (let j = 0; j < f.length; j++) s[f[j]] = row[j];
    return s;
  };
  V.summaryOnly = "This run is a summary only: its folder holds summary.json but no episodes.jsonl or trajectories " +
    "(a leaderboard submission may carry just its summary), so there are no episodes to list or compare; its per-task results are all there is.";
  // Why a run has no episode to list: no episodes.jsonl at all (a summary only), or one with no readable record.
  V.noEpisodes = function (run) {
    if (run.episodes_file === "empty") {
      return "This run's episodes.jsonl is empty (the run was stopped before its first episode ended, or the file was emptied), " +
        "so there are no episodes to list or compare; its summary's per-task results are all there is.";
    }
    if (run.episodes_file === "present") {
      return "No line of this run's episodes.jsonl could be read as an episode of this run (see the warnings on its run page), " +
        "so there are no episodes to list or compare; its summary's per-task results are all there is.";
    }
    return V.summaryOnly;
  };
  // What could not be read of a run (torn or invalid lines, a cut-off trajectories file), as a box; null if nothing.
  V.warningsBox = function (run) {
    const w = run.warnings || [];
    if (!w.length) return null;
    return V.el("div", { className: "warnings", id: "run-warnings", role: "note" },
      V.el("b", null, "Damaged run: " + w.length + (w.length === 1 ? " thing" : " things") + " could not be read and " +
        (w.length === 1 ? "is" : "are") + " left out"),
      V.el("ul", null, w.slice(0, 50).map(function (x) { return V.el("li", null, V.el("code", null, String(x))); }),
        w.length > 50 ? V.el("li", null, "… and " + (w.length - 50) + " more (the build printed them all)") : null));
  };
  // What the build left out (folders that are not runs, runs that could not be read), as a box; null if nothing.
  V.problemsBox = function (problems) {
    const w = problems || [];
    if (!w.length) return null;
    return V.el("div", { className: "warnings", id: "build-problems", role: "note" },
      V.el("b", null, "Left out of this site: " + w.length + (w.length === 1 ? " folder or run" : " folders or runs")),
      V.el("ul", null, w.map(function (x) { return V.el("li", null, V.el("code", null, String(x))); })));
  };
  V.stamp = function () {}; // data/stamp.js calls it; main.js watches for a newer build where the site asks
  // A wide table in a box of its own that scrolls sideways, its first column kept in view (CSS: .table-scroll).
  V.scrollTable = function (table, id) {
    return V.el("div", { className: "table-scroll", id: id }, table);
  };
  V.outcomeBadge = function (outcome) { return V.el("span", { className: "badge " + outcome }, outcome); };
  // First step index where two action lists differ; -1 when identical.
  V.firstDivergence = function (a, b) {
    const n = Math.min(a.length, b.length);
    for (let t = 0; t < n; t++) if (a[t] !== b[t]) return t;
    return a.length === b.length ? -1 : n;
  };

  V.setCrumbs = function (items) {
    const nav = document.getElementById("crumbs");
    nav.textContent = "";
    for (const it of items) {
      V.append(nav, V.el("span", { className: "sep" }, "›"));
      V.append(nav, it.href ? V.el("a", { href: it.href }, it.text) : V.el("span", null, it.text));
    }
  };
  V.onKey = null; // the current page's key handler: function(event) -> handled
})();
