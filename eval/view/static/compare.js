// crl-bench viewer: two runs side by side. The overview pairs their episodes by task and seed; a pair's page
// draws both episodes as the episode page does (observation, then action; compact or full), one row per
// step so both sides scroll together, with a timeline per side and the first differing action marked.
"use strict";
(function () {
  const V = window.CRLVIEW;
  const TABLE_ROWS = 1000; // rows drawn at first in the all-pairs table

  function pickers(a, b) {
    const runs = V.site().runs;
    function sel(id, value) {
      const s = V.el("select", { id: id, className: "run-pick", "aria-label": id === "run-a" ? "run A" : "run B" }, V.el("option", { value: "" }, "choose a run"),
        runs.map(function (r) { return V.el("option", { value: r.id, title: r.label }, r.label + (r.episodes ? "" : " (summary only)")); }));
      s.value = value || "";
      s.title = s.selectedOptions.length ? s.selectedOptions[0].textContent : "";
      return s;
    }
    const sa = sel("run-a", a), sb = sel("run-b", b);
    function change() { location.hash = V.link("compare", { a: sa.value, b: sb.value }); }
    sa.addEventListener("change", change);
    sb.addEventListener("change", change);
    return V.el("div", { className: "filters" }, V.el("label", null, "A ", sa), V.el("label", null, " B ", sb));
  }

  // An experience-track run against itself: each seed played with memory (sample 0, side A) and without (sample 1, B).
  function memoryPair(ra, rb) { return ra.id === rb.id && V.isStreamRun(ra); }

  // Episodes of A that B has too (same task, seed and sample), in A's order; for a memory pair, each
  // with-memory episode and the without-memory episode of its seed.
  function pairsOf(ia, ib, mem) {
    const pairs = [];
    for (const ea of ia.episodes) {
      if (mem && ea.sample !== 0) continue;
      const eb = V.findEpisode(ib, ea.env, ea.seed, mem ? 1 : ea.sample);
      if (eb) pairs.push({ env: ea.env, seed: ea.seed, sample: ea.sample, a: ea, b: eb });
    }
    return pairs;
  }

  function seedRange(idx) {
    const seeds = idx.episodes.map(function (e) { return e.seed; }).filter(function (s) { return typeof s === "number"; });
    return seeds.length ? Math.min.apply(null, seeds) + "–" + Math.max.apply(null, seeds) : "none";
  }

  // Why two runs have no episode in common, in words.
  function whyNoPairs(ra, rb, ia, ib) {
    const only = [ra, rb].filter(function (r) { return !r.episodes; });
    const read = only.filter(function (r) { return r.episodes_file === "empty" || r.episodes_file === "present"; });
    if (read.length) {
      return read.map(function (r) {
        return r.label + (r.episodes_file === "empty" ? " has an empty episodes.jsonl" : " has no readable episode in its episodes.jsonl") +
          ", so it has no episodes to pair. ";
      }).join("") + "Per-task results are on the run pages.";
    }
    if (only.length === 2) {
      return "Both runs are summaries only (their folders hold summary.json but no episodes.jsonl, as leaderboard submissions may), " +
        "so they have no episodes to pair; their per-task results are on their run pages.";
    }
    if (only.length) {
      return only[0].label + " is a summary only (its folder holds summary.json but no episodes.jsonl, as a leaderboard submission may), " +
        "so it has no episodes to pair; its per-task results are on its run page.";
    }
    const shared = ra.tasks.filter(function (t) { return rb.tasks.includes(t); });
    if (!shared.length) return "The runs share no task: A ran " + ra.tasks.join(", ") + "; B ran " + rb.tasks.join(", ") + ".";
    return "The runs share tasks (" + shared.join(", ") + ") but no seed and sample: A ran seeds " + seedRange(ia) + ", B ran seeds " + seedRange(ib) + ".";
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
      const ia = r[0], ib = r[1], aa = r[2], ab = r[3], mem = memoryPair(ra, rb);
      const pairs = pairsOf(ia, ib, mem);
      if (!pairs.length) {
        root.appendChild(V.el("p", { id: "no-pairs", className: "note" }, "No task/seed pair is in both runs. " + whyNoPairs(ra, rb, ia, ib)));
        return;
      }
      function first(p) {
        const x = aa.lists[p.a.i], y = ab.lists[p.b.i];
        return x && y ? V.firstDivergence(x, y) : null;
      }
      const split = pairs.filter(function (p) { return p.a.success !== p.b.success; });
      const noSteps = [ra, rb].filter(function (x) { return !x.trajectories; }).map(function (x) { return x.label; });
      root.appendChild(V.el("p", { className: "note" }, pairs.length + " task/seed pairs in both runs; " + split.length +
        " where one succeeded and the other did not." + (noSteps.length ? " " + noSteps.join(" and ") +
          " recorded no trajectories, so steps and the first differing action are unknown." : "")));
      const head = V.el("thead", null, V.el("tr", null, ["task", "seed", "sample", ["A: ", V.el("span", { className: "clip", title: ra.label }, mem ? "with memory" : ra.label)],
        ["B: ", V.el("span", { className: "clip", title: rb.label }, mem ? "without memory" : rb.label)], "first differing action"]
        .map(function (h) { return V.el("th", null, h); })));
      root.appendChild(V.el("h2", null, "One succeeded, the other did not (" + split.length + ")"));
      root.appendChild(split.length ? V.scrollTable(V.el("table", { className: "grid", id: "split-table" }, head, V.el("tbody", null,
        split.map(function (p) { return pairRow(ra, rb, p, first(p)); })))) : V.el("p", { className: "note" }, "None."));
      root.appendChild(V.el("h2", null, "All pairs (" + pairs.length + ")"));
      const body = V.el("tbody");
      const table = V.el("table", { className: "grid", id: "pairs-table" }, head.cloneNode(true), body);
      function draw(n) {
        body.textContent = "";
        for (const p of pairs.slice(0, n)) body.appendChild(pairRow(ra, rb, p, first(p)));
      }
      draw(TABLE_ROWS);
      root.appendChild(V.scrollTable(table));
      if (pairs.length > TABLE_ROWS) {
        const more = V.el("button", { type: "button" }, "show all " + pairs.length + " pairs");
        more.addEventListener("click", function () { draw(pairs.length); more.remove(); });
        root.appendChild(more);
      }
    });
  }

  // One side of one step row: the step as the episode page draws it, or why there is none.
  // letter: "A" or "B", shown before each side where the sides stack (narrow screens).
  function side(letter, ep, data, steps, t, q, mode, diverge) {
    const tag = V.el("span", { className: "side-tag" }, letter);
    if (!ep) return V.el("div", { className: "side missing" }, t === 0 ? [tag, "no such episode in this run"] : "");
    if (!data) return V.el("div", { className: "side missing" }, t === 0 ? [tag, "no trajectory recorded"] : "");
    if (t === steps.length) {
      return V.el("div", { className: "side final" }, V.el("div", { className: "step-head" }, tag, "episode over: final observation"),
        V.observation(data.final, q, mode === "compact" && t > 0 ? steps[t - 1].observation : null, t - 1));
    }
    const s = steps[t];
    if (!s) return V.el("div", { className: "side missing empty" });
    return V.el("div", { className: "side" + (diverge ? " diverge" : "") },
      V.el("div", { className: "step-head" }, tag, V.stepFlags(s), V.el("span", { className: "spacer" }), V.afterAction(s)),
      V.stepBody(s, t, data.adm, q, mode === "compact" && t > 0 ? steps[t - 1] : null));
  }

  function sideLabel(letter, run, ep, env, seed, sample, pass) {
    return V.el("div", { className: "side-label" }, V.el("b", null, letter + " "),
      V.el("a", { href: ep ? V.link("episode", { run: run.id, task: env, seed: seed, sample: sample }) : "#/", title: run.label }, pass || run.label),
      " ", ep ? V.outcomeBadge(ep.outcome) : null);
  }

  // A memory pair's note: the stream place of the episode, and what the with-memory play read and wrote.
  function memoryNote(run, env, seed) {
    const box = V.el("div", { id: "pair-memory", className: "pair-memory" });
    V.streamData(run).then(function (entries) {
      const on = V.streamEntry(entries, env, seed, true);
      if (!on) return;
      V.append(box, [V.el("p", { className: "note" }, "World " + on.world + ", episode " + (on.j + 1) + " of its ",
        V.el("a", { href: V.link("stream", { run: run.id, task: env }) }, "stream"), ". A played it with the memory the " +
        "world's earlier episodes left; B played the same seed with memory off."),
      V.el("div", { className: "stream-pair" }, V.memoryList("A read from memory", on.read, "read"), V.memoryList("A wrote to memory", on.wrote, "wrote"))]);
    });
    return box;
  }

  function sideBySide(root, ra, rb, params, current) {
    const env = params.get("task"), seed = params.get("seed"), sample = params.get("sample") || "0";
    const mem = memoryPair(ra, rb), sampleB = mem ? "1" : sample;
    return Promise.all([V.index(ra), V.index(rb)]).then(function (r) {
      const ea = V.findEpisode(r[0], env, seed, sample), eb = V.findEpisode(r[1], env, seed, sampleB);
      if (!ea && !eb) throw new Error("Neither run has " + env + " seed " + seed + " sample " + sample + ".");
      return Promise.all([ea ? V.episodeData(ra, ea) : null, eb ? V.episodeData(rb, eb) : null]).then(function (d) {
        if (!current()) return;
        const sa = d[0] ? d[0].steps.map(V.step) : [], sb = d[1] ? d[1].steps.map(V.step) : [];
        const div = d[0] && d[1] ? V.firstDivergence(sa.map(function (s) { return s.action; }), sb.map(function (s) { return s.action; })) : null;
        const pairs = pairsOf(r[0], r[1], mem);
        const at = pairs.findIndex(function (p) { return p.env === env && String(p.seed) === String(seed) && String(p.sample) === String(sample); });
        function go(dir) {
          const p = pairs[at + dir];
          if (at >= 0 && p) location.hash = V.link("compare", { a: ra.id, b: rb.id, task: p.env, seed: p.seed, sample: p.sample, view: params.get("view") });
        }
        root.appendChild(V.el("h2", null, env + " · seed " + seed + (Number(sample) ? " · sample " + sample : "") + (mem ? " · with vs without memory" : "")));
        if (mem) root.appendChild(memoryNote(ra, env, seed));
        root.appendChild(V.el("p", { id: "divergence", className: "note" }, div === null ? "One side has no trajectory." : div < 0
          ? "Both runs took the same actions." : ["The actions first differ at step " + div + ". ",
            V.el("button", { type: "button", id: "goto-diff", onclick: function () { select(div, true); } }, "show it (d)")]));
        root.appendChild(V.el("p", { className: "nav" },
          V.el("button", { type: "button", id: "prev-pair", disabled: at <= 0, onclick: function () { go(-1); } }, "◀ previous pair (K)"),
          V.el("span", { className: "note" }, at < 0 ? "" : " " + (at + 1) + " of " + pairs.length + " "),
          V.el("button", { type: "button", id: "next-pair", disabled: at < 0 || at >= pairs.length - 1, onclick: function () { go(1); } }, "next pair (J) ▶"),
          V.el("span", { className: "note" }, "  j/k: steps · d: first difference · c: compact/full · ?: keys")));

        const n = Math.max(sa.length + (d[0] ? 1 : 0), sb.length + (d[1] ? 1 : 0), 1);
        const auto = Math.max(sa.length, sb.length) >= V.COMPACT_FROM ? "compact" : "full";
        let mode = params.get("view") === "full" || params.get("view") === "compact" ? params.get("view") : auto;
        let cur = -1;
        const lines = [];
        function pick(t) { select(t, true); }
        const tls = [[sa, "A", ra, ea], [sb, "B", rb, eb]].map(function (x) {
          const tl = x[0].length ? V.timeline(x[0], pick, "steps of run " + x[1], Math.max(sa.length, sb.length)) : null;
          if (tl && div !== null && div >= 0 && tl.marks[div]) tl.marks[div].classList.add("diverge");
          lines.push(sideLabel(x[1], x[2], x[3], env, seed, x[1] === "B" ? sampleB : sample, mem ? (x[1] === "A" ? "with memory" : "without memory") : null),
            tl ? tl.el : V.el("div", { className: "note" }, "no steps"));
          return tl;
        });
        const modeBtn = V.modeButton(function () { return mode; }, function () { mode = mode === "compact" ? "full" : "compact"; draw(); });
        const bar = V.el("div", { className: "stepbar compare-bar" }, V.el("div", { className: "tl-rows" }, lines), V.el("div", { className: "tools" },
          V.el("button", { type: "button", id: "step-prev", title: "previous step (k)", onclick: function () { select(cur < 0 ? 0 : cur - 1, true); } }, "◀ step"),
          V.el("button", { type: "button", id: "step-next", title: "next step (j)", onclick: function () { select(cur + 1, true); } }, "step ▶"),
          modeBtn.el));
        const rows = V.el("div", { className: "cmp-rows" });
        root.appendChild(bar);
        root.appendChild(rows);

        function link() {
          return V.link("compare", { a: ra.id, b: rb.id, task: env, seed: seed, sample: sample, step: cur < 0 ? null : cur, view: mode === auto ? null : mode });
        }
        function draw() {
          rows.textContent = "";
          const frag = document.createDocumentFragment();
          for (let t = 0; t < n; t++) {
            const first = t === div;
            frag.appendChild(V.el("div", { className: "cmp-row aligned" + (first ? " first-diff" : ""), id: "cmp-step-" + t, dataset: { t: t } },
              V.el("div", { className: "cmp-t" }, V.el("a", { className: "t", href: "#" }, String(t)), first ? V.el("div", { className: "badge diverge" }, "first difference") : null),
              side("A", ea, d[0], sa, t, "", mode, first), side("B", eb, d[1], sb, t, "", mode, first)));
          }
          rows.appendChild(frag);
          if (cur >= 0) { const t = cur; cur = -1; select(t, false); }
          V.stickyOffset(bar);
        }
        function select(t, scroll) {
          t = Math.max(0, Math.min(n - 1, t));
          const old = rows.querySelector(".cmp-row.current");
          if (old) old.classList.remove("current");
          const row = document.getElementById("cmp-step-" + t);
          row.classList.add("current");
          cur = t;
          for (const tl of tls) if (tl) tl.setCurrent(t);
          if (scroll) { V.stickyOffset(bar); row.scrollIntoView({ block: "start" }); }
          V.replaceHash(link());
        }
        rows.addEventListener("click", function (e) {
          const a = e.target.closest && e.target.closest("a.t");
          if (!a) return;
          e.preventDefault();
          select(Number(a.closest(".cmp-row").dataset.t), false);
        });
        draw();
        const want = params.get("step");
        if (want !== null && want !== "" && !Number.isNaN(Number(want))) select(Number(want), true);
        // A pair opens at the top (heading, run pickers, the note on the first difference), that step marked
        // current and in the address; d (or the note's button) scrolls to it.
        else if (div !== null && div >= 0) select(div, false);
        V.onKey = function (e) {
          if (e.key === "j") { select(cur + 1, true); return true; }
          if (e.key === "k") { select(cur < 0 ? 0 : cur - 1, true); return true; }
          if (e.key === "J") { go(1); return true; }
          if (e.key === "K") { go(-1); return true; }
          if (e.key === "c") { modeBtn.el.click(); return true; }
          if (e.key === "d" && div !== null && div >= 0) { select(div, true); return true; }
          return false;
        };
      });
    });
  }

  V.pages.compare = function (params, root, current) {
    const runs = V.site().runs;
    // a site of one experience-track run compares it with itself: with memory against without
    const a = params.get("a") || (runs[0] && runs[0].id);
    const b = params.get("b") || (runs[1] && runs[1].id) || (runs.length === 1 && V.isStreamRun(runs[0]) ? a : undefined);
    V.setCrumbs([{ text: "Compare", href: V.link("compare", { a: a, b: b }) }].concat(params.get("task") ? [{ text: V.shortTask(params.get("task")) + " #" + params.get("seed") }] : []));
    document.title = "Compare · crl-bench";
    const mem = a && b && memoryPair(V.run(a), V.run(b));
    root.appendChild(V.el("h1", null, mem ? "Compare with and without memory" : "Compare two runs"));
    root.appendChild(pickers(a, b));
    if (mem) root.appendChild(V.el("p", { className: "note", id: "memory-pair-note" }, "A and B are the same experience-track run: " +
      "A is each episode played with memory, B the same seed played without."));
    if (runs.length < 2 && !mem) { root.appendChild(V.el("p", { className: "note" }, "This site holds one run; build it with two or more to compare.")); return null; }
    if (!a || !b) return null;
    const ra = V.run(a), rb = V.run(b);
    return params.get("task") ? sideBySide(root, ra, rb, params, current) : overview(root, ra, rb, params, current);
  };
})();
