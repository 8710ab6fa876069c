// Small pieces several pages use: outcome marks, tool chips, an engine call's settings, a run's settings.

import { chip, facts, h } from "af/dom.js";
import { int, isNum, num, secs } from "af/format.js";

/** ✓ / ✗ / ⚠ for a result row ({status, correct}). */
export function outcome(r) {
  if (r.status && r.status !== "scored")
    return h("span", { class: "mark failed", title: "infrastructure failure" }, "⚠");
  if (r.correct === true) return h("span", { class: "mark correct", title: "correct" }, "✓");
  if (r.correct === false) return h("span", { class: "mark wrong", title: "wrong" }, "✗");
  return h("span", { class: "mark", title: "not scored" }, "·");
}

/** {python: 2} or ["python", "python"] -> chips "python ×2". */
export function toolChips(tools) {
  const counts = Array.isArray(tools)
    ? tools.reduce((acc, t) => ({ ...acc, [t ?? "none"]: (acc[t ?? "none"] || 0) + 1 }), {})
    : tools || {};
  return Object.entries(counts).map(([name, n]) => chip(n > 1 ? `${name} ×${n}` : name, `tool ${toolClass(name)}`));
}

const PALETTE = ["c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7"];
const assigned = new Map();
/** The same tool gets the same color on every page and chart. */
export function toolClass(name) {
  if (!assigned.has(name)) assigned.set(name, PALETTE[assigned.size % PALETTE.length]);
  return assigned.get(name);
}

/** engine · model · T · top-p · max tokens · seed · tokens in→out · time · finish reason, of one LLMCall. */
export function callMeta(call) {
  if (!call) return "";
  const engine = call.engine || {};
  const sampling = call.sampling || {};
  const done = call.completion || {};
  const model = String(engine.model || done.model || "")
    .split("/")
    .pop();
  const parts = [
    chip(engine.engine || engine.kind || "engine", "engine", JSON.stringify(engine)),
    model ? h("span", { class: "mono" }, model) : "",
    h("span", null, `T ${num(sampling.temperature)}`),
    isNum(sampling.top_p) && sampling.top_p !== 1 ? h("span", null, `top-p ${num(sampling.top_p)}`) : "",
    h("span", null, `max ${int(sampling.max_tokens)}`),
    sampling.seed !== null && sampling.seed !== undefined ? h("span", null, `seed ${sampling.seed}`) : "",
    call.json_schema ? chip("schema-constrained", "info") : "",
    h("span", null, `${int(done.prompt_tokens)} → ${int(done.completion_tokens)} tok`),
    h("span", null, secs(call.seconds)),
    done.finish_reason && done.finish_reason !== "stop" ? chip(`finish: ${done.finish_reason}`, "warn") : "",
  ];
  return h("div", { class: "call-meta" }, parts);
}

/** The prompt as sent and the reply as received, folded. */
export function callDetails(call, label = "prompt and reply") {
  if (!call) return "";
  const messages = (call.messages || []).map((m) =>
    h(
      "div",
      { class: "message" },
      h("div", { class: "role" }, m.role),
      h("pre", { class: "text" }, typeof m.content === "string" ? m.content : JSON.stringify(m.content, null, 2)),
    ),
  );
  return h(
    "details",
    { class: "call" },
    h("summary", null, label),
    ...messages,
    h(
      "div",
      { class: "message reply" },
      h("div", { class: "role" }, "reply"),
      h("pre", { class: "text" }, call.completion ? call.completion.text : "(no reply)"),
    ),
  );
}

function engineOf(flow, role) {
  const name = flow?.roles?.[role]?.engine;
  const engine = flow?.engines?.[name] || {};
  const bundled = ["llamacpp", "transformers"].includes(engine.kind) ? "bundled SmolLM2-135M" : "";
  const model = engine.model || engine.model_path || bundled;
  // the adapter is what tells a trained planner from the frozen one: always shown
  const adapter = engine.adapter ? ` + adapter ${engine.adapter}` : "";
  return name ? `${engine.kind || name}${model ? " · " + String(model).split("/").pop() : ""}${adapter}` : "";
}

/** The settings of an eval run (its config.json) in one line, the whole file folded. */
export function runSettings(config) {
  const flow = config?.identity?.flow;
  if (!flow) return "";
  const planner = engineOf(flow, "planner");
  const others = ["executor", "verifier", "generator"].map((r) => engineOf(flow, r)).filter((e) => e !== planner);
  return h(
    "div",
    { class: "settings" },
    facts([
      ["planner", planner],
      ["other roles", others.length ? [...new Set(others)].join(", ") : "same engine"],
      ["tools", Object.keys(flow.tools || {}).join(", ")],
      ["limits", flow.limits ? `${flow.limits.max_turns} turns, ${flow.limits.max_seconds} s per question` : ""],
      ["agent", config.identity.agent],
      ["started", (config.invocations || []).map((i) => i.started_at).slice(-1)[0]],
    ]),
    h("details", null, h("summary", null, "config.json"), h("pre", { class: "text" }, JSON.stringify(config, null, 2))),
  );
}
