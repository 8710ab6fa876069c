// One trajectory as the flow lived it: the question, each turn (planner -> executor -> tool -> verifier) with
// every model call's engine, sampling settings, tokens and time, then the answer against gold.
// Any key may be missing (older or newer files): each part is drawn only from what is there.

import { chip, facts, fold, h, table } from "af/dom.js";
import { int, secs } from "af/format.js";
import { callDetails, callMeta, toolClass } from "af/parts.js";

function failureList(failures) {
  if (!failures || !failures.length) return "";
  return h(
    "ul",
    { class: "failures" },
    failures.map((f) =>
      h(
        "li",
        { class: f.infrastructure ? "infra" : "agent" },
        chip(`${f.stage} · ${f.kind}`, f.infrastructure ? "bad" : "warn"),
        f.infrastructure ? chip("infrastructure", "bad") : "",
        " ",
        f.message,
      ),
    ),
  );
}

function step(kind, label, ...children) {
  return h(
    "div",
    { class: `step ${kind}` },
    h("div", { class: "step-label" }, label),
    h("div", { class: "step-body" }, ...children),
  );
}

function verifierAnalysis(call) {
  const text = call?.completion?.text || "";
  try {
    const parsed = JSON.parse(text);
    if (parsed && typeof parsed.analysis === "string") return parsed.analysis;
  } catch {
    /* not JSON: show the reply as written */
  }
  return text;
}

function argumentsView(toolCall) {
  const args = toolCall?.arguments || {};
  const keys = Object.keys(args);
  if (!keys.length) return h("p", { class: "muted" }, "no arguments");
  return keys.map((key) => {
    const value = args[key];
    const text = typeof value === "string" ? value : JSON.stringify(value, null, 2);
    return h(
      "div",
      { class: "arg" },
      h("span", { class: "arg-name" }, key),
      key === "code" || text.includes("\n")
        ? fold(text, { lines: 20, kind: "code" })
        : h("code", { class: "arg-value" }, text),
    );
  });
}

/** The code the tool ran when it is not the call's own `code` argument (the python tool wrote it from a task). */
function ranCode(call) {
  const code = call.data?.code;
  if (typeof code !== "string" || code === call.arguments?.code) return "";
  return h(
    "div",
    { class: "arg ran-code" },
    h("span", { class: "arg-name" }, "code that ran"),
    fold(code, { lines: 20, kind: "code" }),
  );
}

/** Each model call made inside the tool (the python tool's code writer): its settings, prompt and reply. */
function innerCalls(call) {
  const calls = call.llm_calls || [];
  return calls.map((inner, i) =>
    h(
      "div",
      { class: "inner-call" },
      h("div", { class: "small muted" }, `model call ${i + 1} of ${calls.length} inside the tool`),
      callMeta(inner),
      callDetails(inner, "prompt and reply inside the tool"),
    ),
  );
}

function turnCard(turn) {
  const call = turn.tool_call;
  // verdict null and no verifier call: the flow ran without a verifier (verify: false), nothing went unparsed
  const noVerifier = !turn.verdict && !turn.verifier;
  const verdict = turn.verdict || (noVerifier ? "no verifier" : "—");
  const hasFailure = (turn.failures || []).length > 0;
  const toolChip = turn.tool
    ? chip(
        turn.tool,
        turn.tool_valid ? `tool ${toolClass(turn.tool)}` : "bad",
        turn.tool_valid ? null : "not an enabled tool: nothing ran",
      )
    : chip("no tool", "bad");
  return h(
    "article",
    { class: `turn${hasFailure ? " has-failure" : ""}`, id: `turn-${turn.index}` },
    h(
      "header",
      null,
      h("span", { class: "turn-no" }, `Turn ${turn.index}`),
      toolChip,
      chip(
        verdict,
        verdict === "STOP" ? "good" : "neutral",
        noVerifier
          ? "the flow ran without a verifier"
          : turn.verdict_parsed === false
            ? "the verifier's reply was not understood"
            : null,
      ),
      turn.verdict_parsed === false && !noVerifier ? chip("verdict unparsed", "warn") : "",
      h("span", { class: "muted small right" }, secs(turn.seconds)),
    ),
    step(
      "planner",
      "Planner",
      h("p", { class: "subgoal" }, turn.sub_goal || h("em", { class: "muted" }, "no sub-goal")),
      turn.context ? h("p", { class: "muted small" }, "context: ", turn.context) : "",
      callMeta(turn.planner),
      callDetails(turn.planner),
    ),
    turn.executor || call
      ? step("executor", "Executor", argumentsView(call), callMeta(turn.executor), callDetails(turn.executor))
      : "",
    call
      ? step(
          `tool${call.error ? " error" : ""}`,
          `Tool · ${call.tool}`,
          call.error ? h("p", { class: "error-text" }, `${call.error.kind}: ${call.error.message}`) : "",
          ranCode(call),
          call.output ? fold(call.output, { lines: 12 }) : h("p", { class: "muted" }, "no output"),
          h(
            "div",
            { class: "call-meta" },
            h("span", null, secs(call.seconds)),
            call.truncated ? chip("output truncated", "warn") : "",
          ),
          innerCalls(call),
        )
      : "",
    turn.verifier
      ? step(
          "verifier",
          "Verifier",
          h("p", null, chip(verdict, verdict === "STOP" ? "good" : "neutral"), " ", verifierAnalysis(turn.verifier)),
          callMeta(turn.verifier),
          callDetails(turn.verifier),
        )
      : "",
    failureList(turn.failures),
  );
}

function rolesTable(roles) {
  const entries = Object.entries(roles || {});
  if (!entries.length) return "";
  return h(
    "details",
    { class: "roles" },
    h("summary", null, "engines and sampling per role"),
    table(
      ["role", "engine", "model", "adapter", "temperature", "top-p", "max tokens", "seed"],
      entries.map(([role, r]) => {
        // flow.roles_record(): {engine_name, engine: "llamacpp" | ..., model, adapter, ...}; older files nested it
        const engine = typeof r.engine === "object" && r.engine ? r.engine : r;
        const kind = typeof r.engine === "string" ? r.engine : engine.engine || r.kind || "";
        const s = r.sampling || {};
        return h(
          "tr",
          null,
          h("td", null, role),
          h(
            "td",
            null,
            kind,
            r.engine_name && r.engine_name !== kind ? h("span", { class: "muted" }, ` (${r.engine_name})`) : "",
          ),
          h("td", { class: "mono small" }, String(engine.model || engine.model_path || "")),
          h("td", { class: "mono small" }, engine.adapter ? String(engine.adapter) : "–"),
          h("td", { class: "num" }, s.temperature ?? "–"),
          h("td", { class: "num" }, s.top_p ?? "–"),
          h("td", { class: "num" }, s.max_tokens ?? "–"),
          h("td", { class: "num" }, s.seed ?? "–"),
        );
      }),
      { num: [4, 5, 6, 7] },
    ),
  );
}

/** The answer against gold. known: {gold, correct} when the page knows them (eval item, rollout). */
function outcomeBox(t, known) {
  const correct = known?.correct;
  const cls = correct === true ? "correct" : correct === false ? "wrong" : t.stop_reason === "error" ? "wrong" : "";
  return h(
    "div",
    { class: `outcome-box ${cls}` },
    h(
      "div",
      { class: "grow" },
      h("div", { class: "label" }, "answer"),
      h(
        "div",
        { class: "answer-text" },
        t.answer ? fold(t.answer, { lines: 6, chars: 600, kind: "prose" }) : h("em", null, "no answer"),
      ),
    ),
    known && known.gold !== undefined
      ? h("div", null, h("div", { class: "label" }, "gold"), h("div", { class: "answer-text" }, known.gold))
      : "",
    correct === true ? chip("correct", "good") : correct === false ? chip("wrong", "bad") : "",
  );
}

export function renderTrajectory(t, known = null) {
  const usage = t.usage || {};
  const turns = t.turns || [];
  return h(
    "div",
    { class: "trajectory" },
    h(
      "div",
      { class: "question-card" },
      h("div", { class: "label" }, "question"),
      h("p", { class: "question-text" }, t.question),
    ),
    outcomeBox(t, known),
    h(
      "div",
      { class: "meta-strip" },
      chip(
        `stop: ${t.stop_reason || "?"}`,
        ["verifier_stop", "planner_stop"].includes(t.stop_reason)
          ? "neutral"
          : t.stop_reason === "error"
            ? "bad"
            : "warn",
      ),
      h("span", null, `${turns.length} turn(s)`),
      h("span", null, `${int(usage.calls)} model calls`),
      h("span", null, `${int(usage.prompt_tokens)} → ${int(usage.completion_tokens)} tokens`),
      h("span", null, secs(t.seconds)),
      t.started_at ? h("span", { class: "muted" }, t.started_at) : "",
      (t.tools || []).length ? h("span", { class: "muted" }, `tools: ${t.tools.join(", ")}`) : "",
    ),
    (t.failures || []).length
      ? h(
          "div",
          { class: t.failures.some((f) => f.infrastructure) ? "failure-box" : "failure-box agent" },
          h("strong", null, `${t.failures.length} failure(s)`),
          failureList(t.failures),
        )
      : "",
    rolesTable(t.roles),
    t.query_analysis || t.analysis
      ? step(
          "analysis",
          "Query analysis",
          fold(t.query_analysis || "", { lines: 8 }),
          callMeta(t.analysis),
          callDetails(t.analysis),
        )
      : "",
    turns.map(turnCard),
    t.generator
      ? step(
          "generator",
          "Generator",
          fold(t.raw_answer || t.answer || "", { lines: 6, chars: 800 }),
          callMeta(t.generator),
          callDetails(t.generator),
        )
      : "",
  );
}

/** The result line's own facts (turns, tokens and time are in the trajectory's strip). */
export function itemFacts(item) {
  return facts(
    [
      ["benchmark", item.bench],
      ["status", item.status],
      ["scorer value", item.value ?? ""],
      ["judge", item.judge ? String(item.judge.correct) : ""],
      ["failure", item.error ? `${item.error.kind} (${item.error.stage}): ${item.error.message}` : ""],
      ["finished", item.finished_at],
    ],
    { inline: true },
  );
}
