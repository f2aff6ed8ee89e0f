// crl-bench viewer: one episode, step by step (observation, action, reward, validity, progress and, for LLM
// agents, the reply, the messages as sent, scored candidates, experience shown and searches), under a sticky
// bar with the episode's timeline, the compact/full toggle and a find box whose matches n/N step through.
"use strict";
(function () {
  const V = window.CRLVIEW;

  V.renderEpisodeHeader = function (run, ep, data) {
    return V.el("div", { className: "ep-head" },
      V.el("h1", null, ep.env + " · seed " + ep.seed + (ep.sample ? " · sample " + ep.sample : "")),
      V.el("p", { className: "meta" }, V.outcomeBadge(ep.outcome), " progress " + V.fmt(ep.progress) + " · reward " + V.fmt(ep.reward) +
        " · " + V.fmt(ep.actions) + " actions (" + V.fmt(ep.invalid) + " invalid) · tokens " + V.fmt(ep.tokens_in, 0) + " / " +
        V.fmt(ep.tokens_out, 0) + " · " + V.fmt(ep.wall_time_s) + " s" + (data && data.agent ? " · agent " + data.agent : "")),
      data && data.task ? V.el("p", { className: "task" }, "Task: ", V.el("span", null, data.task)) : null,
      ep.error ? V.el("p", { className: "error" }, "Error: ", V.el("code", null, ep.error)) : null);
  };

  // Why an episode has no steps to show: none recorded, or lost where the trajectories file was cut off.
  V.noTrajectory = function (run) {
    if (run.trajectories_file === "cut") {
      return "This episode's steps are lost: the run's trajectories.jsonl.gz was cut off (a killed run, or a copy cut short) " +
        "before its record. They cannot be restored from the run's files: `python -m eval.run ... --resume` drops the torn end " +
        "and plays no episode that episodes.jsonl already records. To see them, play the run again into a new folder with the " +
        "same options (the same seeds give the same episodes). Its summary is all there is here.";
    }
    if (run.trajectories_file === "present") {
      return "The run's trajectories.jsonl.gz holds no record of this episode (it was recorded in episodes.jsonl only), so its summary is all there is.";
    }
    return "No trajectory was recorded for this episode (an older run, or written with --trajectories none): its summary is all there is.";
  };

  V.pages.episode = function (params, root, current) {
    const run = V.run(params.get("run"));
    const env = params.get("task") || "", seed = params.get("seed"), sample = params.get("sample") || "0";
    let q = (params.get("q") || "").trim();
    V.setCrumbs(V.runCrumbs(run, true).concat([{ text: "Episodes", href: V.link("episodes", { run: run.id, q: q }) },
      { text: V.shortTask(env) + " #" + seed }]));
    return V.index(run).then(function (idx) {
      const ep = V.findEpisode(idx, env, seed, sample);
      if (!ep) throw new Error("Run " + run.label + " has no episode " + env + " seed " + seed + " sample " + sample + ".");
      return V.episodeData(run, ep).then(function (data) {
        if (!current()) return;
        document.title = V.shortTask(env) + " #" + seed + " · " + run.label;
        const order = V.lastList && V.lastList.run === run.id ? V.lastList.order : idx.episodes.map(function (e) { return e.i; });
        const at = order.indexOf(ep.i);
        function go(d) {
          const j = at < 0 ? -1 : at + d;
          if (j < 0 || j >= order.length) return;
          const n = idx.episodes[order[j]];
          location.hash = V.link("episode", { run: run.id, task: n.env, seed: n.seed, sample: n.sample, q: q });
        }
        root.appendChild(V.renderEpisodeHeader(run, ep, data));
        root.appendChild(V.el("p", { className: "nav" },
          V.el("button", { type: "button", id: "prev-ep", disabled: at <= 0, onclick: function () { go(-1); } }, "◀ previous episode (K)"),
          V.el("span", { className: "note" }, at < 0 ? "" : " " + (at + 1) + " of " + order.length + " "),
          V.el("button", { type: "button", id: "next-ep", disabled: at < 0 || at >= order.length - 1, onclick: function () { go(1); } }, "next episode (J) ▶"),
          V.el("span", { className: "note" }, "  j/k: steps · n/N: matches · ?: keys")));
        if (!data) {
          root.appendChild(V.el("p", { className: "note", id: "no-trajectory" }, V.noTrajectory(run)));
          V.onKey = function (e) {
            if (e.key === "J") { go(1); return true; }
            if (e.key === "K") { go(-1); return true; }
            if (e.key === "/") { location.hash = V.link("episodes", { run: run.id, focus: 1 }); return true; }
            return false;
          };
          return;
        }
        showSteps(root, data, run, env, seed, sample, params, q, go);
      });
    });
  };

  // The timeline, the tools (compact/full, find) and the steps of an episode with a trajectory.
  function showSteps(root, data, run, env, seed, sample, params, q, go) {
    const steps = data.steps.map(V.step);
    const auto = steps.length >= V.COMPACT_FROM ? "compact" : "full";
    let mode = params.get("view") === "full" || params.get("view") === "compact" ? params.get("view") : auto;
    let cur = -1, hits = [], hitAt = -1;
    const tl = V.timeline(steps, function (t) { select(t, true); }, "steps of this episode");
    const modeBtn = V.modeButton(function () { return mode; }, function () { mode = mode === "compact" ? "full" : "compact"; draw(); });
    const find = V.el("input", { id: "ep-find", type: "search", placeholder: "find in this episode (f)", "aria-label": "find in this episode" });
    find.value = q;
    const hitCount = V.el("span", { id: "hit-count", className: "note", "aria-live": "polite" });
    // the keys' moves as buttons too (a phone has no j/k/n/N)
    const stepBtns = [V.el("button", { type: "button", id: "step-prev", title: "previous step (k)", onclick: function () { select(cur < 0 ? 0 : cur - 1, true); } }, "◀ step"),
      V.el("button", { type: "button", id: "step-next", title: "next step (j)", onclick: function () { select(cur + 1, true); } }, "step ▶")];
    const hitBtns = [V.el("button", { type: "button", id: "match-prev", title: "previous match (N)", onclick: function () { nextHit(-1); } }, "◀ match"),
      V.el("button", { type: "button", id: "match-next", title: "next match (n)", onclick: function () { nextHit(1); } }, "match ▶")];
    const bar = V.el("div", { className: "stepbar" }, tl.el, V.el("div", { className: "tools" }, stepBtns, modeBtn.el, find, hitBtns, hitCount));
    const list = V.el("div", { className: "steps" });
    root.appendChild(bar);
    root.appendChild(list);

    function link() {
      return V.link("episode", { run: run.id, task: env, seed: seed, sample: sample, step: cur < 0 ? null : cur, q: q,
        view: mode === auto ? null : mode });
    }
    function stepView(s, t) {
      const before = mode === "compact" && t > 0 ? steps[t - 1] : null;
      return V.el("section", { className: "step", id: "step-" + t, dataset: { t: t } },
        V.el("div", { className: "step-head" }, V.el("a", { className: "t", href: "#" }, "step " + t), " ", V.stepFlags(s),
          V.el("span", { className: "spacer" }), V.afterAction(s)),
        V.stepBody(s, t, data.adm, q, before));
    }
    function draw() {
      list.textContent = "";
      const frag = document.createDocumentFragment();
      steps.forEach(function (s, t) { frag.appendChild(stepView(s, t)); });
      const last = steps.length ? steps[steps.length - 1].observation : null;
      frag.appendChild(V.el("section", { className: "step final", id: "step-final" }, V.el("div", { className: "step-head" }, "final observation (after the last action)"),
        V.observation(data.final, q, mode === "compact" ? last : null, steps.length - 1)));
      list.appendChild(frag);
      hits = Array.from(list.querySelectorAll("mark.hit"));
      hitAt = -1;
      const withHits = new Set();
      for (const h of hits) {
        const sec = h.closest(".step");
        if (sec && sec.dataset.t !== undefined) { withHits.add(Number(sec.dataset.t)); sec.classList.add("match"); }
      }
      tl.setHits(withHits);
      hitCount.textContent = !q ? "" : hits.length ? hits.length + (hits.length >= V.MAX_HITS ? "+" : "") + " matches (n / N)" : "no match";
      for (const b of hitBtns) b.hidden = !hits.length;
      if (cur >= 0) { const t = cur; cur = -1; select(t, false); }
      V.stickyOffset(bar);
    }
    function select(t, scroll) {
      if (!steps.length) return;
      t = Math.max(0, Math.min(steps.length - 1, t));
      const old = list.querySelector(".step.current");
      if (old) old.classList.remove("current");
      const sec = document.getElementById("step-" + t);
      sec.classList.add("current");
      cur = t;
      tl.setCurrent(t);
      if (scroll) { V.stickyOffset(bar); sec.scrollIntoView({ block: "start" }); }
      V.replaceHash(link());
    }
    // The next (d = 1) or previous (d = -1) search match; the first from the current step on, at first.
    function nextHit(d) {
      if (!hits.length) return;
      if (hitAt < 0 && cur >= 0) {
        const from = hits.findIndex(function (h) { const sec = h.closest(".step"); return !sec.dataset.t || Number(sec.dataset.t) >= cur; });
        hitAt = d > 0 ? (from < 0 ? 0 : from) : (from <= 0 ? hits.length - 1 : from - 1);
      } else hitAt = hitAt < 0 ? (d > 0 ? 0 : hits.length - 1) : (hitAt + d + hits.length) % hits.length;
      for (const h of list.querySelectorAll("mark.current")) h.classList.remove("current");
      const h = hits[hitAt];
      h.classList.add("current");
      const sec = h.closest(".step");
      if (sec.dataset.t !== undefined) select(Number(sec.dataset.t), false);
      V.stickyOffset(bar);
      h.scrollIntoView({ block: "center" });
      hitCount.textContent = "match " + (hitAt + 1) + " of " + hits.length + " (n / N)";
    }
    // A panel opened later (messages, a long text's rest) brings its matches into n / N once it is built.
    function recount() {
      setTimeout(function () {
        const at = hits[hitAt];
        hits = Array.from(list.querySelectorAll("mark.hit"));
        hitAt = hits.indexOf(at);
      }, 0);
    }
    list.addEventListener("toggle", recount, true);
    list.addEventListener("click", function (e) {
      if (e.target.closest && e.target.closest("button.more, button.fold")) recount();
      const a = e.target.closest && e.target.closest("a.t");
      if (!a) return;
      e.preventDefault();
      select(Number(a.closest(".step").dataset.t), false);
    });
    let timer = 0;
    find.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(function () { q = find.value.trim(); draw(); V.replaceHash(link()); }, 200);
    });
    find.addEventListener("keydown", function (e) {
      if (e.key !== "Enter") return;
      clearTimeout(timer);
      if (find.value.trim() !== q) { q = find.value.trim(); draw(); }
      nextHit(e.shiftKey ? -1 : 1);
    });
    draw();
    const want = params.get("step");
    if (want !== null && want !== "" && !Number.isNaN(Number(want))) select(Number(want), true);
    else if (q) nextHit(1);
    V.onKey = function (e) {
      if (e.key === "j") { select(cur + 1, true); return true; }
      if (e.key === "k") { select(cur < 0 ? 0 : cur - 1, true); return true; }
      if (e.key === "J") { go(1); return true; }
      if (e.key === "K") { go(-1); return true; }
      if (e.key === "n") { nextHit(1); return true; }
      if (e.key === "N") { nextHit(-1); return true; }
      if (e.key === "c") { modeBtn.el.click(); return true; }
      if (e.key === "f") { find.focus(); find.select(); return true; }
      if (e.key === "/") { location.hash = V.link("episodes", { run: run.id, q: q, focus: 1 }); return true; }
      return false;
    };
  }
})();
