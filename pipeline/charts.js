// rlpipe's charts: inline SVG drawn from plain arrays, no library, nothing fetched.
// Used by the server's live page (GET /) and by `rlpipe inspect --html` (pipeline/charts.py).
"use strict";
const RlCharts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const W = 480, H = 190, L = 52, R = 26, T = 10, B = 30;

  function node(tag, attrs, parent, text) {
    const element = document.createElementNS(NS, tag);
    for (const [key, value] of Object.entries(attrs)) element.setAttribute(key, value);
    if (text !== undefined) element.textContent = text;
    if (parent) parent.appendChild(element);
    return element;
  }

  // about n round numbers between lo and hi (1, 2 or 5 times a power of ten apart)
  function ticks(lo, hi, n) {
    if (!(hi > lo)) return [lo];
    const raw = (hi - lo) / n, power = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
    return out;
  }

  function number(v) {
    const a = Math.abs(v);
    if (a >= 1e6) return (v / 1e6).toFixed(a >= 1e7 ? 0 : 1) + "M";
    if (a >= 1e4) return (v / 1e3).toFixed(0) + "k";
    if (a >= 100 || Number.isInteger(v)) return v.toFixed(0);
    return String(parseFloat(v.toPrecision(3)));
  }

  function clock(seconds) {
    return new Date(seconds * 1000).toTimeString().slice(0, 8);
  }

  function range(values, zero) {
    let lo = zero ? 0 : Infinity, hi = zero ? 0 : -Infinity;
    for (const v of values) if (Number.isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    if (!Number.isFinite(lo)) return [0, 1];
    if (hi === lo) return zero && lo === 0 ? [0, 1] : [lo - 1, hi + 1];
    return [lo, hi + (hi - lo) * 0.05];
  }

  function frame(target, xs, ys, opts) {
    const svg = node("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", class: "rl-chart" });
    if (opts.title) node("title", {}, svg, opts.title);
    const [x0, x1] = xs, [y0, y1] = ys;
    const sx = (x) => L + ((x - x0) / (x1 - x0 || 1)) * (W - L - R);
    const sy = (y) => H - B - ((y - y0) / (y1 - y0 || 1)) * (H - T - B);
    for (const y of ticks(y0, y1, 4)) {
      node("line", { x1: L, x2: W - R, y1: sy(y), y2: sy(y), class: "rl-grid" }, svg);
      node("text", { x: L - 6, y: sy(y) + 4, "text-anchor": "end", class: "rl-tick" }, svg,
        number(y));
    }
    let xt = opts.xticks || ticks(x0, x1, 4);
    if (opts.integer) xt = xt.filter(Number.isInteger);
    for (const x of xt) {
      node("text", { x: sx(x), y: H - B + 16, "text-anchor": "middle", class: "rl-tick" }, svg,
        opts.time ? clock(x) : number(x));
    }
    node("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "rl-axis" }, svg);
    if (opts.ylabel) {
      node("text", { x: 12, y: (H - B + T) / 2, class: "rl-label",
        transform: `rotate(-90 12 ${(H - B + T) / 2})`, "text-anchor": "middle" }, svg,
        opts.ylabel);
    }
    if (opts.xlabel) {
      node("text", { x: W - R, y: H - 2, "text-anchor": "end", class: "rl-label" }, svg,
        opts.xlabel);
    }
    target.replaceChildren(svg);
    return { svg, sx, sy };
  }

  function empty(target, message) {
    const svg = node("svg", { viewBox: `0 0 ${W} ${H}`, class: "rl-chart" });
    node("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "rl-empty" }, svg, message);
    target.replaceChildren(svg);
  }

  // series: [{label, color, points: [[x, y], ...], band: [[x, lo, hi], ...], dots}]
  // opts: {title, xlabel, ylabel, time (x in unix seconds), zero (y from 0), xrange: [lo, hi],
//        integer (x ticks on whole numbers only), empty (the message while there is no data)}
  function line(target, series, opts = {}) {
    const xsAll = [], ysAll = [];
    for (const s of series) {
      for (const [x, y] of s.points || []) { xsAll.push(x); ysAll.push(y); }
      for (const [x, lo, hi] of s.band || []) { xsAll.push(x); ysAll.push(lo, hi); }
    }
    if (!xsAll.length) return empty(target, opts.empty || "no data yet");
    const xs = opts.xrange || [Math.min(...xsAll), Math.max(...xsAll)];
    if (xs[1] === xs[0]) { xs[0] -= 1; xs[1] += 1; }
    const { svg, sx, sy } = frame(target, xs, range(ysAll, opts.zero), opts);
    series.forEach((s, i) => {
      const color = s.color || PALETTE[i % PALETTE.length];
      if (s.band && s.band.length) {
        const top = s.band.map(([x, , hi]) => `${sx(x)},${sy(hi)}`);
        const bottom = s.band.map(([x, lo]) => `${sx(x)},${sy(lo)}`).reverse();
        node("polygon", { points: top.concat(bottom).join(" "), fill: color,
          "fill-opacity": 0.18, stroke: "none", class: "rl-band" }, svg);
      }
      const points = s.points || [];
      if (s.dots) {
        for (const [x, y] of points) node("circle", { cx: sx(x), cy: sy(y), r: 2.2, fill: color,
          class: "rl-dot" }, svg);
      } else if (points.length) {
        node("polyline", { points: points.map(([x, y]) => `${sx(x)},${sy(y)}`).join(" "),
          fill: "none", stroke: color, "stroke-width": 2, class: "rl-line" }, svg);
      }
    });
    legend(svg, series);
    return svg;
  }

  function legend(svg, series) {
    let x = L + 8;
    series.forEach((s, i) => {
      if (!s.label) return;
      const color = s.color || PALETTE[i % PALETTE.length];
      node("rect", { x, y: T + 2, width: 10, height: 10, fill: color }, svg);
      const text = node("text", { x: x + 14, y: T + 11, class: "rl-legend" }, svg, s.label);
      x += 22 + 6.5 * s.label.length;
      return text;
    });
  }

  // bars: labels (categories or bin starts) and their values
  function bars(target, labels, values, opts = {}) {
    if (!values.length) return empty(target, opts.empty || "no data yet");
    const n = values.length;
    const xticks = n <= 12 ? labels.map((_, i) => i) : ticks(0, n - 1, 5).map(Math.round);
    const shown = { ...opts, xticks: [] };
    const { svg, sx, sy } = frame(target, [-0.5, n - 0.5], range(values, true), shown);
    const width = Math.max(1, sx(1) - sx(0) - 2);
    values.forEach((v, i) => {
      node("rect", { x: sx(i) - width / 2, y: sy(v), width, height: Math.max(0, sy(0) - sy(v)),
        fill: opts.color || PALETTE[0], class: "rl-bar" }, svg, undefined);
    });
    for (const i of xticks) {
      node("text", { x: sx(i), y: H - B + 16, "text-anchor": "middle", class: "rl-tick" }, svg,
        String(labels[i]));
    }
    return svg;
  }

  const PALETTE = ["#2563eb", "#ea580c", "#16a34a", "#9333ea", "#dc2626", "#0891b2"];
  return { line, bars, number, clock, PALETTE };
})();
