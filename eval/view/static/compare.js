// crl-bench viewer: two runs side by side, per task and seed, steps aligned, first differing action marked.
"use strict";
(function () {
  const V = window.CRLVIEW;
  const TABLE_ROWS = 1000; // rows drawn at first in the all-pairs table

  function pickers(a, b) {
    const runs = V.site().runs;
    function sel(id, value) {
      const s = V.el("select", { id: id, "aria-label": id === "run-a" ? "run A" : "run B" }, V.el("option", { value: "" }, "choose a run"),
        runs.map(function (r) { return V.el("option", { value: r.id }, r.label); }));
      s.value = value || "";
      return s;
    }
    const sa = sel("run-a", a), sb = sel("run-b", b);
    function change() { location.hash = V.link("compare", { a: sa.value, b: sb.value }); }
    sa.addEventListener("change", change);
    sb.addEventListener("change", change);
    return V.el("div", { className: "filters" }, V.el("label", null, "A ", sa), V.el("label", null, " B ", sb));
  }

  function outcomeCell(e) { return e ? V.el("td", null, V.outcomeBadge(e.outcome), " " + V.fmt(e.actions) + " actions") : V.el("td", null, "–"); }

  function pairRow(ra, rb, p, first) {
    return V.el("tr", { className: "pair" },
      V.el("td", null, V.el("a", { href: V.link("compare", { a: ra.id, b: rb.id, task: p.env, seed: p.seed, sample: p.sample }) }, V.shortTask(p.env))),
      V.el("td", { className: "num" }, p.seed), V.el("td", { className: "num" }, p.sample), outcomeCell(p.a), outcomeCell(p.b),
      V.el("td", { className: "num" }, first === null ? "–" : first < 0 ? "same actions" : "step " + first));
  }

  function overview(root, ra, rb, params, current) {
    return Promise.all([V.index(ra), V.index(rb), V.actions(ra), V.actions(rb)]).then(function (r) {
      if (!current()) return;
      const ia = r[0], ib = r[1], aa = r[2], ab = r[3];
      const pairs = [];
      for (const ea of ia.episodes) {
        const eb = V.findEpisode(ib, ea.env, ea.seed, ea.sample);
        if (eb) pairs.push({ env: ea.env, seed: ea.seed, sample: ea.sample, a: ea, b: eb });
      }
      function first(p) {
        const x = aa.lists[p.a.i], y = ab.lists[p.b.i];
        return x && y ? V.firstDivergence(x, y) : null;
      }
      const split = pairs.filter(function (p) { return p.a.success !== p.b.success; });
      root.appendChild(V.el("p", { className: "note" }, pairs.length + " task/seed pairs in both runs; " + split.length +
        " where one succeeded and the other did not."));
      const head = V.el("thead", null, V.el("tr", null, ["task", "seed", "sample", "A: " + ra.label, "B: " + rb.label, "first differing action"]
        .map(function (h) { return V.el("th", null, h); })));
      root.appendChild(V.el("h2", null, "One succeeded, the other did not (" + split.length + ")"));
      root.appendChild(split.length ? V.el("table", { className: "grid", id: "split-table" }, head, V.el("tbody", null,
        split.map(function (p) { return pairRow(ra, rb, p, first(p)); }))) : V.el("p", { className: "note" }, "None."));
      root.appendChild(V.el("h2", null, "All pairs (" + pairs.length + ")"));
      const body = V.el("tbody");
      const table = V.el("table", { className: "grid", id: "pairs-table" }, head.cloneNode(true), body);
      function draw(n) {
        body.textContent = "";
        for (const p of pairs.slice(0, n)) body.appendChild(pairRow(ra, rb, p, first(p)));
      }
      draw(TABLE_ROWS);
      root.appendChild(table);
      if (pairs.length > TABLE_ROWS) {
        const more = V.el("button", { type: "button" }, "show all " + pairs.length + " pairs");
        more.addEventListener("click", function () { draw(pairs.length); more.remove(); });
        root.appendChild(more);
      }
    });
  }

  function side(run, ep, data, s, t, diverge) {
    if (!ep) return V.el("td", { className: "side missing" }, "no such episode in this run");
    if (!data) return V.el("td", { className: "side missing" }, t === 0 ? "no trajectory recorded" : "");
    if (!s) return V.el("td", { className: "side missing" }, t === data.steps.length ? "(episode over)" : "");
    return V.el("td", { className: "side" + (diverge ? " diverge" : "") },
      V.el("div", { className: "step-head" }, V.el("code", { className: "action" }, s.action), s.valid ? "" : V.el("span", { className: "badge invalid" }, "invalid"),
        V.el("span", { className: "spacer" }), V.el("span", { className: "kv" }, "r " + V.fmt(s.reward) + " · p " + V.fmt(s.progress))),
      V.pre(s.observation, "text observation"));
  }

  function sideBySide(root, ra, rb, params, current) {
    const env = params.get("task"), seed = params.get("seed"), sample = params.get("sample") || "0";
    return Promise.all([V.index(ra), V.index(rb)]).then(function (r) {
      const ea = V.findEpisode(r[0], env, seed, sample), eb = V.findEpisode(r[1], env, seed, sample);
      if (!ea && !eb) throw new Error("Neither run has " + env + " seed " + seed + " sample " + sample + ".");
      return Promise.all([ea ? V.episodeData(ra, ea) : null, eb ? V.episodeData(rb, eb) : null]).then(function (d) {
        if (!current()) return;
        const sa = d[0] ? d[0].steps.map(V.step) : [], sb = d[1] ? d[1].steps.map(V.step) : [];
        const div = d[0] && d[1] ? V.firstDivergence(sa.map(function (s) { return s.action; }), sb.map(function (s) { return s.action; })) : null;
        root.appendChild(V.el("h2", null, env + " · seed " + seed + (Number(sample) ? " · sample " + sample : "")));
        root.appendChild(V.el("p", { id: "divergence", className: "note" }, div === null ? "One side has no trajectory." : div < 0
          ? "Both runs took the same actions." : "The actions first differ at step " + div + "."));
        const head = V.el("tr", null, V.el("th", null, "step"),
          V.el("th", null, V.el("a", { href: ea ? V.link("episode", { run: ra.id, task: env, seed: seed, sample: sample }) : "#/" }, "A: " + ra.label), " ", ea ? V.outcomeBadge(ea.outcome) : null),
          V.el("th", null, V.el("a", { href: eb ? V.link("episode", { run: rb.id, task: env, seed: seed, sample: sample }) : "#/" }, "B: " + rb.label), " ", eb ? V.outcomeBadge(eb.outcome) : null));
        const body = V.el("tbody");
        const n = Math.max(sa.length, sb.length, 1);
        for (let t = 0; t < n; t++) {
          const first = t === div;
          body.appendChild(V.el("tr", { className: "aligned" + (first ? " first-diff" : ""), id: "cmp-step-" + t },
            V.el("td", { className: "num" }, t, first ? V.el("div", { className: "badge diverge" }, "first difference") : null),
            side(ra, ea, d[0], sa[t], t, first), side(rb, eb, d[1], sb[t], t, first)));
        }
        root.appendChild(V.el("table", { className: "grid side-by-side" }, V.el("thead", null, head), body));
        if (div !== null && div >= 0) {
          const row = document.getElementById("cmp-step-" + div);
          if (row) row.scrollIntoView({ block: "center" });
        }
      });
    });
  }

  V.pages.compare = function (params, root, current) {
    const runs = V.site().runs;
    const a = params.get("a") || (runs[0] && runs[0].id), b = params.get("b") || (runs[1] && runs[1].id);
    V.setCrumbs([{ text: "Compare", href: V.link("compare", { a: a, b: b }) }].concat(params.get("task") ? [{ text: V.shortTask(params.get("task")) + " #" + params.get("seed") }] : []));
    document.title = "Compare · crl-bench";
    root.appendChild(V.el("h1", null, "Compare two runs"));
    root.appendChild(pickers(a, b));
    if (runs.length < 2) { root.appendChild(V.el("p", { className: "note" }, "This site holds one run; build it with two or more to compare.")); return null; }
    if (!a || !b) return null;
    const ra = V.run(a), rb = V.run(b);
    return params.get("task") ? sideBySide(root, ra, rb, params, current) : overview(root, ra, rb, params, current);
  };
})();
