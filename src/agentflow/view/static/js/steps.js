// One training step's rollout groups (the G trajectories of each question, their rewards, the advantage each
// planner turn received), one rollout's trajectory, and one held-out evaluation.

import { chip, clear, fold, h, message, section, table } from "af/dom.js";
import { enc, getJSON } from "af/data.js";
import { isNum, num, pct, short, signed } from "af/format.js";
import { outcome, toolClass } from "af/parts.js";
import { renderTrajectory } from "af/trajectory.js";

function crumbs(ctx, index, runIndex, name, ...rest) {
  ctx.crumbs([...(index.sources.length > 1 ? [["sources", "#/"]] : []), [name, `#/train/${runIndex}`], ...rest]);
}

function rewardChip(reward, infrastructure) {
  if (infrastructure) return chip(`excluded: ${infrastructure}`, "bad");
  if (!isNum(reward)) return chip("no reward", "warn");
  return chip(num(reward), reward >= 1 ? "good" : reward > 0 ? "warn" : "neutral");
}

/** Each planner turn: the tool it chose and the advantage it received (when the trainer recorded it). */
function turnsCell(rollout) {
  const n = Math.max(rollout.tools.length, rollout.advantages ? rollout.advantages.length : 0);
  const cells = [];
  for (let i = 0; i < n; i++) {
    const tool = rollout.tools[i];
    const advantage = rollout.advantages ? rollout.advantages[i] : undefined;
    cells.push(
      h(
        "span",
        { class: "turn-cell" },
        h("span", { class: "muted small" }, `${i + 1}`),
        tool ? chip(tool, `tool ${toolClass(tool)}`) : chip("no tool", "bad"),
        isNum(advantage)
          ? h(
              "span",
              {
                class: `adv ${advantage > 0 ? "up" : advantage < 0 ? "down" : ""}`,
                title: "advantage of this planner turn",
              },
              signed(advantage),
            )
          : "",
      ),
    );
  }
  return cells.length ? cells : h("span", { class: "muted" }, "no turns");
}

function groupCard(runIndex, step, group) {
  const recorded = group.rollouts.some((r) => r.advantages);
  return h(
    "article",
    { class: "group" },
    h(
      "header",
      null,
      h("p", { class: "question-text" }, group.question),
      h(
        "div",
        { class: "meta-strip" },
        h("span", null, "gold ", h("b", null, group.gold)),
        h("span", null, `mean reward ${num(group.reward_mean)}`),
        h("span", null, `std ${num(group.reward_std)}`),
        group.signal ? chip("learning signal", "good") : chip("no signal: all rewards equal", "neutral"),
        h("span", { class: "muted mono small" }, group.group),
      ),
    ),
    table(
      [
        "#",
        "reward",
        recorded ? "turns: tool and advantage" : "turns (advantages not recorded by this trainer)",
        "answer",
        "planner replies",
        "",
      ],
      group.rollouts.map((r) =>
        h(
          "tr",
          { class: r.infrastructure ? "excluded" : "" },
          h("td", { class: "num" }, r.index),
          h("td", null, rewardChip(r.reward, r.infrastructure)),
          h("td", { class: "turns" }, turnsCell(r)),
          h("td", { class: "answer" }, short(r.answer, 160)),
          h(
            "td",
            null,
            r.planner.length
              ? h(
                  "details",
                  null,
                  h("summary", null, `${r.planner.length} repl${r.planner.length > 1 ? "ies" : "y"}`),
                  r.planner.map((text, i) =>
                    h(
                      "div",
                      { class: "message" },
                      h("div", { class: "role" }, `turn ${i + 1}`),
                      fold(text, { lines: 6 }),
                    ),
                  ),
                )
              : "",
          ),
          h(
            "td",
            null,
            r.failure
              ? chip(
                  String(r.failure.kind || r.failure),
                  r.failure.infrastructure ? "bad" : "warn",
                  r.failure.message || null,
                )
              : "",
            r.has_trajectory
              ? h("a", { href: `#/train/${runIndex}/step/${step}/rollout/${enc(r.id)}` }, "trajectory")
              : "",
          ),
        ),
      ),
      { cls: "rollouts", num: [0] },
    ),
  );
}

export async function renderStep(ctx, index, runIndex, step) {
  const data = await getJSON(`/train/${runIndex}/step/${step}`);
  if (!ctx.alive()) return;
  crumbs(ctx, index, runIndex, data.run, [`step ${step}`, null]);
  const m = data.metrics;
  const signal = data.groups.filter((g) => g.signal).length;
  const at = data.steps.indexOf(Number(step));
  const near = (i, label) =>
    i >= 0 && i < data.steps.length ? h("a", { href: `#/train/${runIndex}/step/${data.steps[i]}` }, label) : "";
  clear(ctx.main).append(
    h("h1", null, `Step ${step}`, h("span", { class: "step-nav" }, near(at - 1, "‹ previous"), near(at + 1, "next ›"))),
    h(
      "div",
      { class: "stat-row" },
      h("div", { class: "stat" }, h("b", null, num(m.reward_mean)), h("span", null, "rollout reward")),
      h(
        "div",
        { class: "stat" },
        h("b", null, `${signal} / ${data.groups.length}`),
        h("span", null, "groups with a learning signal"),
      ),
      h("div", { class: "stat" }, h("b", null, num(m.kl_ref)), h("span", null, "KL to reference")),
      h("div", { class: "stat" }, h("b", null, num(m.loss)), h("span", null, "loss")),
    ),
    section(
      `Rollout groups (${data.groups.length})`,
      data.groups.map((g) => groupCard(runIndex, step, g)),
    ),
  );
}

export async function renderRollout(ctx, index, runIndex, step, rolloutId) {
  const data = await getJSON(`/train/${runIndex}/step/${step}/rollout/${enc(rolloutId)}`);
  if (!ctx.alive()) return;
  crumbs(ctx, index, runIndex, data.run, [`step ${step}`, `#/train/${runIndex}/step/${step}`], [rolloutId, null]);
  const r = data.row;
  clear(ctx.main).append(
    h("h1", null, rolloutId, " ", rewardChip(r.reward, r.infrastructure)),
    h("div", { class: "meta-strip" }, h("span", null, "turns: "), turnsCell(r)),
    data.trajectory
      ? renderTrajectory(data.trajectory, {
          gold: data.gold,
          correct: isNum(r.reward) && !r.infrastructure ? r.reward >= 1 : null,
        })
      : message(data.trajectory_problem, "muted"),
  );
}

export async function renderEval(ctx, index, runIndex, label) {
  const data = await getJSON(`/train/${runIndex}/eval/${enc(label)}`);
  if (!ctx.alive()) return;
  crumbs(ctx, index, runIndex, data.run, [`held-out ${label}`, null]);
  const correct = data.rows.filter((r) => r.correct).length;
  clear(ctx.main).append(
    h("h1", null, `Held-out evaluation ${label}`),
    h(
      "p",
      { class: "big" },
      `${pct(data.rows.length ? correct / data.rows.length : null)} `,
      h("span", { class: "muted" }, `${correct} of ${data.rows.length} correct`),
    ),
    table(
      ["", "id", "question", "answer vs gold", "tools"],
      data.rows.map((r) =>
        h(
          "tr",
          null,
          h(
            "td",
            null,
            r.infrastructure ? chip(r.infrastructure, "bad") : outcome({ status: "scored", correct: r.correct }),
          ),
          h("td", { class: "mono small" }, r.id),
          h("td", { class: "question" }, short(r.question, 220)),
          h(
            "td",
            { class: "answer" },
            h("div", { class: "pred" }, short(r.answer, 160)),
            h("div", { class: "gold" }, "gold ", h("span", null, r.gold)),
          ),
          h(
            "td",
            null,
            r.tools.map((t) => chip(t ?? "none", `tool ${toolClass(t)}`)),
          ),
        ),
      ),
      { cls: "items" },
    ),
  );
}
