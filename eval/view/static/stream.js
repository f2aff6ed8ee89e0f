// crl-bench viewer: an experience-track run (eval.run --stream). Per task, the experience gain and the success
// curve over the stream with and without memory; per world, its episodes in stream order, each with-memory
// episode paired with the without-memory episode of the same seed, with what it read from memory and wrote.
"use strict";
(function () {
  const V = window.CRLVIEW;

  V.isStreamRun = function (run) { return !!(run && run.stream_episodes); };
  // The run's stream entries ({row, task, seed, world, j, memory, read, wrote}) with their index episodes,
  // and a lookup: env#seed#memory -> entry.
  V.streamData = function (run) {
    return Promise.all([V.index(run), V.load(run.id + "/stream", "data/" + run.id + "/stream.js")]).then(function (r) {
      const idx = r[0], entries = r[1];
      if (!entries.byKey) {
        entries.byKey = new Map();
        for (const e of entries) {
          e.ep = idx.episodes[e.row];
          e.env = run.tasks[e.task];
          entries.byKey.set(e.env + "#" + e.seed + "#" + e.memory, e);
        }
      }
      return entries;
    });
  };
  V.streamEntry = function (entries, env, seed, memory) { return entries.byKey.get(env + "#" + seed + "#" + memory) || null; };
  // The Compare link of a stream episode: the run against itself, with memory (A) vs without (B), same seed.
  V.memoryPairLink = function (run, env, seed) { return V.link("compare", { a: run.id, b: run.id, task: env, seed: seed }); };

  function signed(g) { return (g >= 0 ? "+" : "") + (100 * g).toFixed(1); }
  function gainText(g, se) {
    return g === null || g === undefined || Number.isNaN(g) ? "n/a" : signed(g) + " ± " + V.pct(se) + " points";
  }

  // What one episode read or wrote, as a short list (the first few lines, the rest behind a toggle).
  V.memoryList = function (what, items, className) {
    const head = V.el("div", { className: "mem-head" }, what + (items.length ? " (" + items.length + ")" : ""));
    if (!items.length) return V.el("div", { className: "mem " + className }, head, V.el("div", { className: "note" }, "nothing"));
    const SHOW = 4, li = function (x) { return V.el("li", null, V.visible(String(x))); };
    return V.el("div", { className: "mem " + className }, head, V.el("ul", null, items.slice(0, SHOW).map(li)),
      items.length > SHOW ? V.lazyDetails(items.length - SHOW + " more", function () { return V.el("ul", null, items.slice(SHOW).map(li)); }) : null);
  };

  function side(run, e, memory) {
    const tag = V.el("span", { className: "pass-tag" }, memory ? "with memory" : "without memory");
    if (!e || !e.ep) return V.el("div", { className: "stream-side missing" }, tag, " not played (or not recorded)");
    const ep = e.ep;
    return V.el("div", { className: "stream-side " + (memory ? "with" : "without") },
      V.el("div", { className: "stream-side-head" }, tag, " ", V.outcomeBadge(ep.outcome), " ",
        V.el("a", { href: V.link("episode", { run: run.id, task: e.env, seed: e.seed, sample: ep.sample }), className: "ep-link" },
          V.fmt(ep.actions) + " actions")),
      memory ? [V.memoryList("read from memory", e.read, "read"), V.memoryList("wrote to memory", e.wrote, "wrote")] : null);
  }

  function worldSection(run, env, w, wd, entries) {
    const withMem = entries.filter(function (e) { return e.env === env && e.world === w && e.memory; })
      .sort(function (a, b) { return a.j - b.j; });
    const js = Array.from(new Set(entries.filter(function (e) { return e.env === env && e.world === w; }).map(function (e) { return e.j; })))
      .sort(function (a, b) { return a - b; });
    const cards = js.map(function (j) {
      const on = withMem.find(function (e) { return e.j === j; }) || null;
      const seed = on ? on.seed : entries.find(function (e) { return e.env === env && e.world === w && e.j === j; }).seed;
      const off = V.streamEntry(entries, env, seed, false);
      return V.el("li", { className: "stream-ep", id: "stream-ep-" + V.shortTask(env) + "-" + w + "-" + j, dataset: { seed: seed } },
        V.el("div", { className: "stream-ep-head" }, V.el("b", null, "episode " + (j + 1)), " · seed " + seed, V.el("span", { className: "spacer" }),
          on && off ? V.el("a", { className: "button compare-pair", href: V.memoryPairLink(run, env, seed) }, "Compare with / without") : null),
        V.el("div", { className: "stream-pair" }, side(run, on, true), side(run, off, false)));
    });
    return V.el("section", { className: "world", id: "world-" + V.shortTask(env) + "-" + w },
      V.el("h3", null, "World " + w, wd && typeof wd.gain === "number" ? V.el("span", { className: "note" }, " · gain " + signed(wd.gain) + " points") : null),
      V.el("ol", { className: "stream-eps" }, cards));
  }

  function curveChart(env, t, i) {
    function points(curve) {
      const out = [];
      (curve || []).forEach(function (y, j) { if (y !== null && y !== undefined) out.push({ x: j + 1, y: y }); });
      return out;
    }
    const n = (t.curve_memory || []).length;
    const chart = V.lineChart({ title: "Success over the stream (mean over " + t.worlds + (t.worlds === 1 ? " world" : " worlds") + ")",
      id: "stream-curve-" + i, xName: "episode", format: function (y) { return V.pct(y) + "%"; }, yMin: 0, yMax: 1, xMin: 1, xMax: Math.max(2, n),
      series: [{ name: "with memory", key: "memory", points: points(t.curve_memory), markers: true },
        { name: "without memory", key: "no_memory", points: points(t.curve_no_memory), markers: true, dashed: true }] },
    function (x) { chart.setCursor(x); });
    return chart.el;
  }

  V.pages.stream = function (params, root, current) {
    const run = V.run(params.get("run"));
    V.setCrumbs(V.runCrumbs(run, true).concat([{ text: "Stream" }]));
    document.title = "Stream · " + run.label;
    root.appendChild(V.el("h1", null, "Stream: " + run.label));
    const st = run.summary.stream;
    if (!st || !V.isStreamRun(run)) {
      root.appendChild(V.el("p", { className: "note", id: "not-a-stream" }, "This run is not an experience-track run (eval.run --stream), " +
        "or its episodes do not say their world and place in the stream, so there is no stream to show."));
      return null;
    }
    root.appendChild(V.el("p", { className: "note", id: "stream-note" }, "Each world plays " + st.stream + " episodes in order with the agent's memory " +
      "carried from one to the next, then the same seeds again with memory off. The experience gain is success over the last " + st.tail +
      " of the " + st.stream + " episodes with memory minus without, averaged over worlds, ± its standard error over worlds. " +
      "\"Compare with / without\" opens an episode's two plays side by side."));
    const m = st.macro || {};
    root.appendChild(V.el("p", { id: "stream-macro" }, V.el("b", null, "Experience gain (macro): " + gainText(m.experience_gain, m.experience_gain_se))));
    const want = params.get("task");
    return V.streamData(run).then(function (entries) {
      if (!current()) return;
      Object.keys(st.tasks || {}).forEach(function (env, i) {
        if (want && env !== want) return;
        const t = st.tasks[env];
        const sec = V.el("section", { className: "stream-task", id: "stream-task-" + i });
        sec.appendChild(V.el("h2", null, env));
        sec.appendChild(V.el("p", { className: "gain", id: "gain-" + i }, "Experience gain " + gainText(t.experience_gain, t.experience_gain_se) +
          " · success over the last " + st.tail + ": with memory " + V.pct(t.tail_success_memory) + "%, without " + V.pct(t.tail_success_no_memory) +
          "% · " + t.worlds + (t.worlds === 1 ? " world" : " worlds")));
        sec.appendChild(curveChart(env, t, i));
        const worlds = Object.keys(t.per_world || {}).map(Number).sort(function (a, b) { return a - b; });
        for (const w of worlds) sec.appendChild(worldSection(run, env, w, t.per_world[String(w)], entries));
        root.appendChild(sec);
      });
    });
  };
})();
