// crl-bench viewer: the run page (per-task results, a success chart, errored episodes).
"use strict";
(function () {
  const V = window.CRLVIEW;

  function model(summary) {
    const a = summary.agent || {};
    return a.model || (a.llm && a.llm.model) || "";
  }

  function chart(tasks) {
    const box = V.el("div", { className: "chart", role: "img", "aria-label": "success per task" });
    for (const env of Object.keys(tasks)) {
      const t = tasks[env];
      const s = t.success === null ? 0 : t.success, se = t.success_se || 0;
      const fill = V.el("div", { className: "fill" });
      fill.style.width = (100 * s).toFixed(2) + "%";
      const whisker = V.el("div", { className: "whisker" });
      whisker.style.left = Math.max(0, 100 * (s - se)).toFixed(2) + "%";
      whisker.style.width = (100 * (Math.min(1, s + se) - Math.max(0, s - se))).toFixed(2) + "%";
      box.appendChild(V.el("div", { className: "bar-row" }, V.el("span", { className: "bar-label", title: env }, V.shortTask(env)),
        V.el("div", { className: "track" }, fill, whisker), V.el("span", { className: "bar-value" }, V.pct(t.success) + "%")));
    }
    return box;
  }

  V.pages.run = function (params, root) {
    const run = V.run(params.get("run"));
    const s = run.summary, m = s.macro || {};
    V.setCrumbs(V.runCrumbs(run));
    document.title = run.label + " · crl-bench";
    root.appendChild(V.el("h1", null, run.label, s.incomplete ? [" ", V.el("span", { className: "badge incomplete" }, "incomplete")] : null));
    if (s.incomplete) {
      root.appendChild(V.el("p", { className: "warnings", id: "incomplete-note", role: "note" }, "Incomplete: this run has no summary.json " +
        "(it is still running, or was stopped before its end). What is here is tallied from the " + s.incomplete.episodes +
        (s.incomplete.episodes === 1 ? " episode" : " episodes") + " on disk, over " + s.incomplete.tasks + (s.incomplete.tasks === 1 ? " task" : " tasks") +
        "; the number it was to play is not on disk. `python -m eval.run ... --resume` with the same options finishes it and writes the summary."));
    }
    if (s.train_eval) {
      const te = s.train_eval;
      root.appendChild(V.el("p", { className: "note", id: "train-eval-note" }, "A held-out evaluation of a training run at step " + te.step +
        (te.mode !== "grpo" ? (te.with_experience ? ", with" : ", without") + " test-time experience" : "") + ": the " + (te.policy || "policy") +
        " on seeds " + (te.seeds ? te.seeds[0] + "–" + (te.seeds[0] + te.seeds[1] - 1) : "?") + " of " + (te.tasks || []).join(", ") + "."));
    }
    const agent = s.agent || {};
    root.appendChild(V.el("p", { className: "meta" }, "agent " + (agent.name || "?") + (model(s) ? " · model " + model(s) : "") +
      (s.schema_version ? " · created " + (s.created || "?") + " · git " + (s.git_sha || "n/a") + " · summary schema " + s.schema_version : "")));
    V.append(root, V.warningsBox(run));
    // A summary-only run (a leaderboard submission of summary.json alone) offers no lists it could not fill.
    root.appendChild(run.episodes ? V.el("p", { className: "actions" },
      V.el("a", { className: "button", href: V.link("episodes", { run: run.id }) }, "Episodes (" + run.episodes + ")"),
      V.isStreamRun(run) ? V.el("a", { className: "button", id: "stream-link", href: V.link("stream", { run: run.id }) },
        "Stream: with vs without memory") : null,
      run.trajectories ? null : V.el("span", { className: "note" }, " This run has no trajectories: each episode's summary only."),
      V.site().runs.length > 1 ? V.el("a", { className: "button", href: V.link("compare", { a: run.id }) }, "Compare with another run") : null)
      : V.el("p", { className: "note", id: "summary-only" }, V.noEpisodes(run)));
    const tasks = s.tasks || {};
    const passK = Object.keys(tasks).some(function (e) { return tasks[e].pass_at_k && Object.keys(tasks[e].pass_at_k).length; });
    const head = ["task", "episodes", "success % ± SE", "progress % ± SE", "mean actions", "invalid", "tokens in / out",
      "search time s", "errored"].concat(passK ? ["pass@k %"] : []);
    const body = V.el("tbody");
    for (const env of Object.keys(tasks)) {
      const t = tasks[env], extra = t.extra || {};
      body.appendChild(V.el("tr", null,
        V.el("td", null, run.episodes ? V.el("a", { href: V.link("episodes", { run: run.id, task: env }) }, env) : env),
        V.el("td", { className: "num" }, t.episodes), V.el("td", { className: "num" }, V.pct(t.success) + " ± " + V.pct(t.success_se)),
        V.el("td", { className: "num" }, V.pct(t.progress) + " ± " + V.pct(t.progress_se)),
        V.el("td", { className: "num" }, V.fmt(t.mean_actions, 1)), V.el("td", { className: "num" }, V.fmt(t.mean_invalid_actions, 1)),
        V.el("td", { className: "num" }, V.fmt(t.mean_tokens_in, 0) + " / " + V.fmt(t.mean_tokens_out, 0)),
        V.el("td", { className: "num" }, extra.search_time_s === undefined ? "–" : V.fmt(extra.search_time_s, 3)),
        V.el("td", { className: "num" }, t.errored),
        passK ? V.el("td", { className: "num" }, Object.keys(t.pass_at_k || {}).map(function (k) {
          return "@" + k + " " + V.pct(t.pass_at_k[k]);
        }).join(" · ") || "–") : null));
    }
    body.appendChild(V.el("tr", { className: "macro" }, V.el("td", null, "macro average (" + (m.tasks || 0) + " tasks)"), V.el("td"),
      V.el("td", { className: "num" }, V.pct(m.success) + " ± " + V.pct(m.success_se)), V.el("td", { className: "num" }, V.pct(m.progress)),
      V.el("td"), V.el("td"), V.el("td"), V.el("td"), V.el("td"), passK ? V.el("td") : null));
    root.appendChild(V.scrollTable(V.el("table", { className: "grid" }, V.el("thead", null, V.el("tr", null, head.map(function (h) { return V.el("th", null, h); }))), body), "task-table"));
    root.appendChild(V.el("h2", null, "Success per task"));
    root.appendChild(chart(tasks));
    const errors = s.errors || [];
    root.appendChild(V.el("h2", null, "Errored episodes (" + errors.length + ")"));
    if (!errors.length) root.appendChild(V.el("p", { className: "note" }, "None."));
    else {
      root.appendChild(V.el("p", { className: "note" }, "Errored episodes count as failures."));
      root.appendChild(V.el("ul", { className: "errors" }, errors.slice(0, 500).map(function (e) {
        return V.el("li", null, run.episodes ? V.el("a", { href: V.link("episode", { run: run.id, task: e.env_id, seed: e.seed, sample: e.sample || 0 }) }, String(e.key)) : String(e.key),
          ": ", V.el("code", null, String(e.error)));
      }), errors.length > 500 ? V.el("li", null, "… and " + (errors.length - 500) + " more (filter the episode list by errored)") : null));
    }
    root.appendChild(V.el("details", null, V.el("summary", null, "Agent and run configuration"),
      V.pre(JSON.stringify({ agent: s.agent, run: s.run }, null, 2))));
  };
})();
