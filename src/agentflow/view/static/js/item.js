// An eval item with its trajectory, and a trajectory file given on the command line.

import { chip, clear, h, message } from "af/dom.js";
import { enc, getJSON } from "af/data.js";
import { goldText } from "af/format.js";
import { outcome } from "af/parts.js";
import { itemFacts, renderTrajectory } from "af/trajectory.js";

/** The item's facts and trajectory; used on its own page and, twice, side by side in a comparison. */
export function itemView(payload) {
  const item = payload.item;
  const known = { gold: goldText(item.gold), correct: item.status === "scored" ? item.correct : null };
  return h(
    "div",
    { class: "item-view" },
    item.status !== "scored"
      ? h(
          "div",
          { class: "failure-box" },
          chip("infrastructure failure", "bad"),
          " not counted in accuracy: ",
          item.error ? `${item.error.kind}: ${item.error.message}` : "unknown",
        )
      : "",
    itemFacts(item),
    payload.trajectory
      ? renderTrajectory(payload.trajectory, known)
      : [
          message(payload.trajectory_problem || "no trajectory", "error-text"),
          h(
            "div",
            { class: "outcome-box" },
            h("div", null, h("div", { class: "label" }, "answer"), item.prediction),
            h("div", null, h("div", { class: "label" }, "gold"), known.gold),
          ),
        ],
  );
}

export async function renderItem(ctx, index, runIndex, itemId) {
  const payload = await getJSON(`/run/${runIndex}/item/${enc(itemId)}`);
  if (!ctx.alive()) return;
  const multi = index.sources.length > 1;
  ctx.crumbs([...(multi ? [["sources", "#/"]] : []), [payload.run, `#/run/${runIndex}`], [itemId, null]]);
  clear(ctx.main).append(h("h1", null, outcome(payload.item), " ", itemId), itemView(payload));
}

export async function renderFile(ctx, index, fileIndex) {
  const payload = await getJSON(`/trajectory/${fileIndex}`);
  if (!ctx.alive()) return;
  const multi = index.sources.length > 1;
  ctx.crumbs([...(multi ? [["sources", "#/"]] : []), [payload.name, null]]);
  clear(ctx.main).append(
    h("h1", null, payload.name),
    h("p", { class: "muted mono" }, payload.path),
    payload.trajectory ? renderTrajectory(payload.trajectory) : message(payload.trajectory_problem, "error-text"),
  );
}
