// crl-bench viewer: one episode, step by step (observation, action, reward, validity, progress and, for LLM
// agents, the reply, the messages as sent, scored candidates, experience shown and searches).
"use strict";
(function () {
  const V = window.CRLVIEW;

  function turnView(turn) {
    const out = [];
    const meta = ["method " + (turn.method || "?")];
    if (turn.policy_version !== undefined) meta.push("policy v" + turn.policy_version);
    if (turn.n_prompt_token_ids !== undefined) meta.push(turn.n_prompt_token_ids + " prompt tokens");
    if (turn.n_token_ids !== undefined) meta.push(turn.n_token_ids + " reply tokens");
    out.push(V.el("div", { className: "turn-meta" }, meta.join(" · ")));
    if (Array.isArray(turn.candidates) && turn.candidates.length) {
      const rows = turn.candidates.map(function (c, i) {
        const p = typeof c.prob === "number" ? c.prob : null;
        const bar = V.el("div", { className: "pbar" });
        bar.style.width = p === null ? "0" : Math.max(0, Math.min(100, 100 * p)).toFixed(1) + "%";
        return V.el("tr", { className: i === turn.chosen ? "chosen" : "" }, V.el("td", null, i === turn.chosen ? "▶" : ""),
          V.el("td", null, V.el("code", null, String(c.text))), V.el("td", { className: "pcell" }, V.el("div", { className: "ptrack" }, bar)),
          V.el("td", { className: "num" }, p === null ? "–" : p.toFixed(3)), V.el("td", { className: "num" }, V.fmt(c.logprob, 2)));
      });
      out.push(V.el("table", { className: "candidates" }, V.el("thead", null, V.el("tr", null, ["", "candidate", "", "prob", "log-prob"]
        .map(function (h) { return V.el("th", null, h); }))), V.el("tbody", null, rows)));
    }
    if (Array.isArray(turn.experience_shown) && turn.experience_shown.length) {
      out.push(V.lazyDetails("Experience shown (" + turn.experience_shown.length + ")", function () {
        return turn.experience_shown.map(function (x) {
          return V.el("div", { className: "exp" }, V.el("div", { className: "exp-title" }, "#" + String(x.id) + " " + String(x.title || "")), V.pre(x.content));
        });
      }, "experience"));
    }
    if (Array.isArray(turn.searches) && turn.searches.length) {
      out.push(V.el("div", { className: "searches" }, turn.searches.map(function (q) {
        return V.el("div", { className: "qa" }, V.el("div", null, V.el("b", null, "Q "), String(q.question)), V.el("div", null, V.el("b", null, "A "), V.pre(q.answer)));
      })));
    }
    if (turn.reply) out.push(V.lazyDetails("Raw reply (" + String(turn.reply).length + " chars)", function () { return V.pre(turn.reply, "text reply"); }, "reply"));
    if (Array.isArray(turn.messages) && turn.messages.length) {
      out.push(V.lazyDetails("Messages as sent (" + turn.messages.length + ")", function () {
        return turn.messages.map(function (m) {
          return V.el("div", { className: "message" }, V.el("div", { className: "role" }, String(m.role)), V.pre(m.content));
        });
      }, "messages"));
    }
    return V.el("div", { className: "turn" }, out);
  }

  function stepView(s, t, data, q) {
    const flags = [];
    if (!s.valid) flags.push(V.el("span", { className: "badge invalid" }, "invalid"));
    if (s.success) flags.push(V.el("span", { className: "badge success" }, "success"));
    if (s.terminated) flags.push(V.el("span", { className: "badge" }, "terminated"));
    if (s.truncated) flags.push(V.el("span", { className: "badge" }, "truncated"));
    const turn = s.turn || {};
    const hay = q ? (s.observation + "\n" + s.action + "\n" + (turn.reply || "")).toLowerCase() : "";
    const sec = V.el("section", { className: "step" + (q && hay.includes(q) ? " match" : ""), id: "step-" + t, dataset: { t: t } },
      V.el("div", { className: "step-head" }, V.el("a", { className: "t", href: "#" }, "step " + t), " ", flags,
        V.el("span", { className: "spacer" }), V.el("span", { className: "kv", title: "after the action" }, "reward " + V.fmt(s.reward)),
        V.el("span", { className: "kv", title: "after the action" }, "progress " + V.fmt(s.progress))),
      // Read top to bottom: what the agent saw, then what it did.
      V.pre(s.observation, "text observation"),
      V.el("div", { className: "act" }, V.el("span", { className: "label" }, "→ action"), " ", V.el("code", { className: "action" }, s.action)));
    if (s.adm !== null && s.adm !== undefined && data.adm[s.adm]) {
      const adm = data.adm[s.adm];
      sec.appendChild(adm.length > 12 ? V.lazyDetails("admissible actions (" + adm.length + ")", function () { return V.el("div", { className: "adm" }, adm.join(" · ")); })
        : V.el("div", { className: "adm" }, "admissible: " + adm.join(" · ")));
    }
    if (s.turn) sec.appendChild(turnView(s.turn));
    if (s.info) sec.appendChild(V.lazyDetails("info", function () { return V.pre(JSON.stringify(s.info, null, 2)); }, "info"));
    return sec;
  }

  V.renderEpisodeHeader = function (run, ep, data) {
    return V.el("div", { className: "ep-head" },
      V.el("h1", null, ep.env + " · seed " + ep.seed + (ep.sample ? " · sample " + ep.sample : "")),
      V.el("p", { className: "meta" }, V.outcomeBadge(ep.outcome), " progress " + V.fmt(ep.progress) + " · reward " + V.fmt(ep.reward) +
        " · " + V.fmt(ep.actions) + " actions (" + V.fmt(ep.invalid) + " invalid) · tokens " + V.fmt(ep.tokens_in, 0) + " / " +
        V.fmt(ep.tokens_out, 0) + " · " + V.fmt(ep.wall_time_s) + " s" + (data && data.agent ? " · agent " + data.agent : "")),
      data && data.task ? V.el("p", { className: "task" }, "Task: ", V.el("span", null, data.task)) : null,
      ep.error ? V.el("p", { className: "error" }, "Error: ", V.el("code", null, ep.error)) : null);
  };

  V.pages.episode = function (params, root, current) {
    const run = V.run(params.get("run"));
    const env = params.get("task") || "", seed = params.get("seed"), sample = params.get("sample") || "0";
    const q = (params.get("q") || "").toLowerCase();
    V.setCrumbs([{ text: run.label, href: V.link("run", { run: run.id }) },
      { text: "Episodes", href: V.link("episodes", { run: run.id, q: q }) }, { text: V.shortTask(env) + " #" + seed }]);
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
          V.el("span", { className: "note" }, "  j/k: steps · ?: keys")));
        if (!data) {
          root.appendChild(V.el("p", { className: "note" }, "No trajectory was recorded for this episode (an older run, or written with --trajectories none): its summary is all there is."));
          V.onKey = function (e) {
            if (e.key === "J") { go(1); return true; }
            if (e.key === "K") { go(-1); return true; }
            if (e.key === "/") { location.hash = V.link("episodes", { run: run.id, focus: 1 }); return true; }
            return false;
          };
          return;
        }
        const steps = data.steps.map(V.step);
        const list = V.el("div", { className: "steps" }, steps.map(function (s, t) { return stepView(s, t, data, q); }));
        list.appendChild(V.el("section", { className: "step final" }, V.el("div", { className: "step-head" }, "final observation"), V.pre(data.final, "text observation")));
        root.appendChild(list);
        let cur = -1;
        function select(t, scroll) {
          if (!steps.length) return;
          t = Math.max(0, Math.min(steps.length - 1, t));
          const old = list.querySelector(".step.current");
          if (old) old.classList.remove("current");
          const sec = document.getElementById("step-" + t);
          sec.classList.add("current");
          cur = t;
          if (scroll) sec.scrollIntoView({ block: "start" });
          V.replaceHash(V.link("episode", { run: run.id, task: env, seed: seed, sample: sample, step: t, q: q }));
        }
        list.addEventListener("click", function (e) {
          const a = e.target.closest && e.target.closest("a.t");
          if (!a) return;
          e.preventDefault();
          select(Number(a.parentNode.parentNode.dataset.t), false);
        });
        const want = params.get("step");
        if (want !== null && want !== "" && !Number.isNaN(Number(want))) select(Number(want), true);
        else if (q) { const m = list.querySelector(".step.match"); if (m) select(Number(m.dataset.t), true); }
        V.onKey = function (e) {
          if (e.key === "j") { select(cur + 1, true); return true; }
          if (e.key === "k") { select(cur < 0 ? 0 : cur - 1, true); return true; }
          if (e.key === "J") { go(1); return true; }
          if (e.key === "K") { go(-1); return true; }
          if (e.key === "/") { location.hash = V.link("episodes", { run: run.id, q: q, focus: 1 }); return true; }
          return false;
        };
      });
    });
  };
})();
