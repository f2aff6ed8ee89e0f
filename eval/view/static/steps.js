// crl-bench viewer: a step as the episode page and compare both draw it, and an episode's timeline strip.
// A step reads top to bottom: the observation the agent saw (whole, or compact: the lines repeated from the
// previous step folded, what changed marked), then the action, then for LLM agents the turn. Its head says
// what the action led to: reward and progress are the env's answer to that step's action.
"use strict";
(function () {
  const V = window.CRLVIEW;
  V.COMPACT_FROM = 20; // episodes of at least this many steps open in compact mode
  const ALIGN_CELLS = 40000; // observations of more lines than this (lines x lines) are shown whole

  // A map row: something drawn, with no word in it (a monster is one letter, a message has words).
  function isMapRow(line) { return line.trim().length >= 2 && !/[A-Za-z]{3}/.test(line); }

  // For each line of cur, the line of prev it stands for, or -1: the same position when both have as many
  // lines (a game screen), else a longest common subsequence with the lines between anchors paired in order.
  function align(prev, cur) {
    const pair = new Array(cur.length).fill(-1);
    if (prev.length === cur.length) { for (let i = 0; i < cur.length; i++) pair[i] = i; return pair; }
    const n = prev.length, m = cur.length;
    if (n * m > ALIGN_CELLS) return null;
    const L = [];
    for (let i = 0; i <= n; i++) L.push(new Uint16Array(m + 1));
    for (let i = n - 1; i >= 0; i--) for (let j = m - 1; j >= 0; j--) {
      L[i][j] = prev[i] === cur[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
    }
    let i = 0, j = 0, gapP = [], gapC = [];
    function flush() {
      for (let k = 0; k < gapC.length && k < gapP.length; k++) pair[gapC[k]] = gapP[k];
      gapP = []; gapC = [];
    }
    while (i < n && j < m) {
      if (prev[i] === cur[j]) { flush(); pair[j] = i; i++; j++; }
      else if (L[i + 1][j] >= L[i][j + 1]) gapP.push(i++);
      else gapC.push(j++);
    }
    while (j < m) gapC.push(j++);
    while (i < n) gapP.push(i++);
    flush();
    return pair;
  }

  // What changed from line a to line b, as ranges of b: each differing cell of a map row of equal width,
  // else the span between the common start and end, widened to whole words ("right" -> "left" marks "left",
  // not the "lef" a common final "t" would leave).
  const WORD = /[\p{L}\p{N}_]/u;
  V.changes = changes;
  function changes(a, b, mapRow) {
    if (a === undefined) return b.length ? [[0, b.length, "chg"]] : [];
    if (a === b) return [];
    const out = [];
    if (mapRow && a.length === b.length) {
      for (let k = 0; k < b.length; k++) {
        if (a[k] === b[k]) continue;
        const last = out[out.length - 1];
        if (last && last[1] === k) last[1] = k + 1; else out.push([k, k + 1, "chg"]);
      }
      return out;
    }
    let p = 0, s = 0;
    while (p < a.length && p < b.length && a[p] === b[p]) p++;
    while (s < a.length - p && s < b.length - p && a[a.length - 1 - s] === b[b.length - 1 - s]) s++;
    let end = b.length - s;
    if (end <= p) return []; // only deleted text: nothing of b to mark
    while (p > 0 && WORD.test(b[p - 1]) && WORD.test(b[p])) p--;
    while (end < b.length && WORD.test(b[end]) && WORD.test(b[end - 1])) end++;
    return [[p, end, "chg"]];
  }

  function foldLabel(lines, mapRows) {
    const names = [];
    lines.forEach(function (l, k) {
      const m = /^\s*([^:]{1,24}):/.exec(l);
      const name = mapRows[k] ? "map" : m ? m[1].trim() : l.trim().slice(0, 16) + (l.trim().length > 16 ? "…" : "");
      if (name && String(names[names.length - 1]).toLowerCase() !== name.toLowerCase()) names.push(name);
    });
    const text = names.join(", ");
    return text.length > 90 ? text.slice(0, 89) + "…" : text;
  }

  // An observation, whole (prev null) or compact against the previous step's observation prev: the lines as
  // they were are folded into one button above the rest (a map folds only when none of its rows changed);
  // the button unfolds them in place. What changed is marked either way.
  V.observation = function (text, q, prev, prevT) {
    text = text === null || text === undefined ? "" : String(text);
    if (prev === null || prev === undefined || text.length > V.SHOW_CHARS || String(prev).length > V.SHOW_CHARS) {
      return V.pre(text, "text observation", q);
    }
    const cur = text.split("\n"), old = String(prev).split("\n");
    const pair = align(old, cur);
    if (!pair) return V.pre(text, "text observation", q);
    const map = cur.map(isMapRow);
    const marks = cur.map(function (l, i) { return V.findAll(l, q).concat(changes(pair[i] < 0 ? undefined : old[pair[i]], l, map[i])); });
    const show = cur.map(function (l, i) { return pair[i] < 0 || old[pair[i]] !== l || marks[i].length > 0; });
    for (let i = 0; i < cur.length;) { // a map shows whole when any of its rows does, with its "Map:" title
      let j = i;
      while (j < cur.length && map[j]) j++;
      if (j - i >= 2 && show.slice(i, j).some(Boolean)) {
        for (let k = i; k < j; k++) show[k] = true;
        if (i > 0 && /:\s*$/.test(cur[i - 1])) show[i - 1] = true;
      }
      i = Math.max(j, i + 1);
    }
    const pre = V.el("pre", { className: "text observation compact" });
    function lines(which) {
      const out = [];
      cur.forEach(function (l, i) { if (which(i)) out.push(V.decorate(l, marks[i]), "\n"); });
      out.pop();
      return out;
    }
    const folded = cur.filter(function (l, i) { return !show[i]; });
    if (folded.length) {
      const what = folded.length === cur.length ? "all " + cur.length + " lines as in step " + prevT
        : folded.length + (folded.length === 1 ? " line" : " lines") + " as in step " + prevT + ": " +
          foldLabel(folded, cur.map(function (l, i) { return map[i]; }).filter(function (m, i) { return !show[i]; }));
      const b = V.el("button", { type: "button", className: "fold", title: folded.join("\n").slice(0, 2000) }, "⋯ " + what);
      b.addEventListener("click", function () { pre.textContent = ""; V.append(pre, lines(function () { return true; })); });
      V.append(pre, [b, folded.length < cur.length ? "\n" : null]);
    }
    V.append(pre, lines(function (i) { return show[i]; }));
    return pre;
  };

  V.chosenProb = function (s) {
    const turn = s.turn;
    if (!turn || !Array.isArray(turn.candidates)) return null;
    const c = turn.candidates[turn.chosen];
    return c && typeof c.prob === "number" ? c.prob : null;
  };

  function has(text, q) { return !!q && String(text === null || text === undefined ? "" : text).toLowerCase().includes(q.toLowerCase()); }

  // An LLM turn: meta, scored candidates, searches, then (collapsed) experience shown, raw reply and messages.
  // A collapsed panel holding the search q opens when nothing shown already holds it (hitShown).
  function turnView(turn, q, hitShown) {
    const out = [];
    const meta = ["method " + (turn.method || "?")];
    if (turn.policy_version !== undefined) meta.push("policy v" + turn.policy_version);
    if (typeof turn.temperature === "number") meta.push("temperature " + V.fmt(turn.temperature));
    if (turn.score_norm) meta.push("score " + turn.score_norm);
    if (typeof turn.action_logprob === "number") {
      meta.push(V.el("span", { className: "q-label", title: "log p(action): the natural log of the chosen candidate's prob " +
        "(the policy's log-probability of the action it took, as training uses it)" }, "log p(action) " + V.fmt(turn.action_logprob, 3)));
    }
    if (turn.n_prompt_token_ids !== undefined) meta.push(turn.n_prompt_token_ids + " prompt tokens");
    if (turn.n_token_ids !== undefined) meta.push(turn.n_token_ids + " reply tokens");
    out.push(V.el("div", { className: "turn-meta" }, meta.map(function (m, i) { return i ? [" · ", m] : m; })));
    const cands = Array.isArray(turn.candidates) ? turn.candidates : [];
    const searches = Array.isArray(turn.searches) ? turn.searches : [];
    if (cands.length) {
      const rows = cands.map(function (c, i) {
        const p = typeof c.prob === "number" ? c.prob : null;
        const bar = V.el("div", { className: "pbar" });
        bar.style.width = p === null ? "0" : Math.max(0, Math.min(100, 100 * p)).toFixed(1) + "%";
        return V.el("tr", { className: i === turn.chosen ? "chosen" : "" }, V.el("td", null, i === turn.chosen ? "▶" : ""),
          V.el("td", null, V.marked("code", null, String(c.text), q)), V.el("td", { className: "pcell" }, V.el("div", { className: "ptrack" }, bar)),
          V.el("td", { className: "num prob" }, p === null ? "–" : p > 0 && p < 0.001 ? p.toExponential(1) : p.toFixed(3)), V.el("td", { className: "num logprob" }, V.fmt(c.logprob, 2)));
      });
      const temp = typeof turn.temperature === "number" ? " at temperature " + V.fmt(turn.temperature) : " at the agent's temperature";
      const heads = [["", "c-mark"], ["candidate", "c-text"], ["", "c-bar"],
        ["prob", "c-prob", "prob: the policy's probability of this candidate, its score normalised over these candidates" + temp +
          " (softmax of log-prob / temperature); the column sums to 1"],
        ["seq log\u2011prob", "c-logprob", "seq log-prob: the model's raw log-probability of the candidate's tokens, " +
          (turn.score_norm === "mean" ? "averaged over them (score mean)" : "summed over them") +
          "; not normalised over the candidates, so exp(seq log-prob) is not prob"]];
      out.push(V.el("table", { className: "candidates" }, V.el("thead", null, V.el("tr", null, heads.map(function (h) {
        return V.el("th", { className: h[1], title: h[2] }, h[2] ? V.el("span", { className: "q-label" }, h[0]) : h[0]);
      }))), V.el("tbody", null, rows)));
    }
    if (searches.length) {
      out.push(V.el("div", { className: "searches" }, searches.map(function (x) {
        return V.el("div", { className: "qa" }, V.el("div", null, V.el("b", null, "Q "), V.marked("span", null, String(x.question), q)),
          V.el("div", null, V.el("b", null, "A "), V.pre(x.answer, "text", q)));
      })));
    }
    hitShown = hitShown || cands.some(function (c) { return has(c.text, q); }) ||
      searches.some(function (x) { return has(x.question, q) || has(x.answer, q); });
    const exp = Array.isArray(turn.experience_shown) ? turn.experience_shown : [];
    const msgs = Array.isArray(turn.messages) ? turn.messages : [];
    const panels = [
      exp.length && ["Experience shown (" + exp.length + ")", "experience", exp.some(function (x) { return has(x.title, q) || has(x.content, q); }), function () {
        return exp.map(function (x) {
          return V.el("div", { className: "exp" }, V.marked("div", { className: "exp-title" }, "#" + String(x.id) + " " + String(x.title || ""), q), V.pre(x.content, "text", q));
        });
      }],
      turn.reply && ["Raw reply (" + String(turn.reply).length + " chars)", "reply", has(turn.reply, q), function () { return V.pre(turn.reply, "text reply", q); }],
      msgs.length && ["Messages as sent (" + msgs.length + ")", "messages", msgs.some(function (m) { return has(m.content, q); }), function () {
        return msgs.map(function (m) { return V.el("div", { className: "message" }, V.el("div", { className: "role" }, String(m.role)), V.pre(m.content, "text", q)); });
      }],
    ];
    for (const p of panels) {
      if (!p) continue;
      const open = p[2] && !hitShown;
      if (open) hitShown = true;
      out.push(V.lazyDetails(p[0] + (p[2] ? " · holds the search" : ""), p[3], p[1], open));
    }
    return V.el("div", { className: "turn" }, out);
  }

  V.stepFlags = function (s) {
    const flags = [];
    if (!s.valid) flags.push(V.el("span", { className: "badge invalid" }, "invalid"));
    if (s.success) flags.push(V.el("span", { className: "badge success" }, "success"));
    if (s.terminated) flags.push(V.el("span", { className: "badge" }, "terminated"));
    if (s.truncated) flags.push(V.el("span", { className: "badge" }, "truncated"));
    return flags;
  };
  V.afterAction = function (s) {
    return V.el("span", { className: "after", title: "the env's answer to this step's action (the observation above is from before it)" },
      "after the action: reward " + V.fmt(s.reward) + " · progress " + V.fmt(s.progress));
  };

  // The body of step s at t: observation, action, admissible actions, the LLM turn and the rest of info. adm is
  // the episode's table of admissible-action lists. Compact mode passes the step before (its observation is
  // what this one is compared with; admissible actions it had too are not listed again).
  V.stepBody = function (s, t, adm, q, before) {
    const out = [V.observation(s.observation, q, before ? before.observation : null, t - 1),
      V.el("div", { className: "act" }, V.el("span", { className: "label" }, "→ action"), " ", V.marked("code", { className: "action" }, s.action, q))];
    const list = s.adm !== null && s.adm !== undefined && !(before && before.adm === s.adm) ? adm[s.adm] : null;
    if (list) {
      out.push(list.length > 12 ? V.lazyDetails("admissible actions (" + list.length + ")", function () { return V.marked("div", { className: "adm" }, list.join(" · "), q); })
        : V.marked("div", { className: "adm" }, "admissible: " + list.join(" · "), q));
    }
    if (s.turn) out.push(turnView(s.turn, q, has(s.observation, q) || has(s.action, q) || (!!list && list.length <= 12 && has(list.join(" · "), q))));
    if (s.info) out.push(V.lazyDetails("info", function () { return V.pre(JSON.stringify(s.info, null, 2)); }, "info"));
    return out;
  };

  const KIND_WORDS = { invalid: "invalid action", success: "solved", reward: "reward", penalty: "negative reward",
    progress: "progress up", setback: "progress down", plain: "no change in reward or progress" };
  // before: the progress after the previous step (null at step 0: the progress at reset is not recorded).
  function markKind(s, before) {
    if (!s.valid) return "invalid";
    if (s.success) return "success";
    if (typeof s.reward === "number" && s.reward > 0) return "reward";
    if (typeof s.reward === "number" && s.reward < 0) return "penalty";
    if (typeof s.progress === "number" && typeof before === "number" && s.progress > before) return "progress";
    if (typeof s.progress === "number" && typeof before === "number" && s.progress < before) return "setback";
    return "plain";
  }

  // The strip of an episode's steps: one mark per step, coloured by what its action led to and, for an LLM
  // agent that scored candidates, as tall as the probability it gave the action it chose. A click calls
  // pick(t). slots (at least the step count) pads the strip so that strips of one width line up step by
  // step (compare). Returns {el, setCurrent(t), setHits(steps with a search match), marks}.
  V.timeline = function (steps, pick, label, slots) {
    const strip = V.el("div", { className: "timeline" + (steps.length > 300 ? " dense" : ""), "data-role": "timeline", role: "group", "aria-label": label });
    let before = null, anyProb = false;
    const marks = steps.map(function (s, t) {
      const kind = markKind(s, before);
      before = s.progress;
      const p = V.chosenProb(s);
      const fill = V.el("span", { className: "fill" });
      const data = { t: t, kind: kind };
      if (p !== null) { anyProb = true; data.p = p.toFixed(4); fill.style.height = Math.max(12, Math.round(100 * p)) + "%"; }
      return V.el("button", { type: "button", className: "mark " + kind, dataset: data, "aria-label": "step " + t,
        title: "step " + t + ": " + String(s.action).slice(0, 200) + "\n" + KIND_WORDS[kind] + " · reward " + V.fmt(s.reward) +
          " · progress " + V.fmt(s.progress) + (p === null ? "" : " · p(chosen) " + p.toFixed(3)) }, fill);
    });
    V.append(strip, marks);
    for (let t = steps.length; t < (slots || 0); t++) strip.appendChild(V.el("span", { className: "mark pad", "aria-hidden": "true" }));
    // Every mark gets the same width (CSS: the strip's width over --n marks, within the min and max), so a strip
    // that wraps on a narrow screen wraps into rows of equal marks.
    strip.style.setProperty("--n", String(Math.max(steps.length, slots || 0, 1)));
    strip.addEventListener("click", function (e) {
      const m = (e.target.closest && e.target.closest(".mark:not(.pad)")) || nearest(e.clientX, e.clientY);
      if (m) pick(Number(m.dataset.t));
    });
    // The mark under a point of the strip (a phone taps the strip as a whole: its marks are too narrow to hit).
    function nearest(x, y) {
      let best = null, score = Infinity;
      for (const m of marks) {
        const r = m.getBoundingClientRect();
        const dy = y < r.top ? r.top - y : y > r.bottom ? y - r.bottom : 0, dx = Math.abs((r.left + r.right) / 2 - x);
        if (dy * 1000 + dx < score) { score = dy * 1000 + dx; best = m; }
      }
      return best;
    }
    const kinds = Array.from(new Set(marks.map(function (m) { return m.dataset.kind; })));
    const legend = V.el("div", { className: "tl-legend" }, kinds.map(function (k) {
      return V.el("span", null, V.el("span", { className: "swatch " + k }), KIND_WORDS[k]);
    }), anyProb ? V.el("span", null, "height: probability of the chosen action") : null);
    let current = null;
    return {
      el: V.el("div", { className: "tl" }, strip, legend), marks: marks,
      setCurrent: function (t) {
        if (current) current.classList.remove("current");
        current = marks[t] || null;
        if (current) current.classList.add("current");
      },
      setHits: function (ts) {
        marks.forEach(function (m, t) { m.classList.toggle("has-hit", ts.has(t)); });
      },
    };
  };

  // Keep sticky bars from covering what a jump scrolls to: steps scroll to just below the header and bar.
  V.stickyOffset = function (bar) {
    const top = document.getElementById("top"), style = document.documentElement.style;
    const head = getComputedStyle(top).position === "sticky" ? top.offsetHeight : 0; // a phone's header scrolls away
    style.setProperty("--head-h", head + "px");
    style.setProperty("--sticky-h", head + (bar ? bar.offsetHeight : 0) + 8 + "px");
  };

  // The compact/full toggle button; mode() is "compact" or "full", toggle() switches it.
  V.modeButton = function (mode, toggle) {
    const b = V.el("button", { type: "button", id: "view-mode", title: "c: compact (repeated lines folded, changes marked) or the full text" });
    function label() { b.textContent = mode() === "compact" ? "show full text (c)" : "compact: fold repeated lines (c)"; }
    b.addEventListener("click", function () { toggle(); label(); });
    label();
    return { el: b, refresh: label };
  };
})();
