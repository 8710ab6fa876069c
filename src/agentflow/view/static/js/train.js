// A training run: the curves the trainer logs (followed while it trains), the steps with their rollouts, and
// the held-out evaluations.

import { chip, clear, facts, h, section, table } from "af/dom.js";
import { getJSON } from "af/data.js";
import { isNum, num, pct } from "af/format.js";
import { lineChart } from "af/chart.js";
import { toolClass } from "af/parts.js";

const SKIP = new Set(["step", "time"]);

/** A metric every trained role logs: the planner's unprefixed (`entropy`), another role's as `executor/entropy`;
 * one series each, the planner's under `label`, another's under "ROLE label". */
function perRole(metric, label) {
  const pattern = new RegExp(`^(?:(executor|verifier|generator)/)?${metric}$`);
  return (k) => {
    const m = k.match(pattern);
    return m ? (m[1] ? `${m[1]} ${label}` : label) : null;
  };
}

/** Chart groups, in order: [title, test(key) -> series name or null, options]. */
const GROUPS = [
  [
    "Reward and accuracy",
    (k) =>
      ({ reward_mean: "rollout reward", accuracy: "rollout accuracy", "eval/accuracy_all": "held-out accuracy" })[k],
    { unit: "share", order: ["reward_mean", "accuracy", "eval/accuracy_all"] },
  ],
  ["Held-out accuracy by kind", (k) => k.match(/^eval\/accuracy\/(.+)$/)?.[1], { unit: "share" }],
  [
    "KL divergence",
    (k) => perRole("kl_ref", "KL to reference (k3)")(k) ?? perRole("approx_kl", "KL to rollout policy")(k),
    { zero: true, order: ["kl_ref", "approx_kl"] },
  ],
  ["Entropy", perRole("entropy", "entropy"), {}],
  ["Clip fraction", perRole("clip_fraction", "clipped tokens"), { unit: "share" }],
  ["Gradient norm", perRole("grad_norm", "grad norm"), { zero: true }],
  [
    "Groups without signal, excluded trajectories",
    (k) => ({ no_signal_share: "groups without signal", excluded_share: "excluded (infrastructure)" })[k],
    { unit: "share", order: ["no_signal_share", "excluded_share"] },
  ],
  [
    "Tool choice (share of planner turns)",
    (k) => k.match(/^tool\/(?!turn\d+\/)(.+)$/)?.[1],
    { unit: "share", tools: true },
  ],
  ["Seconds per phase", (k) => k.match(/^seconds\/(.+)$/)?.[1], { zero: true }],
];
const PER_TURN = /^tool\/turn(\d+)\/(.+)$/;
const MENU_POSITION = /^menu_position\/turn(\d+)\/(\d+)$/;

function seriesFrom(records, keys, order = [], family = false) {
  keys = [...keys].sort((a, b) => (order.indexOf(a[0]) + 1 || 99) - (order.indexOf(b[0]) + 1 || 99));
  // a tool family: a step that logged any tool's share and not this one's means 0 (not picked), as
  // `agentflow train plot` draws it; runs written before zeros were recorded would otherwise stop the line
  const logged = family ? records.filter((r) => keys.some(([k]) => isNum(r[k]))) : null;
  return keys.map(([key, name], i) => ({
    name,
    key,
    cls: `c${i % 8}`,
    points: family
      ? logged.map((r) => [r.step, isNum(r[key]) ? r[key] : 0])
      : records.filter((r) => isNum(r[key])).map((r) => [r.step, r[key]]),
  }));
}

export function charts(records) {
  const keys = [...new Set(records.flatMap(Object.keys))].filter(
    (k) => !SKIP.has(k) && records.some((r) => isNum(r[k])),
  );
  const used = new Set();
  const out = [];
  for (const [title, name, options] of GROUPS) {
    const chosen = keys.filter((k) => name(k)).map((k) => [k, name(k)]);
    if (!chosen.length) continue;
    chosen.forEach(([k]) => used.add(k));
    const series = seriesFrom(records, chosen, options.order, Boolean(options.tools));
    if (options.tools)
      series.forEach((s) => {
        s.cls = toolClass(s.name);
      });
    out.push(lineChart({ title, series, ...options }));
  }
  const turns = new Map();
  keys.forEach((k) => {
    const m = k.match(PER_TURN);
    if (m) {
      used.add(k);
      turns.set(Number(m[1]), [...(turns.get(Number(m[1])) || []), [k, m[2]]]);
    }
  });
  [...turns.keys()]
    .sort((a, b) => a - b)
    .forEach((turn) => {
      const series = seriesFrom(records, turns.get(turn), [], true);
      series.forEach((s) => {
        s.cls = toolClass(s.name);
      });
      out.push(lineChart({ title: `Tool choice at turn ${turn}`, series, unit: "share" }));
    });
  // where the menu listed the pick (1 = first): a planner that follows the order it is shown picks by position
  const positions = new Map();
  keys.forEach((k) => {
    const m = k.match(MENU_POSITION);
    if (m) {
      used.add(k);
      positions.set(Number(m[1]), [...(positions.get(Number(m[1])) || []), [k, `listed ${m[2]}`, Number(m[2])]]);
    }
  });
  [...positions.keys()]
    .sort((a, b) => a - b)
    .forEach((turn) => {
      const chosen = positions.get(turn).sort((a, b) => a[2] - b[2]);
      const series = seriesFrom(records, chosen, [], true);
      out.push(lineChart({ title: `Menu position of the pick at turn ${turn}`, series, unit: "share" }));
    });
  const rest = keys.filter((k) => !used.has(k));
  return { main: out, more: rest.map((k) => lineChart({ title: k, series: seriesFrom(records, [[k, k]]) })) };
}

function configFacts(config) {
  const flow = config.flow || {};
  const policy = flow.engines?.[flow.roles?.planner?.engine] || {};
  return facts([
    ["algorithm", config.algorithm],
    [
      "planner",
      [
        policy.kind,
        String(policy.model_path || policy.model || "bundled SmolLM2-135M")
          .split("/")
          .pop(),
      ].join(" · ") + (policy.adapter ? ` + adapter ${policy.adapter}` : ""),
    ],
    ["B × G", isNum(config.batch_size) ? `${config.batch_size} questions × ${config.group_size} trajectories` : ""],
    ["steps", config.max_steps],
    ["learning rate", config.learning_rate],
    ["KL coefficient", config.kl_coef],
    ["advantage", config.advantage],
    ["LoRA", config.lora ? (config.lora.enabled === false ? "off" : `rank ${config.lora.rank}`) : ""],
    ["tools", Object.keys(flow.tools || {}).join(", ")],
  ]);
}

export async function render(ctx, index, runIndex) {
  const route = `/train/${runIndex}`;
  let data = await getJSON(route);
  if (!ctx.alive()) return;
  let records = data.metrics;
  ctx.crumbs([...(index.sources.length > 1 ? [["sources", "#/"]] : []), [data.name, null]]);
  const head = h("div"),
    curves = h("div", { class: "charts" }),
    more = h("div", { class: "charts" });
  const steps = h("div"),
    evals = h("div");
  const draw = () => {
    ctx.live(data.idle_seconds !== null && data.idle_seconds < 120);
    const lastStep = records.reduce((m, r) => Math.max(m, r.step), 0);
    const rewards = records.filter((r) => isNum(r.reward_mean));
    const last = { step: lastStep, reward_mean: rewards.length ? rewards[rewards.length - 1].reward_mean : null };
    const heldOut = records.filter((r) => isNum(r["eval/accuracy_all"]));
    clear(head).append(
      h("h1", null, data.name, " ", chip("training run", "train")),
      h("p", { class: "muted mono" }, data.path),
      h(
        "div",
        { class: "stat-row" },
        h(
          "div",
          { class: "stat" },
          h("b", null, String(last.step ?? 0)),
          h("span", null, `last step${isNum(data.config.max_steps) ? ` (of ${data.config.max_steps})` : ""}`),
        ),
        h("div", { class: "stat" }, h("b", null, num(last.reward_mean)), h("span", null, "last rollout reward")),
        h(
          "div",
          { class: "stat" },
          h(
            "b",
            null,
            heldOut.length
              ? pct(heldOut[0]["eval/accuracy_all"]) + " → " + pct(heldOut[heldOut.length - 1]["eval/accuracy_all"])
              : "–",
          ),
          h("span", null, "held-out accuracy, first → last"),
        ),
      ),
      configFacts(data.config),
    );
    const { main, more: rest } = charts(records);
    clear(curves).append(...(main.length ? main : [h("p", { class: "muted" }, "No metrics yet.")]));
    clear(more).append(...rest);
    const byStep = new Map();
    records.forEach((r) => byStep.set(r.step, { ...(byStep.get(r.step) || {}), ...r }));
    clear(steps).append(
      data.steps.length
        ? table(
            ["step", "rollout reward", "rollout accuracy", "groups without signal", "KL", "seconds", ""],
            [...data.steps].reverse().map((s) => {
              const m = byStep.get(s) || {};
              return h(
                "tr",
                null,
                h("td", { class: "num" }, s),
                h("td", { class: "num" }, num(m.reward_mean)),
                h("td", { class: "num" }, pct(m.accuracy)),
                h("td", { class: "num" }, pct(m.no_signal_share)),
                h("td", { class: "num" }, num(m.kl_ref)),
                h("td", { class: "num" }, num(m["seconds/step"])),
                h("td", null, h("a", { href: `#/train/${runIndex}/step/${s}` }, "rollout groups")),
              );
            }),
            { num: [0, 1, 2, 3, 4, 5] },
          )
        : h("p", { class: "muted" }, "No rollouts written yet."),
    );
    clear(evals).append(
      data.evals.length
        ? table(
            ["evaluation", "step", "held-out accuracy", "questions", "infrastructure failures"],
            data.evals.map((e) =>
              h(
                "tr",
                null,
                h("td", null, h("a", { href: `#/train/${runIndex}/eval/${encodeURIComponent(e.label)}` }, e.label)),
                h("td", { class: "num" }, e.step),
                h("td", { class: "num big" }, pct(e.accuracy)),
                h("td", { class: "num" }, e.questions),
                h("td", { class: "num" }, e.infrastructure),
              ),
            ),
            { num: [1, 2, 3, 4] },
          )
        : h("p", { class: "muted" }, "No held-out evaluation yet."),
    );
  };
  draw();
  clear(ctx.main).append(
    head,
    section("Curves", curves),
    h("details", { class: "block" }, h("summary", null, "all other metrics"), more),
    section("Held-out evaluations", evals),
    section("Steps", steps),
    h(
      "details",
      { class: "block" },
      h("summary", null, "config.json"),
      h("pre", { class: "text" }, JSON.stringify(data.config, null, 2)),
    ),
  );
  ctx.every(async () => {
    const next = await getJSON(route, { after: data.lines, generation: data.generation });
    const changed =
      next.metrics.length || next.steps.length !== data.steps.length || next.evals.length !== data.evals.length;
    records = next.generation !== data.generation || next.from === 0 ? next.metrics : records.concat(next.metrics);
    data = next;
    if (changed) draw();
  });
}
