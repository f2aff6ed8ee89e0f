// crl-bench viewer: the leaderboard page (one sortable, filterable table per task set).
"use strict";
(function () {
  const V = window.CRLVIEW;

  // Columns: [label, value for sorting, cell content, header tooltip, header class]. A name shows its short
  // display form, a model its start; both in full on hover.
  function columns(group) {
    if (group.kind === "experience") return experienceColumns(group);
    const cols = [
      ["rank", function (e) { return e.rank; }, function (e) { return e.rank; }],
      ["name", function (e) { return e.name.toLowerCase(); }, function (e) {
        const label = e.display || e.name;
        const cell = [e.run ? V.el("a", { href: V.link("run", { run: e.run }), className: "run-link lb-name", title: e.name }, label)
          : V.el("span", { className: "lb-name", title: e.name }, label)];
        if (/^https?:\/\//i.test(e.url || "")) cell.push(" ", V.el("a", { href: e.url, rel: "noopener noreferrer", className: "ext" }, "source"));
        return cell;
      }],
      // the success right after the name: on a phone it is in view beside the frozen rank and name
      ["macro success %", function (e) { return e.success; }, function (e) { return V.pct(e.success) + " ± " + V.pct(e.success_se); }, null, "success"],
      ["agent", function (e) { return e.agent; }, function (e) { return e.agent; }],
      ["model", function (e) { return e.model; }, function (e) { return V.el("span", { className: "lb-model", title: e.model }, e.model); }],
      ["step cap", function (e) { return e.step_cap === null ? Infinity : e.step_cap; }, function (e) { return e.step_cap === null ? "env" : e.step_cap; }],
      ["progress %", function (e) { return e.progress; }, function (e) { return V.pct(e.progress); }],
    ];
    for (const env of group.tasks) {
      cols.push([V.shortTask(env), function (e) { const t = e.tasks[env]; return t ? t.success : -1; }, function (e) {
        const t = e.tasks[env];
        return t ? [V.pct(t.success) + " ± " + V.pct(t.success_se) + " ", V.el("span", { className: "n" }, "n=" + t.episodes)] : "–";
      }, env, "task"]);
    }
    cols.push(["verified", function (e) { return e.verified ? 1 : 0; }, function (e) { return e.verified ? "yes" : "no"; }]);
    cols.push(["date", function (e) { return e.date; }, function (e) { return e.date; }]);
    return cols;
  }

  // The experience track: ranked by the macro experience gain (success late in each world's stream with memory
  // minus without, same seeds); each task's gain, with its success with / without memory.
  function experienceColumns(group) {
    const gain = function (g, se) { return (g >= 0 ? "+" : "") + V.pct(g) + " ± " + V.pct(se); };
    const cols = columns({ tasks: [] }).slice(0, 2);
    cols.push(["macro experience gain %", function (e) { return e.gain; }, function (e) { return gain(e.gain, e.gain_se); },
      "success over the last part of each world's stream with memory minus without, same seeds", "success"]);
    cols.push(["agent", function (e) { return e.agent; }, function (e) { return e.agent; }]);
    cols.push(["worlds x stream", function (e) { return e.worlds * e.stream; }, function (e) { return e.worlds + " x " + e.stream; }]);
    for (const env of group.tasks) {
      cols.push([V.shortTask(env), function (e) { const t = e.tasks[env]; return t ? t.gain : -Infinity; }, function (e) {
        const t = e.tasks[env];
        return t ? [gain(t.gain, t.gain_se) + " ", V.el("span", { className: "n" }, V.pct(t.memory) + " / " + V.pct(t.no_memory))] : "–";
      }, env + ": gain (success with / without memory)", "task"]);
    }
    cols.push(["verified", function (e) { return e.verified ? 1 : 0; }, function (e) { return e.verified ? "yes" : "no"; }]);
    cols.push(["date", function (e) { return e.date; }, function (e) { return e.date; }]);
    return cols;
  }

  V.pages.leaderboard = function (params, root) {
    const board = V.site().leaderboard;
    V.setCrumbs([{ text: "Leaderboard" }]);
    document.title = "crl-bench leaderboard";
    root.appendChild(V.el("h1", null, "crl-bench leaderboards"));
    if (!board) { root.appendChild(V.el("p", null, "This site has no leaderboard.")); return; }
    root.appendChild(V.el("p", { className: "note" }, board.note || ""));
    const agents = Array.from(new Set([].concat.apply([], board.groups.map(function (g) { return g.entries.map(function (e) { return e.agent; }); })))).sort();
    const state = { agent: params.get("agent") || "", verified: params.get("verified") === "1",
      sort: params.get("sort") || "", dir: params.get("dir") === "asc" ? "asc" : "desc" };
    const agentSel = V.el("select", { id: "filter-agent", "aria-label": "agent kind" }, V.el("option", { value: "" }, "all agents"),
      agents.map(function (a) { return V.el("option", { value: a }, a); }));
    agentSel.value = state.agent;
    const verified = V.el("input", { type: "checkbox", id: "filter-verified" });
    verified.checked = state.verified;
    root.appendChild(V.el("div", { className: "filters" }, V.el("label", null, "Agent kind ", agentSel),
      V.el("label", null, verified, " verified only")));
    const tables = V.el("div");
    root.appendChild(tables);

    function save() {
      V.replaceHash(V.link("leaderboard", { agent: state.agent, verified: state.verified ? "1" : "", sort: state.sort,
        dir: state.sort ? state.dir : "" }));
    }
    function draw() {
      tables.textContent = "";
      for (const g of board.groups) {
        const cols = columns(g);
        let entries = g.entries.filter(function (e) {
          return (!state.agent || e.agent === state.agent) && (!state.verified || e.verified);
        });
        const col = cols.find(function (c) { return c[0] === state.sort; });
        if (col) {
          const sign = state.dir === "asc" ? 1 : -1;
          entries = entries.slice().sort(function (a, b) {
            const x = col[1](a), y = col[1](b);
            return (x < y ? -1 : x > y ? 1 : 0) * sign || a.rank - b.rank;
          });
        }
        const head = V.el("tr", null, cols.map(function (c) {
          const th = V.el("th", { title: c[3] || c[0], className: c[4], "aria-sort": c[0] === state.sort ? (state.dir === "asc" ? "ascending" : "descending") : "none" },
            V.el("button", { type: "button", className: "sort" }, c[0]));
          th.firstChild.addEventListener("click", function () {
            state.dir = state.sort === c[0] && state.dir === "desc" ? "asc" : "desc";
            state.sort = c[0];
            save(); draw();
          });
          return th;
        }));
        const body = V.el("tbody", null, entries.map(function (e) {
          return V.el("tr", { className: "entry", dataset: { agent: e.agent } }, cols.map(function (c) { return V.el("td", { className: c[4] }, c[2](e)); }));
        }));
        tables.appendChild(V.el("section", { className: "board" }, V.el("h2", null, g.name),
          g.note ? V.el("p", { className: "note" }, g.note) : null,
          entries.length ? V.el("table", { className: "grid leaderboard" }, V.el("thead", null, head), body)
            : V.el("p", { className: "note" }, "No entry matches the filters.")));
      }
    }
    agentSel.addEventListener("change", function () { state.agent = agentSel.value; save(); draw(); });
    verified.addEventListener("change", function () { state.verified = verified.checked; save(); draw(); });
    draw();
  };
})();
