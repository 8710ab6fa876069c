"""The trivial and the ideal planners, measured in a training config's flow before anything is trained.

- `oracle`: scripted, the right tools of the question's kind in order (`tools` of each item), each with a
  sub-goal that names what to do, then the action `answer` (with `planner_stop`): the ceiling.
- `oracle_question`: the same right tools, with the question itself as every sub-goal, as the constants have:
  the ceiling and the constants compared at equal sub-goals.
- `constants`: every constant tool sequence up to max_turns, the same for every question, the sub-goal being
  the question itself; with `planner_stop` each shorter sequence ends with `answer`, and `answer` alone (no
  tool) is one of them. The best of them is what a planner that learns one plan for every question reaches.
- `frozen`: the untrained planner itself (the config's policy engine, greedy as evaluated).
- `const:T1+T2`: one constant sequence.
- `oracle_sampled`: the untrained planner sampled at the training config's rollout temperature, its tool
  set to the right one (then `answer`) through the reply's schema: it writes its own sub-goal and context for
  that tool. What the right tool choice earns under the rollouts' sampling, i.e. how clearly the reward tells a
  sampled planner which tool fits. (`mixed_sampled_right_tool.json` and `mixed_sampled_plans.json` were measured
  before the schema named the tool: the tool was replaced after the reply, written for the planner's own.)
- `sampled:T1+T2`: the same, with one plan for every question in place of the right one. Beside
  `oracle_sampled`, what each plan earns each kind of question under sampling: the reward a rollout can get,
  so which choices training can be taught at all.
- With `--temperature 0` both are greedy: the planner's own sub-goals as evaluated, its tools set. That is the
  ceiling (and the constants) of a planner trained on its tool choice alone, whose sub-goals stay its own.

Everything else (executor, tools, generator, scoring) is the config's evaluation flow, so these bound what
training the planner can reach and what it must beat.

    python benchmarks/planner_ceiling.py --config src/agentflow/configs/train_mixed.yaml \
        [--modes oracle,constants,frozen] [--per-kind N | --limit N] [--out FILE] [--records FILE]

`--records FILE` also writes one JSON line per question and mode (`mode`, `id`, `kind`, `tools`, `answer`,
`correct`): which questions a mode answers, e.g. those the generator answers with no tool (`--modes const:`) to
list in the training config's `data.exclude_train_ids`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import json
import re
import time
from collections import defaultdict
from pathlib import Path

from agentflow.config import STOP_ACTION
from agentflow.engines import build_engine
from agentflow.engines.base import Completion, Engine, Message, SamplingParams
from agentflow.engines.scripted import ScriptedEngine
from agentflow.flow import Flow
from agentflow.train.config import TrainConfig
from agentflow.train.data import Question, held_out_questions
from agentflow.train.rollout import run_rollouts


def right_tools(question: Question) -> list[str]:
    return list(question.meta.get("tools") or [question.meta["tool"]])


def oracle_sub_goal(question: Question, tool: str, turn: int) -> str:
    """What a planner that knows the plan would ask of this step: the task's own (`sub_goals`), else named here."""
    named = question.meta.get("sub_goals")
    if named:
        return named[min(turn, len(named)) - 1]
    element = question.meta.get("element") or question.meta.get("source_title")
    if tool == "wikipedia_search":
        return f"Find the atomic number of {element.lower()}" if question.meta.get("atomic_number") else element
    numbers = re.findall(r"\d+", question.question)
    if question.meta.get("kind") in ("lookup_compute", "times") or turn > 1:
        return f"Multiply the atomic number by {numbers[-1]}" if numbers else "Compute the answer from the lookup"
    return "Compute " + (" + " if "{c}" in question.meta.get("template", "") or "+" in question.question
                         else " * ").join(numbers)


def question_sub_goal(question: Question, tool: str, turn: int) -> str:
    """The sub-goal of the constants (and of `oracle_question`): the question itself, whatever the step."""
    return question.question


def planned_step(by_text: dict[str, Question], messages: list[Message], plan, *,
                 stop: bool) -> tuple[Question, str, int]:
    """The question a planner prompt asks about, the tool `plan(question)` names at its turn (after the plan:
    `answer` with `stop`, else the last tool again), and the turn."""
    text = messages[-1]["content"]
    question = by_text[re.search(r"Question: (.*)", text).group(1).strip()]
    turn = int(re.search(r"Step (\d+) of", text).group(1))
    tools = plan(question)
    if turn > len(tools):
        return question, STOP_ACTION if stop or not tools else tools[-1], turn
    return question, tools[turn - 1], turn


def scripted(questions: list[Question], plan, sub_goal, *, stop: bool) -> ScriptedEngine:
    """A planner that plays `plan(question)` turn by turn, then `answer` (with `stop`) or its last tool again."""
    by_text = {q.question: q for q in questions}

    def reply(messages):
        question, tool, turn = planned_step(by_text, messages, plan, stop=stop)
        return json.dumps({"tool_name": tool, "sub_goal": sub_goal(question, tool, turn), "context": ""})

    return ScriptedEngine(reply)


class RightTool(Engine):
    """The untrained planner at the rollout temperature, with the tool of each reply set by `plan` (by default
    the right tools of the question's kind): the reply's schema allows that tool alone (so the sub-goal after it
    is written for it), and a reply without a schema has its tool replaced."""

    supports_json_schema = True

    def __init__(self, inner: Engine, questions: list[Question], temperature: float, *, stop: bool,
                 plan=right_tools) -> None:
        self.inner, self.temperature, self.stop, self.plan = inner, temperature, stop, plan
        self.by_text = {q.question: q for q in questions}
        self.model_name = f"{getattr(inner, 'model_name', 'planner')}+right-tool"

    async def generate(self, messages: list[Message], sampling: SamplingParams, *,
                       json_schema: dict | None = None) -> Completion:
        sampled = sampling.model_copy(update={"temperature": self.temperature})
        _, tool, _ = planned_step(self.by_text, messages, self.plan, stop=self.stop)
        tool_field = (json_schema or {}).get("properties", {}).get("tool_name")
        if tool_field is not None and tool in tool_field.get("enum", ()):
            # the schema names the one tool, so the sub-goal the planner writes after it is written for it
            json_schema = copy.deepcopy(json_schema)
            json_schema["properties"]["tool_name"]["enum"] = [tool]
        completion = await self.inner.generate(messages, sampled, json_schema=json_schema)
        try:
            reply = json.loads(completion.text)
        except ValueError:
            reply = {}
        reply = reply if isinstance(reply, dict) else {}
        reply["tool_name"] = tool
        return completion.model_copy(update={"text": json.dumps(reply)})

    async def aclose(self) -> None:
        await self.inner.aclose()


def constant_sequences(tools: list[str], max_turns: int, *, stop: bool) -> list[tuple[str, ...]]:
    """Every sequence the same for all questions: with `stop`, of length 0 to max_turns (then `answer`);
    without, exactly max_turns tools."""
    lengths = range(0, max_turns + 1) if stop else [max_turns]
    return [seq for n in lengths for seq in itertools.product(tools, repeat=n)]


async def measure(cfg: TrainConfig, questions: list[Question], planner: Engine | None,
                  records: list[dict] | None = None) -> dict:
    """The mode's summary; with `records`, one entry per question appended to it."""
    engines = {cfg.policy_engine_name: planner} if planner is not None else {}
    flow = Flow.from_config(cfg.eval_flow_config(), engines=engines)
    start = time.perf_counter()
    try:
        batch = await run_rollouts(flow, questions, group_size=1, concurrency=cfg.rollout_concurrency)
    finally:
        await flow.aclose()
    kinds: dict[str, list[bool]] = defaultdict(list)
    first: dict[str, list[bool]] = defaultdict(list)
    sequences: dict[str, int] = defaultdict(int)
    for r in batch.rollouts + batch.excluded:
        kind, right = r.question.meta.get("kind", "all"), bool(r.score and r.score.correct)
        kinds[kind].append(right)
        turns = r.trajectory.turns
        first[f"{kind} < {turns[0].tool if turns else None}"].append(right)
        sequences[" > ".join(str(t.tool) for t in turns)] += 1
        if records is not None:
            records.append({"id": r.question.id, "kind": kind, "tools": [t.tool for t in turns],
                            "answer": r.trajectory.answer, "correct": right})
    n = sum(len(v) for v in kinds.values())
    return {"accuracy": round(sum(sum(v) for v in kinds.values()) / n, 4),
            "by_kind": {k: round(sum(v) / len(v), 4) for k, v in sorted(kinds.items())}, "questions": n,
            "sequences": dict(sorted(sequences.items(), key=lambda kv: -kv[1])[:8]),
            # "kind < first action": [questions, share right]
            "by_first_action": {k: [len(v), round(sum(v) / len(v), 4)] for k, v in sorted(first.items())},
            "infrastructure_failures": len(batch.excluded), "seconds": round(time.perf_counter() - start, 1)}


def pick(questions: list[Question], *, per_kind: int | None, limit: int | None) -> list[Question]:
    if per_kind is None:
        return questions[:limit]
    taken: dict[str, int] = defaultdict(int)
    chosen = []
    for q in questions:
        kind = q.meta.get("kind", "all")
        if taken[kind] < per_kind:
            taken[kind] += 1
            chosen.append(q)
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="src/agentflow/configs/train_mixed.yaml")
    parser.add_argument("--modes", default="oracle,constants,frozen")
    parser.add_argument("--limit", type=int, default=None, help="the first N held-out questions")
    parser.add_argument("--per-kind", type=int, default=None, help="the first N held-out questions of each kind")
    parser.add_argument("--out", default=None, help="also write the JSON summary here (rewritten after each mode)")
    parser.add_argument("--records", default=None,
                        help="also write one JSON line per question and mode here (rewritten after each mode)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="the planner's temperature in oracle_sampled and sampled:* (default: the rollouts'); "
                        "0 is greedy: the right tools with the sub-goals the planner writes when evaluated")
    args = parser.parse_args()
    cfg = TrainConfig.from_yaml(args.config)
    flow_cfg = cfg.eval_flow_config()
    stop = flow_cfg.planner_stop
    questions = pick(held_out_questions(cfg.data),
                     per_kind=args.per_kind, limit=args.limit)
    modes: dict[str, Engine | None] = {}
    for mode in args.modes.split(","):
        if mode == "oracle":
            modes[mode] = scripted(questions, right_tools, oracle_sub_goal, stop=stop)
        elif mode == "oracle_question":
            modes[mode] = scripted(questions, right_tools, question_sub_goal, stop=stop)
        elif mode == "oracle_sampled" or mode.startswith("sampled:"):
            temperature = args.temperature
            if temperature is None:  # the rollouts' temperature
                temperature = flow_cfg.roles.planner.sampling.temperature if cfg.temperature is None \
                    else cfg.temperature
            inner = build_engine(flow_cfg.engines[cfg.policy_engine_name])
            seq = [t for t in mode.removeprefix("sampled:").split("+") if t]
            plan = right_tools if mode == "oracle_sampled" else (lambda q, seq=seq: list(seq))
            modes[mode] = RightTool(inner, questions, temperature, stop=stop, plan=plan)
        elif mode == "frozen":
            modes[mode] = None
        elif mode == "constants" or mode.startswith("const:"):
            sequences = constant_sequences(list(flow_cfg.tools), flow_cfg.limits.max_turns, stop=stop) \
                if mode == "constants" else [tuple(t for t in mode.removeprefix("const:").split("+") if t)]
            for seq in sequences:
                modes["const:" + "+".join(seq)] = scripted(
                    questions, lambda q, seq=seq: list(seq), question_sub_goal, stop=stop)
        else:
            parser.error(f"unknown mode {mode!r}")
    results: dict[str, dict] = {}
    records: list[dict] = []
    for mode, planner in modes.items():
        mode_records: list[dict] = []
        results[mode] = asyncio.run(measure(cfg, questions, planner, mode_records))
        print(mode, json.dumps(results[mode]), flush=True)
        if args.records:
            records += [{"mode": mode, **r} for r in sorted(mode_records, key=lambda r: r["id"])]
            Path(args.records).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        if args.out:
            constants = {m: r["accuracy"] for m, r in results.items() if m.startswith("const:")}
            best = max(constants, key=constants.get) if constants else None
            Path(args.out).write_text(json.dumps({
                "config": args.config, "questions": len(questions), "best_constant": best,
                "best_constant_accuracy": constants.get(best) if best else None, **results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
