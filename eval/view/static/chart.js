// crl-bench viewer: a small line chart in SVG (no library): series of points over training steps, standard-error
// whiskers, a legend whose entries switch series on and off, and a cursor that a pointer, a tap or the
// step buttons move; the values at the cursor are written out in words under the chart.
"use strict";
(function () {
  const V = window.CRLVIEW;
  const NS = ["http", "://www.w3.org/2000/svg"].join(""); // the SVG namespace's name (never fetched)

  function svg(tag, attrs, children) {
    const e = document.createElementNS(NS, tag);
    for (const k of Object.keys(attrs || {})) if (attrs[k] !== null && attrs[k] !== undefined) e.setAttribute(k, String(attrs[k]));
    for (const c of children || []) if (c) e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    return e;
  }

  // About n round tick values covering [lo, hi].
  function ticks(lo, hi, n) {
    if (!(hi > lo)) return [lo];
    const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(function (m) { return m * mag; }).find(function (s) { return s >= raw; });
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) out.push(Math.round(v / step) * step);
    return out;
  }

  // spec: {title, id, xName (the readout's word for x; "step" if left out), format(y) -> text, yMin, yMax, xMin, xMax (each may be left out: from the data), series: [{name, key,
  // points: [{x, y, se}], markers: bool, dashed: bool}]}. onCursor(x) is called when the cursor moves here.
  // Returns {el, setCursor(x), xs}; el holds the legend, the chart and the readout.
  V.lineChart = function (spec, onCursor) {
    const series = spec.series.filter(function (s) { return s.points.length; });
    const shown = series.map(function () { return true; });
    const xs = Array.from(new Set([].concat.apply([], series.map(function (s) { return s.points.map(function (p) { return p.x; }); }))))
      .sort(function (a, b) { return a - b; });
    const box = V.el("div", { className: "chart-box" });
    const readout = V.el("p", { className: "readout note", "aria-live": "polite" });
    const legend = V.el("div", { className: "legend" }, series.map(function (s, i) {
      const b = V.el("button", { type: "button", className: "legend-item s" + i, "aria-pressed": "true", title: "show or hide " + s.name },
        V.el("span", { className: "swatch-line" + (s.dashed ? " dashed" : "") }), s.name);
      b.addEventListener("click", function () { shown[i] = !shown[i]; b.setAttribute("aria-pressed", String(shown[i])); draw(); });
      return b;
    }));
    const el = V.el("figure", { className: "chart-panel", id: spec.id }, V.el("figcaption", null, spec.title), legend, box, readout);
    let cursor = null, geom = null;

    function domain() {
      let lo = spec.yMin, hi = spec.yMax;
      const ys = [];
      series.forEach(function (s, i) {
        if (shown[i]) for (const p of s.points) { ys.push(p.y - (p.se || 0)); ys.push(p.y + (p.se || 0)); }
      });
      if (lo === undefined) lo = ys.length ? Math.min(0, Math.min.apply(null, ys)) : 0;
      if (hi === undefined) hi = ys.length ? Math.max.apply(null, ys) : 1;
      if (!(hi > lo)) hi = lo + 1;
      return [lo, hi];
    }

    function draw() {
      box.textContent = "";
      const W = Math.max(260, Math.floor(box.clientWidth || 600)), H = W < 500 ? 170 : 200;
      const m = { l: 46, r: 12, t: 8, b: 26 };
      const x0 = spec.xMin !== undefined ? spec.xMin : xs.length ? xs[0] : 0, x1 = spec.xMax !== undefined ? spec.xMax : xs.length ? xs[xs.length - 1] : 1;
      const d = domain();
      const X = function (x) { return m.l + (x1 > x0 ? (x - x0) / (x1 - x0) : 0.5) * (W - m.l - m.r); };
      const Y = function (y) { return H - m.b - (Math.max(d[0], Math.min(d[1], y)) - d[0]) / (d[1] - d[0]) * (H - m.t - m.b); };
      const root = svg("svg", { width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": spec.title });
      for (const v of ticks(d[0], d[1], 4)) {
        root.appendChild(svg("line", { x1: m.l, x2: W - m.r, y1: Y(v), y2: Y(v), class: "grid" }));
        root.appendChild(svg("text", { x: m.l - 4, y: Y(v) + 4, class: "tick", "text-anchor": "end" }, [spec.format(v, true)]));
      }
      for (const v of ticks(x0, x1, Math.min(6, Math.max(1, x1 - x0))).filter(function (v) { return Number.isInteger(v); })) {
        root.appendChild(svg("text", { x: X(v), y: H - 8, class: "tick", "text-anchor": "middle" }, [String(v)]));
      }
      series.forEach(function (s, i) {
        if (!shown[i]) return;
        const g = svg("g", { class: "series s" + i, "data-series": s.key });
        g.appendChild(svg("polyline", { points: s.points.map(function (p) { return X(p.x).toFixed(1) + "," + Y(p.y).toFixed(1); }).join(" "),
          class: "line" + (s.dashed ? " dashed" : "") }));
        for (const p of s.points) {
          if (p.se) g.appendChild(svg("line", { x1: X(p.x), x2: X(p.x), y1: Y(p.y - p.se), y2: Y(p.y + p.se), class: "whisker" }));
          if (s.markers) g.appendChild(svg("circle", { cx: X(p.x), cy: Y(p.y), r: 3.5, class: "point", "data-x": p.x }));
        }
        root.appendChild(g);
      });
      const guide = svg("line", { y1: m.t, y2: H - m.b, class: "cursor", visibility: "hidden" });
      root.appendChild(guide);
      const hit = svg("rect", { x: m.l, y: 0, width: W - m.l - m.r, height: H, class: "hit-area" });
      root.appendChild(hit);
      function at(ev) {
        const r = root.getBoundingClientRect(), px = (ev.clientX - r.left) * (W / (r.width || W));
        let best = null;
        for (const x of xs) if (best === null || Math.abs(X(x) - px) < Math.abs(X(best) - px)) best = x;
        return best;
      }
      hit.addEventListener("pointermove", function (ev) { const x = at(ev); if (x !== null && x !== cursor) onCursor(x); });
      hit.addEventListener("pointerdown", function (ev) { const x = at(ev); if (x !== null) onCursor(x); });
      box.appendChild(root);
      geom = { X: X, guide: guide };
      place();
    }

    function place() {
      if (!geom) return;
      if (cursor === null) { geom.guide.setAttribute("visibility", "hidden"); readout.textContent = "Point at (or tap) the chart for the values at " + (spec.xName ? "an " + spec.xName : "a step") + "."; return; }
      geom.guide.setAttribute("x1", geom.X(cursor)); geom.guide.setAttribute("x2", geom.X(cursor));
      geom.guide.setAttribute("visibility", "visible");
      const parts = [];
      series.forEach(function (s, i) {
        if (!shown[i]) return;
        const p = s.points.find(function (q) { return q.x === cursor; });
        if (p) parts.push(s.name + " " + spec.format(p.y) + (p.se ? " ± " + spec.format(p.se) : ""));
      });
      readout.textContent = (spec.xName || "step") + " " + cursor + ": " + (parts.length ? parts.join(" · ") : "no value at this step");
    }

    let width = 0;
    V.onResize(el, function () { if (box.clientWidth !== width) { width = box.clientWidth; draw(); } });
    return { el: el, xs: xs, draw: draw, setCursor: function (x) { cursor = x; place(); } };
  };

  // Call fn once el is in the page, and again whenever the window's width changes while it is.
  V.onResize = function (el, fn) {
    let timer = 0;
    function later() { clearTimeout(timer); timer = setTimeout(function () { if (el.isConnected) fn(); else window.removeEventListener("resize", later); }, 80); }
    window.addEventListener("resize", later);
    requestAnimationFrame(function () { if (el.isConnected) fn(); });
  };
})();
