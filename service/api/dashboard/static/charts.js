// KernelFleet dashboard charts: a small, dependency-free SVG renderer for the panels the service sends
// (service/api/dashboard/panels.py). Line and scatter charts with linear or log axes, and tables.
// Everything is built with DOM calls and textContent, so data can never inject markup.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4d7c0f", "#be185d"];
  const W = 720, H = 300, M = { top: 12, right: 18, bottom: 46, left: 72 };

  function el(name, attrs, parent) {
    const node = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    if (parent) parent.appendChild(node);
    return node;
  }

  function html(name, cls, parent, text) {
    const node = document.createElement(name);
    if (cls) node.className = cls;
    if (text !== undefined && text !== null) node.textContent = String(text);
    if (parent) parent.appendChild(node);
    return node;
  }

  // -- number formatting by unit -------------------------------------------------------------------------
  function sig(v, digits) {
    return Number(v.toPrecision(digits || 3)).toString();
  }

  function format(value, unit) {
    if (value === null || value === undefined || value === "") return "–";
    if (typeof value !== "number") return String(value);
    if (!isFinite(value)) return String(value);
    switch (unit) {
      case "s": {
        const a = Math.abs(value);
        if (a === 0) return "0";
        if (a >= 1) return sig(value) + " s";
        if (a >= 1e-3) return sig(value * 1e3) + " ms";
        if (a >= 1e-6) return sig(value * 1e6) + " µs";
        return sig(value * 1e9) + " ns";
      }
      case "seconds":
        return Math.abs(value) >= 3600 ? sig(value / 3600) + " h" : sig(value) + " s";
      case "x":
        return sig(value) + "×";
      case "J": {
        const a = Math.abs(value);
        if (a >= 1 || a === 0) return sig(value) + " J";
        if (a >= 1e-3) return sig(value * 1e3) + " mJ";
        if (a >= 1e-6) return sig(value * 1e6) + " µJ";
        if (a >= 1e-9) return sig(value * 1e9) + " nJ";
        return sig(value * 1e12) + " pJ";
      }
      case "day":
        return new Date(value * 86400000).toISOString().slice(0, 10);
      case "count":
        return Number.isInteger(value) ? String(value) : sig(value);
      default:
        return Number.isInteger(value) ? String(value) : sig(value, 4);
    }
  }

  // -- scales --------------------------------------------------------------------------------------------
  function niceStep(span, count) {
    const raw = span / Math.max(1, count);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const norm = raw / mag;
    return (norm >= 5 ? 10 : norm >= 2 ? 5 : norm >= 1 ? 2 : 1) * mag;
  }

  // `tight`: the domain is the data's own range (x axes: M = 1..128 should not run to 150)
  function scale(values, axis, lo, hi, integer, tight) {
    const log = !!axis.log;
    let vs = values.filter((v) => isFinite(v) && (!log || v > 0));
    if (!vs.length) vs = log ? [1, 10] : [0, 1];
    let min = Math.min(...vs), max = Math.max(...vs);
    let ticks = [];
    if (log) {
      let a = Math.floor(Math.log10(min)), b = Math.ceil(Math.log10(max));
      if (a === b) { a -= 1; b += 1; }
      const decades = b - a;
      for (let e = a; e <= b; e++) {
        for (const m of decades <= 2 ? [1, 2, 5] : [1]) {
          const t = m * Math.pow(10, e);
          if (t >= Math.pow(10, a) && t <= Math.pow(10, b)) ticks.push(t);
        }
      }
      min = Math.pow(10, a); max = Math.pow(10, b);
      const f = (v) => lo + (Math.log10(v) - a) / (b - a) * (hi - lo);
      return { f, ticks, min, max };
    }
    if (!tight && min >= 0) min = 0;  // seconds, latencies and speedups read against zero
    if (min === max && integer) {  // one day (or one M): a step either side; ±50% of a day number spans decades
      min -= 1; max += 1;
    } else if (min === max) { min -= Math.abs(min) * 0.5 || (min === 0 ? 0 : 1); max += Math.abs(max) * 0.5 || 1; }
    let step = niceStep(max - min, 6);
    if (integer) step = Math.max(1, Math.round(step));
    const start = tight ? min : Math.floor(min / step) * step, end = tight ? max : Math.ceil(max / step) * step;
    for (let t = Math.ceil(start / step) * step; t <= end + step * 1e-9; t += step) ticks.push(Number(t.toPrecision(12)));
    if (tight && ticks[0] !== start) ticks.unshift(start);  // the first value is worth a label (e.g. M = 1)
    const f = (v) => lo + (v - start) / (end - start || 1) * (hi - lo);
    return { f, ticks, min: start, max: end };
  }

  // -- charts --------------------------------------------------------------------------------------------
  function chart(container, panel) {
    const series = panel.series.filter((s) => s.points.length);
    const xs = [], ys = [];
    for (const s of series) for (const [x, y] of s.points) { xs.push(x); ys.push(y); }
    const integerX = panel.x.unit === "count" || panel.x.unit === "day" || xs.every(Number.isInteger);
    const sx = scale(xs, panel.x, M.left, W - M.right, integerX, true);
    const sy = scale(ys, panel.y, H - M.bottom, M.top, false);
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, class: "kf-chart", role: "img", "aria-label": panel.title,
                            "data-series": series.length, "data-points": xs.length });
    // grid and ticks
    const grid = el("g", { class: "grid" }, svg);
    for (const t of sy.ticks) {
      const y = sy.f(t);
      el("line", { x1: M.left, x2: W - M.right, y1: y, y2: y }, grid);
      el("text", { x: M.left - 6, y: y + 4, "text-anchor": "end", class: "tick y-tick" }, grid).textContent = format(t, panel.y.unit);
    }
    const maxXTicks = 10;
    const every = Math.max(1, Math.ceil(sx.ticks.length / maxXTicks));
    sx.ticks.forEach((t, i) => {
      if (i % every) return;
      const x = sx.f(t);
      el("line", { x1: x, x2: x, y1: M.top, y2: H - M.bottom, class: "vgrid" }, grid);
      const anchor = x <= M.left + 1 ? "start" : x >= W - M.right - 1 ? "end" : "middle";  // edge labels stay inside
      el("text", { x, y: H - M.bottom + 16, "text-anchor": anchor, class: "tick x-tick" }, grid).textContent = format(t, panel.x.unit);
    });
    if (panel.y.unit === "x" && sy.min <= 1 && sy.max >= 1) {  // speedups: the vendor's own level
      el("line", { x1: M.left, x2: W - M.right, y1: sy.f(1), y2: sy.f(1), class: "parity" }, svg);
    }
    el("rect", { x: M.left, y: M.top, width: W - M.left - M.right, height: H - M.top - M.bottom, class: "frame" }, svg);
    el("text", { x: (M.left + W - M.right) / 2, y: H - 8, "text-anchor": "middle", class: "axis-label" }, svg).textContent =
      panel.x.label + (panel.x.log ? " (log)" : "");
    el("text", { x: 14, y: (M.top + H - M.bottom) / 2, "text-anchor": "middle", class: "axis-label",
                 transform: `rotate(-90 14 ${(M.top + H - M.bottom) / 2})` }, svg).textContent =
      panel.y.label + (panel.y.log ? " (log)" : "");

    series.forEach((s, i) => {
      const color = COLORS[i % COLORS.length];
      const g = el("g", { class: "series", "data-name": s.name, "data-n": s.points.length }, svg);
      const pts = s.points.filter(([x, y]) => (!panel.x.log || x > 0) && (!panel.y.log || y > 0))
        .map(([x, y], j) => [sx.f(x), sy.f(y), x, y, j]);
      if (s.mode !== "points" && pts.length > 1) {
        let d = "";
        pts.forEach(([px, py], j) => {
          if (j === 0) d += `M${px},${py}`;
          else if (s.mode === "step") d += `H${px}V${py}`;
          else d += `L${px},${py}`;
        });
        el("path", { d, fill: "none", stroke: color, "stroke-width": s.emphasis ? 3 : 2, class: "line" }, g);
      }
      const r = s.mode === "points" ? (s.emphasis ? 7 : 4) : (pts.length > 60 ? 2 : 3);
      for (const [px, py, x, y, j] of pts) {
        const dot = el("circle", { cx: px, cy: py, r, fill: color, class: s.emphasis ? "pt emphasis" : "pt" }, g);
        const label = s.labels && s.labels[j] ? ` — ${s.labels[j]}` : "";
        el("title", {}, dot).textContent = `${s.name}: ${panel.x.label} ${format(x, panel.x.unit)}, ` +
          `${panel.y.label} ${format(y, panel.y.unit)}${label}`;
      }
    });
    container.appendChild(svg);
    const legend = html("ul", "legend", container);
    series.forEach((s, i) => {
      const item = html("li", "", legend);
      const sw = html("span", "swatch", item);
      sw.dataset.color = String(i % COLORS.length);
      html("span", "", item, `${s.name} (${s.points.length})`);
    });
  }

  // -- tables --------------------------------------------------------------------------------------------
  function cell(td, value, unit) {
    if (value && typeof value === "object" && "href" in value) {
      const a = html("a", "", td, value.text);
      if (String(value.href).startsWith("/dashboard/")) a.href = value.href; // never javascript: or elsewhere
      return;
    }
    td.textContent = format(value, unit);
    if (typeof value === "number") td.className = "num";
  }

  function table(container, panel) {
    const wrap = html("div", "table-wrap", container);
    const t = html("table", "panel-table", wrap);
    const head = html("tr", "", html("thead", "", t));
    for (const c of panel.columns) html("th", "", head, c.name);
    const body = html("tbody", "", t);
    for (const row of panel.rows) {
      const tr = html("tr", "", body);
      row.forEach((v, i) => cell(html("td", "", tr), v, panel.columns[i] ? panel.columns[i].unit : ""));
    }
  }

  function render(container, panel) {
    const box = html("section", "card panel", container);
    box.id = "panel-" + panel.id;
    box.dataset.kind = panel.kind;
    box.dataset.hasData = panel.has_data ? "true" : "false";
    html("h2", "", box, panel.title);
    if (panel.note) html("p", "note", box, panel.note);
    if (!panel.has_data) { html("p", "empty", box, panel.empty); return box; }
    if (panel.kind === "table") table(box, panel);
    else chart(box, panel);
    return box;
  }

  window.KFCharts = { render, format };
})();
