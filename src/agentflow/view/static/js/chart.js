// Line charts in SVG: training curves over steps, several series per chart, values under the pointer.

import { h, svg } from "af/dom.js";
import { num } from "af/format.js";

const W = 420,
  H = 210,
  M = { left: 46, right: 12, top: 12, bottom: 26 };

function niceStep(span, count) {
  const raw = span / Math.max(count, 1);
  const power = 10 ** Math.floor(Math.log10(raw));
  const unit = raw / power;
  return (unit >= 5 ? 10 : unit >= 2 ? 5 : unit >= 1 ? 2 : 1) * power;
}

function ticks(lo, hi, count) {
  const step = niceStep(hi - lo, count);
  const out = [];
  for (let i = Math.ceil(lo / step); i * step <= hi + step * 1e-9; i++) out.push(i * step);
  return { values: out, step };
}

/** Tick labels with as many decimals as the tick step needs (0.005 -> "0.005", 1e-9 -> "1e-9"). */
function tickFormat(step) {
  if (step >= 1e4 || step < 1e-3)
    return (v) =>
      v === 0
        ? "0"
        : v.toExponential(Math.max(0, Math.round(Math.log10(Math.abs(v) / step) + 1e-9))).replace("e+", "e");
  const digits = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  return (v) => v.toFixed(digits);
}

/**
 * series: [{name, cls, points: [[step, value], ...]}]; options: {title, unit: "share" for 0-1 shares,
 * zero: include 0 on the y axis}.
 */
export function lineChart({ title, series, unit = "", zero = false }) {
  series = series.filter((s) => s.points.length);
  const all = series.flatMap((s) => s.points);
  const box = h("figure", { class: "chart" }, h("figcaption", null, title));
  if (!all.length) return box;
  const xs = all.map((p) => p[0]),
    ys = all.map((p) => p[1]);
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (unit === "share") [y0, y1] = [Math.min(0, y0), Math.max(1, y1)];
  if (zero) [y0, y1] = [Math.min(0, y0), Math.max(0, y1)];
  if (y0 === y1) [y0, y1] = [y0 - (Math.abs(y0) || 1) * 0.1, y1 + (Math.abs(y1) || 1) * 0.1];
  if (x0 === x1) [x0, x1] = [x0 - 1, x1 + 1];
  const sx = (x) => M.left + ((x - x0) / (x1 - x0)) * (W - M.left - M.right);
  const sy = (y) => H - M.bottom - ((y - y0) / (y1 - y0)) * (H - M.top - M.bottom);
  const fmt = unit === "share" ? (v) => `${Math.round(v * 100)}%` : (v) => num(v, 3);
  const plot = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "plot", role: "img", "aria-label": title });
  const yTicks = ticks(y0, y1, 4);
  const tickText = unit === "share" ? fmt : tickFormat(yTicks.step);
  for (const v of yTicks.values) {
    plot.append(
      svg("line", { x1: M.left, x2: W - M.right, y1: sy(v), y2: sy(v), class: "grid-line" }),
      svg("text", { x: M.left - 6, y: sy(v) + 4, class: "tick", "text-anchor": "end" }, tickText(v)),
    );
  }
  for (const v of ticks(x0, x1, 6).values.filter(Number.isInteger)) {
    plot.append(svg("text", { x: sx(v), y: H - M.bottom + 16, class: "tick", "text-anchor": "middle" }, String(v)));
  }
  plot.append(svg("line", { x1: M.left, x2: W - M.right, y1: H - M.bottom, y2: H - M.bottom, class: "axis" }));
  for (const s of series) {
    const d = s.points.map(([x, y], i) => `${i ? "L" : "M"}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join("");
    plot.append(svg("path", { d, class: `series ${s.cls}` }));
    if (s.points.length <= 40)
      s.points.forEach(([x, y]) => plot.append(svg("circle", { cx: sx(x), cy: sy(y), r: 2.6, class: `dot ${s.cls}` })));
  }
  const cursor = svg("line", { y1: M.top, y2: H - M.bottom, class: "cursor", visibility: "hidden" });
  const tip = h("div", { class: "tip", hidden: true });
  plot.append(cursor);
  plot.addEventListener("mousemove", (event) => {
    const rect = plot.getBoundingClientRect();
    const x = x0 + ((((event.clientX - rect.left) / rect.width) * W - M.left) / (W - M.left - M.right)) * (x1 - x0);
    const nearest = xs.reduce((best, v) => (Math.abs(v - x) < Math.abs(best - x) ? v : best), xs[0]);
    cursor.setAttribute("x1", sx(nearest));
    cursor.setAttribute("x2", sx(nearest));
    cursor.setAttribute("visibility", "visible");
    tip.replaceChildren(
      h("div", { class: "tip-step" }, `step ${nearest}`),
      ...series.map((s) => {
        const point = s.points.filter((p) => p[0] === nearest).pop();
        return point
          ? h("div", null, h("i", { class: `swatch ${s.cls}` }), `${s.name} `, h("b", null, fmt(point[1])))
          : "";
      }),
    );
    tip.hidden = false;
  });
  plot.addEventListener("mouseleave", () => {
    tip.hidden = true;
    cursor.setAttribute("visibility", "hidden");
  });
  box.append(
    h("div", { class: "plot-wrap" }, plot, tip),
    h(
      "div",
      { class: "legend" },
      series.map((s) => h("span", null, h("i", { class: `swatch ${s.cls}` }), s.name)),
    ),
  );
  return box;
}
