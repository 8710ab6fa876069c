// Two eval runs: accuracy per benchmark side by side (on the items both scored), the items that flipped, and
// a flipped item's two trajectories next to each other.

import { chip, clear, h, section, svg, table } from "af/dom.js";
import { enc, getJSON } from "af/data.js";
import { isNum, pct, short, signedPct } from "af/format.js";
import { itemView } from "af/item.js";
import { outcome } from "af/parts.js";

function pair(a, b) {
  const W = 120,
    H = 22,
    x = (v) => 2 + v * (W - 4);
  return svg(
    "svg",
    {
      class: "pair",
      viewBox: `0 0 ${W} ${H}`,
      width: W,
      height: H,
      role: "img",
      "aria-label": `A ${pct(a)}, B ${pct(b)}`,
    },
    svg("rect", { x: 2, y: 2, width: W - 4, height: 8, class: "ci-track" }),
    isNum(a) ? svg("rect", { x: 2, y: 2, width: x(a) - 2, height: 8, class: "bar-a" }) : "",
    svg("rect", { x: 2, y: 12, width: W - 4, height: 8, class: "ci-track" }),
    isNum(b) ? svg("rect", { x: 2, y: 12, width: x(b) - 2, height: 8, class: "bar-b" }) : "",
  );
}

/** How B's configuration differs from A's (config.json), one setting per line: the adapter, tools, limits... */
function configSection(differences) {
  if (!Array.isArray(differences)) return "";
  return section(
    `Configuration: ${differences.length ? `${differences.length} difference(s), A → B` : "the same"}`,
    differences.length
      ? h(
          "ul",
          { class: "config-diff mono small" },
          differences.map((line) => h("li", null, line)),
        )
      : h("p", { class: "muted" }, "Both runs used the same flow, agent and judge settings."),
  );
}

export async function render(ctx, index, a, b) {
  const data = await getJSON(`/compare/${a}/${b}`);
  if (!ctx.alive()) return;
  const [nameA, nameB] = data.names;
  ctx.crumbs([...(index.home !== `/compare/${a}/${b}` ? [["sources", "#/"]] : []), [`${nameA} vs ${nameB}`, null]]);
  const rows = data.benchmarks.map((c) =>
    h(
      "tr",
      null,
      h("td", null, h("strong", null, c.bench)),
      h("td", { class: "num" }, c.common),
      h("td", { class: "num big a" }, pct(c.a_accuracy)),
      h("td", { class: "num big b" }, pct(c.b_accuracy)),
      h("td", null, pair(c.a_accuracy, c.b_accuracy)),
      h(
        "td",
        { class: `num delta ${c.difference > 0 ? "up" : c.difference < 0 ? "down" : ""}` },
        signedPct(c.difference),
      ),
      h("td", { class: "num" }, c.fixed),
      h("td", { class: "num" }, c.broke),
      h("td", { class: "num" }, isNum(c.mcnemar_p) ? c.mcnemar_p.toPrecision(2) : "–"),
      h("td", { class: "num muted" }, `${c.only_a} / ${c.only_b}`),
    ),
  );
  const flips = {
    fixed: data.flipped.filter((f) => f.direction === "fixed"),
    broke: data.flipped.filter((f) => f.direction === "broke"),
  };
  const flipTable = (list) =>
    table(
      ["", "benchmark / id", "question", `A: ${nameA}`, `B: ${nameB}`, "gold"],
      list.map((f) =>
        h(
          "tr",
          null,
          h("td", null, chip(f.direction, f.direction === "fixed" ? "good" : "bad")),
          h("td", { class: "small" }, f.bench, h("div", { class: "muted mono" }, f.id)),
          h(
            "td",
            { class: "question" },
            h("a", { href: `#/compare/${a}/${b}/item/${enc(f.id)}` }, short(f.question, 200)),
          ),
          h("td", { class: "answer" }, short(f.a, 140)),
          h("td", { class: "answer" }, short(f.b, 140)),
          h("td", { class: "answer gold" }, short(f.gold, 100)),
        ),
      ),
      { cls: "flips" },
    );
  clear(ctx.main).append(
    h("h1", null, "Comparison"),
    h(
      "div",
      { class: "ab" },
      h(
        "div",
        null,
        chip("A", "a"),
        " ",
        h("strong", null, nameA),
        h("div", { class: "muted mono small" }, data.paths[0]),
      ),
      h(
        "div",
        null,
        chip("B", "b"),
        " ",
        h("strong", null, nameB),
        h("div", { class: "muted mono small" }, data.paths[1]),
      ),
    ),
    configSection(data.config_differences),
    section(
      "Accuracy by benchmark, on the items both runs scored",
      table(["benchmark", "items", "A", "B", "", "B − A", "fixed", "broke", "p (McNemar)", "only A / only B"], rows, {
        cls: "summary compare",
        num: [1, 2, 3, 5, 6, 7, 8, 9],
      }),
      h(
        "p",
        { class: "muted small" },
        "fixed: wrong in A, right in B; broke: right in A, wrong in B; p: exact two-sided McNemar test of the flips.",
      ),
    ),
    section(
      `Flipped items (${data.flipped.length})`,
      data.flipped.length
        ? [
            h("h3", null, `fixed in B (${flips.fixed.length})`),
            flipTable(flips.fixed),
            h("h3", null, `broke in B (${flips.broke.length})`),
            flipTable(flips.broke),
          ]
        : h("p", { class: "muted" }, "No item changed its verdict."),
    ),
  );
}

export async function renderItem(ctx, index, a, b, itemId) {
  const data = await getJSON(`/compare/${a}/${b}/item/${enc(itemId)}`);
  if (!ctx.alive()) return;
  const [nameA, nameB] = data.names;
  ctx.crumbs([
    ...(index.home !== `/compare/${a}/${b}` ? [["sources", "#/"]] : []),
    [`${nameA} vs ${nameB}`, `#/compare/${a}/${b}`],
    [itemId, null],
  ]);
  const column = (label, cls, name, payload) =>
    h(
      "div",
      { class: `side ${cls}` },
      h("h2", null, chip(label, cls), " ", name, " ", payload ? outcome(payload.item) : ""),
      payload ? itemView(payload) : h("p", { class: "muted" }, "This run has no result for the item."),
    );
  clear(ctx.main).append(
    h("h1", null, itemId),
    h("div", { class: "side-by-side" }, column("A", "a", nameA, data.a), column("B", "b", nameB, data.b)),
  );
}
