// crl-bench viewer: the episode list (filters, sort, full-text search over every step; virtualised rows).
"use strict";
(function () {
  const V = window.CRLVIEW;
  const ROW = 28; // px; fixed so only the visible rows need to exist
  // Sort keys; ties keep the list's own order (task, seed, sample) in either direction.
  const SORTS = {
    "": function (e) { return e.i; },
    actions: function (e) { return e.actions || 0; },
    progress: function (e) { return e.progress || 0; },
    reward: function (e) { return e.reward || 0; },
    tokens: function (e) { return e.tokens_out || 0; },
  };

  V.filterEpisodes = function (episodes, f, texts) {
    const q = (f.q || "").trim().toLowerCase();
    const min = f.min === "" || f.min === null || f.min === undefined ? -Infinity : Number(f.min);
    const max = f.max === "" || f.max === null || f.max === undefined ? Infinity : Number(f.max);
    let out = episodes.filter(function (e) {
      return (!f.task || e.env === f.task) && (!f.outcome || e.outcome === f.outcome) &&
        (e.actions || 0) >= min && (e.actions || 0) <= max && (!q || (texts && texts[e.i].includes(q)));
    });
    const key = SORTS[f.sort] || SORTS[""], sign = f.dir === "desc" ? -1 : 1;
    return out.sort(function (a, b) { return sign * (key(a) - key(b)) || (f.sort ? a.i - b.i : 0); });
  };

  // The episode list's columns, in order: the episode's name, then what matters most (outcome, reward); a
  // column whose value is the same on every episode of the run (sample 0, no tokens) is left out.
  V.episodeColumns = function (episodes, run) {
    const all = [
      { name: "task", min: 7, fr: 2.4, cell: function (e) { return V.el("span", { title: e.env }, V.shortTask(e.env)); }, keep: true },
      { name: "seed", min: 3, fr: 0.8, cell: function (e) { return V.el("span", null, e.seed); }, keep: true },
      { name: "sample", min: 4.6, fr: 0.6, value: function (e) { return e.sample; } },
      { name: "outcome", min: 6, fr: 1, keep: true, cell: function (e) {
        return V.el("span", null, V.outcomeBadge(e.outcome), e.has_steps || run.trajectories_file === "missing" ? null
          : V.el("span", { className: "badge no-steps", title: "this episode's steps are not in the run's trajectories file" }, "no steps"));
      } },
      { name: "reward", min: 4.2, fr: 0.8, value: function (e) { return e.reward; } },
      { name: "progress", min: 5, fr: 0.8, value: function (e) { return e.progress; } },
      { name: "actions", min: 4.4, fr: 0.8, value: function (e) { return e.actions; } },
      { name: "invalid", min: 4, fr: 0.7, value: function (e) { return e.invalid; } },
      { name: "tokens out", min: 6, fr: 0.9, value: function (e) { return e.tokens_out; }, digits: 0 },
    ];
    const lost = episodes.some(function (e) { return !e.has_steps; }) && run.trajectories_file !== "missing";
    return all.filter(function (c) {
      return c.keep || new Set(episodes.map(c.value)).size > 1;
    }).map(function (c) {
      if (c.name === "outcome" && lost) c.min = 10.5;
      if (!c.cell) c.cell = function (e) { return V.el("span", null, V.fmt(c.value(e), c.digits)); };
      return c;
    });
  };

  V.pages.episodes = function (params, root, current) {
    const run = V.run(params.get("run"));
    V.setCrumbs(V.runCrumbs(run, true).concat([{ text: "Episodes" }]));
    document.title = "Episodes · " + run.label;
    if (!run.episodes) {
      root.appendChild(V.el("h1", null, "Episodes of " + run.label));
      root.appendChild(V.el("p", { className: "note", id: "summary-only" }, V.noEpisodes(run)));
      return null;
    }
    const f = { task: params.get("task") || "", outcome: params.get("outcome") || "", min: params.get("min") || "",
      max: params.get("max") || "", q: params.get("q") || "", sort: params.get("sort") || "", dir: params.get("dir") || "" };
    const taskSel = V.el("select", { id: "f-task", "aria-label": "task" }, V.el("option", { value: "" }, "all tasks"),
      run.tasks.map(function (t) { return V.el("option", { value: t }, t); }));
    const outcomeSel = V.el("select", { id: "f-outcome", "aria-label": "outcome" }, [["", "any outcome"], ["success", "success"],
      ["failure", "failure"], ["errored", "errored"]].map(function (o) { return V.el("option", { value: o[0] }, o[1]); }));
    const minIn = V.el("input", { id: "f-min", type: "number", min: 0, placeholder: "min", "aria-label": "fewest actions" });
    const maxIn = V.el("input", { id: "f-max", type: "number", min: 0, placeholder: "max", "aria-label": "most actions" });
    const sortSel = V.el("select", { id: "f-sort", "aria-label": "sort" }, [["", "task, seed"], ["actions", "actions"],
      ["progress", "progress"], ["reward", "reward"], ["tokens", "tokens out"]].map(function (o) { return V.el("option", { value: o[0] }, o[1]); }));
    const dirSel = V.el("select", { id: "f-dir", "aria-label": "order" }, V.el("option", { value: "" }, "ascending"), V.el("option", { value: "desc" }, "descending"));
    const search = V.el("input", { id: "f-search", type: "search", placeholder: "search every step (press /)", "aria-label": "search" });
    taskSel.value = f.task; outcomeSel.value = f.outcome; minIn.value = f.min; maxIn.value = f.max; sortSel.value = f.sort;
    dirSel.value = f.dir; search.value = f.q;
    root.appendChild(V.el("h1", null, "Episodes of " + run.label));
    root.appendChild(V.el("div", { className: "filters" }, taskSel, outcomeSel, V.el("label", null, "actions ", minIn, "–", maxIn),
      V.el("label", null, "sort ", sortSel, dirSel), search));
    const count = V.el("p", { id: "count", className: "note", "aria-live": "polite" }, "Loading…");
    root.appendChild(count);
    // The head lives inside the list (sticky at its top) so head and rows share one width and scroll sideways
    // together on a narrow screen; the list is as tall as its rows, up to what the window leaves. Its columns are
    // set once the index is in (columnsFor): the outcome and reward first after the episode's name, so a phone shows
    // them, and no column whose value is the same on every episode.
    const head = V.el("div", { className: "vhead" });
    const spacer = V.el("div", { className: "vspacer" });
    const list = V.el("div", { id: "episode-list", className: "vlist", tabindex: "0" }, head, spacer);
    root.appendChild(list);
    let cols = [];

    let idx = null, shown = [], texts = null, cursor = 0, drawn = Object.create(null);

    function href(e) {
      return V.link("episode", { run: run.id, task: e.env, seed: e.seed, sample: e.sample, q: f.q.trim() });
    }
    function rowEl(e, pos) {
      const a = V.el("a", { className: "vrow " + e.outcome + (e.has_steps ? "" : " no-steps") + (pos === cursor ? " cursor" : ""), href: href(e), dataset: { pos: pos } },
        cols.map(function (c) { return c.cell(e); }));
      a.style.gridTemplateColumns = head.style.gridTemplateColumns;
      a.style.minWidth = head.style.minWidth;
      if (e.error) a.title = e.error;
      a.style.transform = "translateY(" + pos * ROW + "px)";
      return a;
    }
    // Draw only the rows in view (plus a margin); reuse the ones already there.
    function paint() {
      const first = Math.max(0, Math.floor(list.scrollTop / ROW) - 10);
      const last = Math.min(shown.length, Math.ceil((list.scrollTop + list.clientHeight) / ROW) + 10);
      const keep = Object.create(null);
      for (let p = first; p < last; p++) {
        keep[p] = drawn[p] || list.appendChild(rowEl(shown[p], p));
      }
      for (const p of Object.keys(drawn)) if (!keep[p]) drawn[p].remove();
      drawn = keep;
    }
    function redraw() {
      for (const p of Object.keys(drawn)) drawn[p].remove();
      drawn = Object.create(null);
      spacer.style.height = shown.length * ROW + "px";
      list.style.height = (Math.max(shown.length, 1) + 1) * ROW + 2 + "px"; // rows, head and borders; CSS caps it
      paint();
    }
    let ticking = false;
    list.addEventListener("scroll", function () {
      if (!ticking) { ticking = true; requestAnimationFrame(function () { ticking = false; paint(); }); }
    });

    function apply() {
      V.replaceHash(V.link("episodes", Object.assign({ run: run.id }, f)));
      const needText = f.q.trim() !== "";
      if (needText && !texts) {
        count.textContent = "Loading the search index…";
        return V.searchTexts(run).then(function (t) { texts = t; if (current()) apply(); },
          function (e) { count.textContent = "Search is unavailable: " + e.message; });
      }
      shown = V.filterEpisodes(idx.episodes, f, texts);
      V.lastList = { run: run.id, order: shown.map(function (e) { return e.i; }), q: f.q.trim() };
      cursor = Math.min(cursor, Math.max(0, shown.length - 1));
      const lost = shown.filter(function (e) { return !e.has_steps; }).length;
      count.textContent = shown.length + " of " + idx.episodes.length + " episodes" + (f.q.trim() ? " containing " + JSON.stringify(f.q.trim()) : "") +
        (lost && run.trajectories_file !== "missing" ? " · " + lost + " without their steps (marked “no steps”: " +
          (run.trajectories_file === "cut" ? "the trajectories file was cut off" : "no trajectory recorded") + ")" : "");
      list.scrollTop = 0;
      redraw();
      return null;
    }
    let timer = 0;
    function onInput(key, el, delay) {
      el.addEventListener(delay ? "input" : "change", function () {
        f[key] = el.value;
        clearTimeout(timer);
        timer = setTimeout(apply, delay || 0);
      });
    }
    onInput("task", taskSel); onInput("outcome", outcomeSel); onInput("sort", sortSel); onInput("dir", dirSel);
    onInput("min", minIn, 200); onInput("max", maxIn, 200); onInput("q", search, 250);
    search.addEventListener("keydown", function (e) { if (e.key === "Enter") { clearTimeout(timer); f.q = search.value; apply(); } });

    function moveCursor(d) {
      if (!shown.length) return;
      cursor = Math.max(0, Math.min(shown.length - 1, cursor + d));
      // row p lies at (p + 1) * ROW, below the sticky head
      if (cursor * ROW < list.scrollTop) list.scrollTop = cursor * ROW;
      else if ((cursor + 2) * ROW > list.scrollTop + list.clientHeight) list.scrollTop = (cursor + 2) * ROW - list.clientHeight;
      for (const p of Object.keys(drawn)) drawn[p].classList.toggle("cursor", Number(p) === cursor);
      paint();
    }
    V.onKey = function (e) {
      if (e.key === "/") { search.focus(); search.select(); return true; }
      if (e.key === "j") { moveCursor(1); return true; }
      if (e.key === "k") { moveCursor(-1); return true; }
      if (e.key === "Enter" && shown[cursor]) { location.hash = href(shown[cursor]); return true; }
      return false;
    };
    return V.index(run).then(function (i) {
      if (!current()) return null;
      idx = i;
      cols = V.episodeColumns(idx.episodes, run);
      V.append(head, cols.map(function (c) { return V.el("span", { title: c.title }, c.name); }));
      head.style.gridTemplateColumns = cols.map(function (c) { return "minmax(" + c.min + "em, " + c.fr + "fr)"; }).join(" ");
      head.style.minWidth = "calc(" + cols.reduce(function (n, c) { return n + c.min; }, 0) + "em + " + (8 * cols.length + 8) + "px)";
      const r = apply();
      if (params.get("focus")) search.focus();
      return r;
    });
  };
})();
