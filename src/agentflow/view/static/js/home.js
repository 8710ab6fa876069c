// The start page when several sources were given: what each one is, and the comparisons on offer.

import { chip, clear, h, section, table } from "af/dom.js";

const KIND = { eval: ["eval run", "run"], train: ["training run", "train"], trajectory: ["trajectory", "trajectory"] };

export async function render(ctx, index) {
  ctx.crumbs([["sources", null]]);
  const rows = index.sources.map((s) =>
    h(
      "tr",
      null,
      h("td", null, chip(KIND[s.kind][0], s.kind)),
      h("td", null, h("a", { href: `#/${KIND[s.kind][1]}/${s.index}` }, s.name)),
      h("td", { class: "muted mono" }, s.path),
    ),
  );
  const comparisons = index.comparisons.map(([a, b]) =>
    h("li", null, h("a", { href: `#/compare/${a}/${b}` }, `${index.sources[a].name} → ${index.sources[b].name}`)),
  );
  clear(ctx.main).append(
    h("h1", null, "agentflow view"),
    section("Sources", table(["kind", "name", "path"], rows)),
    comparisons.length ? section("Comparisons", h("ul", { class: "links" }, comparisons)) : "",
  );
}
