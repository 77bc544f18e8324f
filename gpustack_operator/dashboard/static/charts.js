// gpustack-operator dashboard: the small charts, with their scale. Plain JavaScript, no
// library; loaded before dashboard.js, which calls chart() and powerScale() and provides el().
"use strict";

function svg(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

function present(values) {
  return values.filter((v) => v !== null && v !== undefined);
}

function range(values) {
  const got = present(values);
  return got.length ? { min: Math.min(...got), max: Math.max(...got) } : null;
}

// A small chart with its scale: y labels (top, middle, bottom) in the unit, gridlines, the span
// of time on the x axis, and each series' min–max over that span in the caption.
// series: [{ values, cls, label }]; scale: { lo, hi } of the y axis.
function chart(kind, unit, series, scale, span) {
  const w = 120, h = 40;
  const plot = svg("svg", { class: `chart ${kind}`, viewBox: `0 0 ${w} ${h}`, preserveAspectRatio: "none" });
  for (const y of [1, h / 2, h - 1]) {
    plot.append(svg("line", { class: "grid", x1: 0, x2: w, y1: y, y2: y }));
  }
  const spread = scale.hi - scale.lo || 1;
  for (const { values, cls } of series) {
    const pts = [];
    values.forEach((v, i) => {
      if (v === null || v === undefined) return;
      const x = values.length > 1 ? (i * w) / (values.length - 1) : w;
      const f = Math.min(1, Math.max(0, (v - scale.lo) / spread));
      pts.push(`${x.toFixed(1)},${(h - 1 - f * (h - 2)).toFixed(1)}`);
    });
    // One sample is a level, not a point: drawn across, so the chart never looks empty.
    if (pts.length === 1) pts.unshift(`0,${pts[0].split(",")[1]}`);
    if (pts.length) plot.append(svg("polyline", { class: cls, points: pts.join(" ") }));
  }
  const label = (v) => `${Math.round(v)}${unit}`;
  const caption = series.map(({ values, cls, label: name }) => {
    const r = range(values);
    const spanText = r ? `${Math.round(r.min)}–${Math.round(r.max)}${unit}` : "–";
    return el("span", { class: `key ${cls}` }, `${name} ${spanText}`);
  });
  return el("figure", { class: "spark", "data-chart": kind },
    el("figcaption", {}, ...caption),
    el("div", { class: "plot" },
      el("div", { class: "yaxis" }, el("span", {}, label(scale.hi)),
        el("span", {}, label((scale.hi + scale.lo) / 2)), el("span", {}, label(scale.lo))),
      plot),
    el("div", { class: "xaxis" }, el("span", {}, span), el("span", {}, "now")));
}

// Power has no fixed top: the axis spans the values seen, widened to whole 50 W steps.
function powerScale(values) {
  const r = range(values);
  if (!r) return { lo: 0, hi: 100 };
  const lo = Math.floor(r.min / 50) * 50;
  return { lo, hi: Math.max(lo + 50, Math.ceil(r.max / 50) * 50) };
}
