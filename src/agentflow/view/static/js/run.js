// An eval run: accuracy per benchmark with its interval, the items (filters, search, pages), infrastructure
// failures apart. While the run writes, new result lines are fetched every two seconds and merged.

import { chip, clear, h, section, svg, table } from "af/dom.js";
import { enc, getJSON } from "af/data.js";
import { int, isNum, pct, secs, short } from "af/format.js";
import { outcome, runSettings, toolChips } from "af/parts.js";

const PAGE = 100;
const SORTS = {
  "": ["benchmark order", (a, b) => (a.bench < b.bench ? -1 : a.bench > b.bench ? 1 : a.index - b.index)],
  slowest: ["slowest first", (a, b) => b.seconds - a.seconds],
  tokens: ["most tokens first", (a, b) => b.tokens - a.tokens],
  turns: ["most turns first", (a, b) => b.turns - a.turns],
};

/** The 95% interval as a bar on 0-100%, the point estimate as a tick. */
function intervalBar(accuracy, ci) {
  const W = 160,
    H = 14,
    x = (v) => 2 + v * (W - 4);
  return svg(
    "svg",
    {
      class: "ci",
      viewBox: `0 0 ${W} ${H}`,
      width: W,
      height: H,
      role: "img",
      "aria-label": ci ? `95% interval ${pct(ci[0])} to ${pct(ci[1])}` : "no interval",
    },
    svg("rect", { x: 2, y: 6, width: W - 4, height: 2, class: "ci-track" }),
    ci
      ? svg("rect", { x: x(ci[0]), y: 3, width: Math.max(1, x(ci[1]) - x(ci[0])), height: 8, rx: 2, class: "ci-range" })
      : "",
    isNum(accuracy) ? svg("rect", { x: x(accuracy) - 1, y: 1, width: 2, height: 12, class: "ci-point" }) : "",
  );
}

function summaryTable(benchmarks) {
  const anyF1 = benchmarks.some((b) => isNum(b.mean_f1));
  const anyJudge = benchmarks.some((b) => isNum(b.judge_accuracy));
  const headers = [
    "benchmark",
    "accuracy",
    "95% interval",
    "correct / scored",
    "failed as wrong",
    ...(anyF1 ? ["F1"] : []),
    ...(anyJudge ? ["judge"] : []),
    "infra failed",
    "turns",
    "tokens",
    "s / item",
  ];
  const rows = benchmarks.map((b) =>
    h(
      "tr",
      null,
      h("td", null, h("strong", null, b.bench), b.scorer ? h("span", { class: "muted small" }, ` ${b.scorer}`) : ""),
      h("td", { class: "num big" }, pct(b.accuracy)),
      h(
        "td",
        null,
        intervalBar(b.accuracy, b.accuracy_ci95),
        h(
          "span",
          { class: "muted small" },
          b.accuracy_ci95 ? ` ${pct(b.accuracy_ci95[0], 0)}–${pct(b.accuracy_ci95[1], 0)}` : "",
        ),
      ),
      h("td", { class: "num" }, `${b.correct} / ${b.scored}`),
      h("td", { class: "num" }, pct(b.accuracy_all)),
      anyF1 ? h("td", { class: "num" }, pct(b.mean_f1)) : "",
      anyJudge ? h("td", { class: "num" }, pct(b.judge_accuracy)) : "",
      h(
        "td",
        { class: "num" },
        b.infra_failed ? chip(String(b.infra_failed), "bad") : "0",
        b.pending ? h("span", { class: "muted small" }, ` +${b.pending} not run`) : "",
      ),
      h("td", { class: "num" }, isNum(b.mean_turns) ? b.mean_turns.toFixed(2) : "–"),
      h("td", { class: "num" }, int(b.prompt_tokens + b.completion_tokens)),
      h("td", { class: "num" }, secs(b.mean_item_seconds)),
    ),
  );
  return table(headers, rows, { cls: "summary", num: headers.map((_, i) => i).filter((i) => i !== 0 && i !== 2) });
}

function itemRow(runIndex, r) {
  const href = `#/run/${runIndex}/item/${enc(r.id)}`;
  return h(
    "tr",
    { "data-id": r.id },
    h("td", null, outcome(r)),
    h("td", { class: "small" }, r.bench, h("div", { class: "muted mono" }, r.id)),
    h("td", { class: "question" }, h("a", { href }, short(r.question, 220))),
    h(
      "td",
      { class: "answer" },
      h("div", { class: "pred" }, short(r.prediction, 160) || h("em", { class: "muted" }, "no answer")),
      h("div", { class: "gold" }, "gold ", h("span", null, short(r.gold, 120))),
    ),
    h("td", { class: "num" }, r.turns),
    h("td", null, toolChips(r.tools), r.invalid_tool_turns ? chip(`${r.invalid_tool_turns} invalid`, "warn") : ""),
    h("td", { class: "num" }, secs(r.seconds)),
    h("td", { class: "num" }, int(r.tokens)),
    h(
      "td",
      null,
      r.error
        ? chip(r.error, "bad", r.error_message)
        : r.stop_reason === "timeout" || r.stop_reason === "error"
          ? chip(r.stop_reason, "warn")
          : "",
    ),
  );
}

function matches(r, f) {
  if (f.bench && r.bench !== f.bench) return false;
  if (f.outcome === "correct" && r.correct !== true) return false;
  if (f.outcome === "wrong" && r.correct !== false) return false;
  if (f.tool && !(f.tool in r.tools)) return false;
  if (f.q) {
    const hay = `${r.id}\n${r.question}\n${r.prediction}\n${r.gold}`.toLowerCase();
    if (!f.q.split(/\s+/).every((word) => hay.includes(word))) return false;
  }
  return true;
}

export async function render(ctx, index, runIndex) {
  const route = `/run/${runIndex}`;
  let data = await getJSON(route);
  if (!ctx.alive()) return;
  const byId = new Map();
  // rows come as arrays of values in data.columns order; the later line of an item wins
  const merge = (payload) =>
    payload.rows.forEach((values) => {
      const row = {};
      payload.columns.forEach((column, i) => {
        row[column] = values[i];
      });
      byId.set(row.id, row);
    });
  merge(data);
  const f = {
    q: ctx.params.get("q") || "",
    bench: ctx.params.get("bench") || "",
    outcome: ctx.params.get("outcome") || "",
    tool: ctx.params.get("tool") || "",
    sort: ctx.params.get("sort") || "",
    page: Number(ctx.params.get("page") || 0),
  };
  const multi = index.sources.length > 1;
  ctx.crumbs([...(multi ? [["sources", "#/"]] : []), [data.name, null]]);

  const head = h("div");
  const summary = h("div");
  const failures = h("div", { id: "failures" });
  const tbody = h("tbody");
  const count = h("span", { class: "muted" });
  const pager = h("div", { class: "pager" });
  const benchSelect = h("select", { "aria-label": "benchmark", name: "bench" });
  const toolSelect = h("select", { "aria-label": "tool used", name: "tool" });
  const search = h("input", {
    type: "search",
    name: "q",
    placeholder: "search question, answer, gold, id",
    value: f.q,
    "aria-label": "search",
  });
  const outcomeSelect = h(
    "select",
    { "aria-label": "outcome", name: "outcome" },
    [
      ["", "all scored"],
      ["correct", "correct"],
      ["wrong", "wrong"],
    ].map(([v, l]) => h("option", { value: v }, l)),
  );
  const sortSelect = h(
    "select",
    { "aria-label": "sort", name: "sort" },
    Object.entries(SORTS).map(([v, [l]]) => h("option", { value: v }, l)),
  );
  outcomeSelect.value = f.outcome;
  sortSelect.value = f.sort;

  const options = (select, values, all, chosen) => {
    clear(select).append(h("option", { value: "" }, all), ...values.map((v) => h("option", { value: v }, v)));
    select.value = values.includes(chosen) ? chosen : "";
  };
  const drawHead = () => {
    ctx.live(data.state === "in progress");
    const rows = [...byId.values()];
    const scored = rows.filter((r) => r.status === "scored");
    const correct = scored.filter((r) => r.correct).length;
    clear(head).append(
      h(
        "h1",
        null,
        data.name,
        " ",
        chip(data.state, data.state === "finished" ? "good" : data.state === "in progress" ? "live" : "warn"),
      ),
      h("p", { class: "muted mono" }, data.path),
      h(
        "div",
        { class: "stat-row" },
        h(
          "div",
          { class: "stat" },
          h("b", null, pct(scored.length ? correct / scored.length : null)),
          h("span", null, "accuracy, all benchmarks"),
        ),
        h("div", { class: "stat" }, h("b", null, int(rows.length)), h("span", null, "items with a result")),
        h("div", { class: "stat" }, h("b", null, `${correct} / ${scored.length}`), h("span", null, "correct / scored")),
        h(
          "div",
          { class: "stat" },
          h("b", null, int(rows.length - scored.length)),
          h("span", null, "infrastructure failures"),
        ),
      ),
      runSettings(data.config),
    );
    clear(summary).append(
      data.benchmarks.length ? summaryTable(data.benchmarks) : h("p", { class: "muted" }, "No results yet."),
    );
    options(
      benchSelect,
      data.benchmarks.map((b) => b.bench),
      "all benchmarks",
      f.bench,
    );
    options(toolSelect, [...new Set(rows.flatMap((r) => Object.keys(r.tools)))].sort(), "any tool", f.tool);
  };
  let failuresShown = 20;
  const drawFailures = () => {
    const failed = [...byId.values()].filter((r) => r.status !== "scored");
    clear(failures);
    if (!failed.length) return;
    const more = failed.length - failuresShown;
    failures.append(
      section(
        `Infrastructure failures (${failed.length}) — not counted in accuracy`,
        h(
          "p",
          null,
          Object.entries(data.failure_kinds).map(([kind, n]) => chip(`${kind} ${n}`, "bad")),
        ),
        table(
          ["benchmark", "item", "kind", "message"],
          failed
            .slice(0, failuresShown)
            .map((r) =>
              h(
                "tr",
                null,
                h("td", null, r.bench),
                h("td", null, h("a", { href: `#/run/${runIndex}/item/${enc(r.id)}` }, r.id)),
                h("td", null, chip(r.error || "unknown", "bad")),
                h("td", { class: "small" }, r.error_message || ""),
              ),
            ),
        ),
        more > 0
          ? h(
              "button",
              {
                type: "button",
                class: "unfold",
                onclick: () => {
                  failuresShown += 200;
                  drawFailures();
                },
              },
              `show ${Math.min(more, 200)} more of ${more}`,
            )
          : "",
      ),
    );
  };
  const drawItems = () => {
    f.q = search.value.trim().toLowerCase();
    Object.assign(f, {
      bench: benchSelect.value,
      outcome: outcomeSelect.value,
      tool: toolSelect.value,
      sort: sortSelect.value,
    });
    const shown = [...byId.values()].filter((r) => r.status === "scored" && matches(r, f)).sort(SORTS[f.sort][1]);
    const pages = Math.max(1, Math.ceil(shown.length / PAGE));
    f.page = Math.min(f.page, pages - 1);
    clear(tbody).append(...shown.slice(f.page * PAGE, (f.page + 1) * PAGE).map((r) => itemRow(runIndex, r)));
    const scored = [...byId.values()].filter((r) => r.status === "scored").length;
    count.textContent = `${shown.length.toLocaleString()} of ${scored.toLocaleString()} scored items`;
    clear(pager);
    if (pages > 1) {
      const go = (p) => () => {
        f.page = p;
        drawItems();
      };
      pager.append(
        h("button", { type: "button", onclick: go(f.page - 1), disabled: f.page === 0 }, "‹ previous"),
        h("span", null, ` page ${f.page + 1} of ${pages} `),
        h("button", { type: "button", onclick: go(f.page + 1), disabled: f.page >= pages - 1 }, "next ›"),
      );
    }
    ctx.setParams({
      q: search.value.trim(),
      bench: f.bench,
      outcome: f.outcome,
      tool: f.tool,
      sort: f.sort,
      page: f.page || "",
    });
  };
  const reset = () => {
    f.page = 0;
    drawItems();
  };
  let timer = null;
  search.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(reset, 120);
  });
  [benchSelect, outcomeSelect, toolSelect, sortSelect].forEach((s) => s.addEventListener("change", reset));

  drawHead();
  drawFailures();
  clear(ctx.main).append(
    head,
    section(
      "Accuracy by benchmark",
      summary,
      h(
        "p",
        { class: "muted small" },
        "Accuracy over scored items; the bar is the 95% Wilson interval. " +
          'Infrastructure failures are not counted ("failed as wrong" counts them).',
      ),
    ),
    section(
      "Items",
      h("div", { class: "filters" }, search, benchSelect, outcomeSelect, toolSelect, sortSelect, count),
      table(["", "benchmark / id", "question", "answer vs gold", "turns", "tools", "time", "tokens", "failure"], [], {
        cls: "items",
        num: [4, 6, 7],
      }),
      pager,
    ),
    failures,
  );
  ctx.main.querySelector("table.items").replaceChild(tbody, ctx.main.querySelector("table.items tbody"));
  drawItems();

  ctx.every(async () => {
    const next = await getJSON(route, { after: data.lines, generation: data.generation });
    if (next.generation !== data.generation || next.from === 0) byId.clear();
    const changed = next.rows.length > 0 || next.state !== data.state;
    merge(next);
    data = next;
    if (!changed) return;
    drawHead();
    drawFailures();
    drawItems();
  });
}
