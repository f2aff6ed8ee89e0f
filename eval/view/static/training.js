// crl-bench viewer: training runs. A training's page: held-out success first and last, the learning curve
// (held-out success with standard errors, training success, entropy, KL, and for crl the extractor's updates,
// meta-reward and valid-operation rate) as charts sharing one cursor, each held-out evaluation as a run, and
// Compare for the same held-out seeds at two steps. The trainings page puts several (the seeds of a tag) together.
"use strict";
(function () {
  const V = window.CRLVIEW;

  V.trainings = function () { return V.site().trainings || []; };
  V.training = function (id) {
    const t = V.trainings().find(function (x) { return x.id === id; });
    if (!t) throw new Error("no training run " + JSON.stringify(String(id)) + " in this site");
    return t;
  };
  // The crumbs that lead to a run: its training first where it is one of a training's evaluations.
  V.runCrumbs = function (run, here) {
    const out = [];
    if (run.training) {
      if (V.trainings().length > 1) out.push({ text: "Trainings", href: V.link("trainings", {}) });
      const t = V.training(run.training);
      out.push({ text: t.label, href: V.link("training", { t: t.id }) });
    }
    out.push(here ? { text: run.label, href: V.link("run", { run: run.id }) } : { text: run.label });
    return out;
  };

  const pctFmt = function (v, tick) { return tick ? (100 * v).toFixed(0) + "%" : (100 * v).toFixed(1) + "%"; };
  const numFmt = function (v, tick) { return tick ? String(+v.toFixed(3)) : v.toFixed(3); };
  const intFmt = function (v, tick) { return tick && !Number.isInteger(v) ? "" : String(Math.round(v)); };

  function points(rows, key, seKey) {
    return rows.filter(function (r) { return typeof r[key] === "number"; })
      .map(function (r) { return { x: r.step, y: r[key], se: seKey && typeof r[seKey] === "number" ? r[seKey] : 0 }; });
  }
  function evalRun(t, step, withExp) {
    const e = t.runs.find(function (r) { return r.step === step && r.with_experience === withExp; });
    return e ? e.run : null;
  }
  function hasExperience(t) { return t.evals.some(function (e) { return typeof e.with_experience === "number"; }); }

  // The panels of one training's curve; a panel without data is left out.
  function panels(t) {
    const ev = t.evals, mt = t.metrics, exp = hasExperience(t);
    return [
      { id: "chart-success", title: "Success (held-out: pure policy on seeds never trained on)", format: pctFmt, yMin: 0, yMax: 1, series: [
        { name: exp ? "held-out, without experience" : "held-out", key: "success", points: points(ev, "success", "success_se"), markers: true },
        { name: "held-out, with experience", key: "with_experience", points: points(ev, "with_experience", "with_experience_se"), markers: true },
        { name: "training rollouts", key: "train_success", points: points(mt, "train_success"), dashed: true }] },
      { id: "chart-entropy", title: "Policy entropy over the scored actions (nats)", format: numFmt, series: [
        { name: "entropy", key: "rollout/policy_entropy", points: points(mt, "rollout/policy_entropy") }] },
      { id: "chart-kl", title: "KL divergence", format: numFmt, series: [
        { name: "approx. KL to the policy before the update", key: "actor/approx_kl", points: points(mt, "actor/approx_kl") },
        { name: "KL to the untrained policy", key: "actor/kl_ref", points: points(mt, "actor/kl_ref"), markers: true }] },
      { id: "chart-extractor-updates", title: "Extractor updates (total)", format: intFmt, yMin: 0, series: [
        { name: "updates", key: "extractor/updates", points: points(mt, "extractor/updates") }] },
      { id: "chart-meta-reward", title: "Extractor meta-reward (mean outcome its entries guided, −1 to 1)", format: numFmt, yMin: -1, yMax: 1, series: [
        { name: "meta-reward", key: "extractor/meta_reward", points: points(mt, "extractor/meta_reward") }] },
      { id: "chart-valid-ops", title: "Extractor valid-operation rate", format: pctFmt, yMin: 0, yMax: 1, series: [
        { name: "valid operations", key: "extractor/valid_rate", points: points(mt, "extractor/valid_rate") }] },
    ].filter(function (p) { return p.series.some(function (s) { return s.points.length; }); });
  }

  function change(first, last, key) {
    if (!first || !last || typeof first[key] !== "number" || typeof last[key] !== "number") return null;
    const d = 100 * (last[key] - first[key]);
    return V.pct(first[key]) + "% → " + V.pct(last[key]) + "% (" + (d >= 0 ? "+" : "−") + Math.abs(d).toFixed(1) + " points)";
  }
  function statusText(t) {
    const s = t.status || {};
    return s.steps_done + (s.steps_planned ? " of " + s.steps_planned : "") + " steps" +
      (s.finished ? "" : " · still training, or stopped (this page shows what was on disk at the build)");
  }

  V.pages.training = function (params, root) {
    const t = V.training(params.get("t"));
    V.setCrumbs(V.trainings().length > 1 ? [{ text: "Trainings", href: V.link("trainings", {}) }, { text: t.label }] : [{ text: t.label }]);
    document.title = t.label + " · crl-bench";
    root.appendChild(V.el("h1", null, t.label));
    const first = t.evals[0], last = t.evals[t.evals.length - 1];
    const exp = hasExperience(t);
    root.appendChild(V.el("p", { id: "headline", className: "headline" }, first ? [
      V.el("b", null, "Held-out success" + (exp ? " without experience " : " ") + change(first, last, "success")),
      exp ? [V.el("br"), V.el("b", null, "with experience " + (change(first, last, "with_experience") || "–"))] : null,
      V.el("span", { className: "note" }, " from step " + first.step + " to step " + last.step)] : "No held-out evaluation yet."));
    const c = t.config || {};
    root.appendChild(V.el("p", { className: "meta" }, "mode " + (c.mode || "?") + " · " + String(c.tasks || "?") + " · " + statusText(t) +
      (typeof c.eval_seed === "number" ? " · held-out seeds " + c.eval_seed + "–" + (c.eval_seed + (c.eval_episodes || 1) - 1) : "") +
      " · " + t.folder));
    V.append(root, V.warningsBox(t));
    // the charts, one cursor for all of them, moved by pointer, tap or the step buttons
    const specs = panels(t);
    let charts = [], cursor = null;
    const steps = Array.from(new Set([].concat.apply([], specs.map(function (p) {
      return [].concat.apply([], p.series.map(function (s) { return s.points.map(function (q) { return q.x; }); }));
    })))).sort(function (a, b) { return a - b; });
    function move(x) {
      cursor = x;
      for (const ch of charts) ch.setCursor(x);
      stepNote.textContent = x === null ? "" : "step " + x;
      const runs = t.runs.filter(function (r) { return r.step === x; });
      openLinks.textContent = "";
      V.append(openLinks, runs.map(function (r) {
        return V.el("a", { className: "button", href: V.link("episodes", { run: r.run }) },
          "episodes at step " + r.step + (exp ? (r.with_experience ? " with" : " without") + " experience" : ""));
      }));
    }
    function by(d) {
      const i = cursor === null ? (d > 0 ? -1 : steps.length) : steps.indexOf(cursor);
      const j = Math.max(0, Math.min(steps.length - 1, i + d));
      if (steps.length) move(steps[j]);
    }
    const stepNote = V.el("span", { className: "note", "aria-live": "polite" });
    const openLinks = V.el("span", { className: "open-links" });
    root.appendChild(V.el("div", { className: "chart-tools" },
      V.el("button", { type: "button", id: "cursor-prev", onclick: function () { by(-1); } }, "◀ step"),
      V.el("button", { type: "button", id: "cursor-next", onclick: function () { by(1); } }, "step ▶"), stepNote, openLinks));
    charts = specs.map(function (spec) { return V.lineChart(Object.assign(spec, { xMin: steps[0], xMax: steps[steps.length - 1] }), move); });
    root.appendChild(V.el("div", { className: "charts" }, charts.map(function (ch) { return ch.el; })));
    // every evaluation, its runs one click away
    root.appendChild(V.el("h2", null, "Held-out evaluations (" + t.evals.length + ")"));
    const head = ["step", exp ? "without experience %" : "success %"].concat(exp ? ["with experience %"] : []).concat(["episodes"]);
    const body = V.el("tbody", null, t.evals.map(function (e) {
      const links = [false, true].map(function (w) {
        const id = evalRun(t, e.step, w);
        return id ? V.el("a", { href: V.link("run", { run: id }) }, exp ? (w ? "with" : "without") : "open") : null;
      }).filter(Boolean);
      return V.el("tr", null, V.el("td", { className: "num" }, e.step),
        V.el("td", { className: "num" }, V.pct(e.success) + " ± " + V.pct(e.success_se)),
        exp ? V.el("td", { className: "num" }, typeof e.with_experience === "number" ? V.pct(e.with_experience) + " ± " + V.pct(e.with_experience_se) : "–") : null,
        V.el("td", null, links.length ? links.map(function (a, i) { return i ? [" · ", a] : a; }) : V.el("span", { className: "note" }, "not kept")));
    }));
    root.appendChild(V.scrollTable(V.el("table", { className: "grid" }, V.el("thead", null, V.el("tr", null, head.map(function (h) { return V.el("th", null, h); }))), body), "evals-table"));
    if (t.runs.length < t.evals.length) {
      root.appendChild(V.el("p", { className: "note" }, "Evaluations marked “not kept” have their numbers only: the trainer that ran them did not keep their episodes."));
    }
    // Compare the same held-out seeds at two steps
    const kept = Array.from(new Set(t.runs.map(function (r) { return r.step; }))).sort(function (a, b) { return a - b; });
    if (kept.length >= 2) {
      const selA = V.el("select", { id: "cmp-step-a", "aria-label": "first step" }, kept.map(function (s) { return V.el("option", { value: s }, "step " + s); }));
      const selB = V.el("select", { id: "cmp-step-b", "aria-label": "second step" }, kept.map(function (s) { return V.el("option", { value: s }, "step " + s); }));
      selA.value = String(kept[0]); selB.value = String(kept[kept.length - 1]);
      const half = exp ? V.el("select", { id: "cmp-half", "aria-label": "with or without experience" },
        V.el("option", { value: "0" }, "without experience"), V.el("option", { value: "1" }, "with experience")) : null;
      const go = V.el("button", { type: "button", id: "compare-steps", onclick: function () {
        const w = half ? half.value === "1" : false;
        const a = evalRun(t, Number(selA.value), w), b = evalRun(t, Number(selB.value), w);
        if (a && b) location.hash = V.link("compare", { a: a, b: b });
      } }, "Compare");
      root.appendChild(V.el("h2", null, "Before and after: the same held-out seeds"));
      root.appendChild(V.el("div", { className: "filters" }, selA, V.el("span", null, "against"), selB, half, go));
    }
  };

  V.pages.trainings = function (params, root) {
    const ts = V.trainings();
    V.setCrumbs([{ text: "Trainings" }]);
    document.title = "Trainings · " + V.site().title;
    root.appendChild(V.el("h1", null, "Training runs (" + ts.length + ")"));
    const body = V.el("tbody", null, ts.map(function (t) {
      const first = t.evals[0], last = t.evals[t.evals.length - 1];
      return V.el("tr", null, V.el("td", null, V.el("a", { href: V.link("training", { t: t.id }) }, t.label)),
        V.el("td", { className: "num gain" }, change(first, last, "success") || "–"),
        V.el("td", null, (t.config || {}).mode || "?"), V.el("td", { className: "num" }, statusText(t)));
    }));
    root.appendChild(V.scrollTable(V.el("table", { className: "grid", id: "trainings-table" },
      V.el("thead", null, V.el("tr", null, ["training", "held-out success, first → last", "mode", "steps"].map(function (h) { return V.el("th", null, h); }))), body), "trainings-box"));
    const chart = V.lineChart({ id: "chart-seeds", title: "Held-out success per training", format: pctFmt, yMin: 0, yMax: 1,
      series: ts.map(function (t) { return { name: t.label, key: t.id, points: points(t.evals, "success", "success_se"), markers: true }; }) },
    function (x) { chart.setCursor(x); });
    root.appendChild(chart.el);
    const plain = V.site().runs.filter(function (r) { return !r.training; });
    if (plain.length) root.appendChild(V.el("p", null, V.el("a", { href: V.link("runs", {}) }, "Eval runs (" + plain.length + ")")));
  };
})();
