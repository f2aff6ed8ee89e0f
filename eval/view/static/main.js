// crl-bench viewer: the router, the help overlay and the global keys.
"use strict";
(function () {
  const V = window.CRLVIEW;
  const app = document.getElementById("app");
  let renderId = 0;

  function home() {
    const site = V.site(), plain = site.runs.filter(function (r) { return !r.training; }), ts = site.trainings || [];
    if (site.leaderboard) return "leaderboard";
    if (ts.length) return ts.length === 1 && !plain.length ? "training" : "trainings";
    return plain.length === 1 ? "run" : "runs";
  }

  V.pages.runs = function (params, root) {
    const site = V.site(), runs = site.runs.filter(function (r) { return !r.training; }), ts = site.trainings || [];
    V.setCrumbs([{ text: "Runs" }]);
    document.title = site.title;
    root.appendChild(V.el("h1", null, site.title));
    V.append(root, V.problemsBox(site.problems));
    if (ts.length) root.appendChild(V.el("p", null, V.el("a", { className: "button", href: V.link("trainings", {}) }, "Training runs (" + ts.length + ")")));
    // macro success right after the name: on a phone it is the number on screen without scrolling sideways
    const table = V.el("table", { className: "grid runs" },
      V.el("thead", null, V.el("tr", null, ["run", "macro success %", "episodes", "with steps", "agent", "folder"]
        .map(function (h) { return V.el("th", null, h); }))));
    const body = V.el("tbody");
    for (const r of runs) {
      const m = r.summary.macro || {};
      body.appendChild(V.el("tr", null,
        V.el("td", { className: "run-name" }, V.el("a", { href: V.link("run", { run: r.id }), title: r.label }, r.label),
          r.summary.incomplete ? [" ", V.el("span", { className: "badge incomplete" }, "incomplete")] : null),
        V.el("td", { className: "num macro-success" }, V.pct(m.success) + " ± " + V.pct(m.success_se)),
        V.el("td", { className: "num" }, r.episodes),
        V.el("td", { className: "num" }, r.trajectories + (r.no_steps ? " (" + r.no_steps + " without)" : "")),
        V.el("td", null, (r.summary.agent || {}).name || "?"),
        V.el("td", { className: "path" }, r.folder)));
    }
    table.appendChild(body);
    root.appendChild(V.scrollTable(table, "runs-table"));
    if (runs.length > 1) root.appendChild(V.el("p", null, V.el("a", { href: V.link("compare", {}) }, "Compare two runs side by side")));
  };

  // Poll for a newer build (python -m eval.view --watch): load data/stamp.js again now and then and reload the
  // page, address kept, once it names another build. (A <script> is the one way to read a file on file://.)
  if (V.site() && V.site().watch > 0) {
    let n = 0;
    V.stamp = function (s) {
      if (s === V.site().stamp) return;
      try { sessionStorage.setItem("crlview-scroll", String(window.scrollY)); } catch (e) { /* storage off: top */ }
      location.reload();
    };
    setInterval(function () {
      const tag = document.createElement("script");
      tag.src = "data/stamp.js?" + (++n);
      tag.onload = tag.onerror = function () { tag.remove(); };
      document.head.appendChild(tag);
    }, Math.max(500, 1000 * V.site().watch));
    V.watching = true;
  }

  function render() {
    const id = ++renderId;
    const r = V.route();
    const page = r.page || home();
    if (page === "run" && !r.params.get("run") && V.site().runs.length) r.params.set("run", V.site().runs[0].id);
    if (page === "training" && !r.params.get("t") && (V.site().trainings || []).length) r.params.set("t", V.site().trainings[0].id);
    const fn = V.pages[page];
    V.onKey = null;
    V.setCrumbs([]); // each page sets its own; none may outlive the page that set them
    const root = V.el("div", { className: "page page-" + page });
    app.textContent = "";
    app.appendChild(root);
    if (!fn) { showError(root, "Unknown page " + JSON.stringify(page) + "."); return; }
    let result;
    try { result = fn(r.params, root, function () { return id === renderId; }); }
    catch (e) { showError(root, e); return; }
    if (result && result.catch) result.catch(function (e) { if (id === renderId) showError(root, e); });
    let y = null;
    try { y = sessionStorage.getItem("crlview-scroll"); sessionStorage.removeItem("crlview-scroll"); } catch (e) { y = null; }
    if (y !== null) { // where the page was before a --watch reload
      Promise.resolve(result).then(function () { window.scrollTo(0, Number(y)); });
    }
  }
  // An error replaces whatever the page had drawn, crumbs included: they would name what failed to open.
  function showError(root, e) {
    V.setCrumbs([{ text: "Error" }]);
    document.title = "Error · crl-bench";
    root.textContent = "";
    root.appendChild(V.el("p", { className: "error" }, String(e && e.message ? e.message : e)));
    root.appendChild(V.el("p", null, V.el("a", { href: "#/" }, "Back to the start page")));
  }

  // Help overlay (?), closed with Escape or a click outside.
  const help = V.el("div", { id: "help", className: "overlay", hidden: true },
    V.el("div", { className: "dialog", role: "dialog", "aria-label": "Keyboard shortcuts" },
      V.el("h2", null, "Keys"),
      V.el("dl", null, [["j / k", "next / previous step (episode, compare; the episode list: row)"],
        ["J / K", "next / previous episode (in the list's order; in compare, the next task/seed pair)"],
        ["n / N", "next / previous search match in the episode"], ["f", "find in this episode"],
        ["c", "compact (repeated lines folded, changes marked) or full text"], ["d", "compare: go to the first differing step"],
        ["/", "search episodes"], ["?", "this help"], ["Esc", "close help, leave the search box"]]
        .map(function (kv) { return [V.el("dt", null, V.el("kbd", null, kv[0])), V.el("dd", null, kv[1])]; }))));
  document.body.appendChild(help);
  help.addEventListener("click", function (e) { if (e.target === help) help.hidden = true; });
  document.getElementById("help-button").addEventListener("click", function () { help.hidden = !help.hidden; });

  document.addEventListener("keydown", function (e) {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    const typing = /^(INPUT|TEXTAREA|SELECT)$/.test(document.activeElement && document.activeElement.tagName);
    if (e.key === "Escape") {
      if (!help.hidden) { help.hidden = true; e.preventDefault(); return; }
      if (typing) { document.activeElement.blur(); return; }
    }
    if (typing) return;
    if (e.key === "?") { help.hidden = !help.hidden; e.preventDefault(); return; }
    if (V.onKey && V.onKey(e)) e.preventDefault();
  });

  if (!V.site()) {
    app.textContent = "";
    app.appendChild(V.el("p", { className: "error" }, "The site's data (data/site.js) did not load: open index.html inside the " +
      "folder python -m eval.view wrote, with its assets/ and data/ folders beside it."));
    return;
  }
  window.addEventListener("hashchange", render);
  render();
})();
