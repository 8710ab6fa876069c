"""How far can the planner take the flow? Held-out accuracy of the training flow with a scripted oracle
planner (the right tool at every turn, with a sub-goal that names what to do), next to a planner that never
names a tool, one that uses the right tools in the wrong order and ones that repeat one of them (what an
untrained planner that always names the same tool does). Everything else (executor, tools, generator,
scoring) is the flow of the training config, so this bounds what training the planner alone can reach.

    python benchmarks/planner_ceiling.py [--config src/agentflow/configs/train_cpu_demo.yaml] [--limit N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections import defaultdict
from pathlib import Path

from agentflow.engines.scripted import ScriptedEngine
from agentflow.flow import Flow
from agentflow.train.config import TrainConfig
from agentflow.train.data import default_paths, load_questions
from agentflow.train.rollout import run_rollouts


def right_tools(question) -> list[str]:
    return list(question.meta.get("tools") or [question.meta["tool"]])


def sub_goal(question, tool: str) -> str:
    if tool == "wikipedia_search":
        return question.meta.get("source_title") or question.meta.get("element") or question.question
    if question.meta.get("kind") == "arithmetic":
        return "Compute " + question.question.removeprefix("What is ").rstrip("?")
    return "Compute the answer from the lookup"


def scripted(questions, order):
    """A planner that plays `order(right tools)` turn by turn (the last one again past its end)."""
    by_text = {q.question: q for q in questions}

    def reply(messages):
        text = messages[-1]["content"]
        question = by_text[re.search(r"Question: (.*)", text).group(1).strip()]
        turn = int(re.search(r"Step (\d+) of", text).group(1))
        tools = order(right_tools(question))
        tool = tools[min(turn, len(tools)) - 1]
        return json.dumps({"tool_name": tool, "sub_goal": sub_goal(question, tool), "context": ""})

    return ScriptedEngine(reply)


async def measure(cfg: TrainConfig, questions, planner) -> dict:
    flow = Flow.from_config(cfg.eval_flow_config(), engines={cfg.policy_engine_name: planner})
    start = time.perf_counter()
    try:
        batch = await run_rollouts(flow, questions, group_size=1, concurrency=cfg.rollout_concurrency)
    finally:
        await flow.aclose()
    kinds: dict[str, list[bool]] = defaultdict(list)
    for r in batch.rollouts + batch.excluded:
        kinds[r.question.meta.get("kind", "all")].append(bool(r.score and r.score.correct))
    n = sum(len(v) for v in kinds.values())
    return {"accuracy": round(sum(sum(v) for v in kinds.values()) / n, 4),
            "by_kind": {k: round(sum(v) / len(v), 4) for k, v in kinds.items()}, "questions": n,
            "infrastructure_failures": len(batch.excluded), "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default="src/agentflow/configs/train_cpu_demo.yaml")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--modes", default="oracle,reversed,first_twice,last_twice,no_tool")
    parser.add_argument("--out", default=None, help="also write the JSON summary here")
    args = parser.parse_args()
    cfg = TrainConfig.from_yaml(args.config)
    questions = load_questions(cfg.data.eval_path or default_paths(cfg.data.task)[1], cfg.data)[:args.limit]
    planners = {"oracle": lambda: scripted(questions, lambda tools: tools),
                "reversed": lambda: scripted(questions, lambda tools: tools[::-1]),
                "first_twice": lambda: scripted(questions, lambda tools: tools[:1] * 2),
                "last_twice": lambda: scripted(questions, lambda tools: tools[-1:] * 2),
                "no_tool": lambda: ScriptedEngine(['{"context": "", "sub_goal": "answer", "tool_name": "none"}'])}
    results = {mode: asyncio.run(measure(cfg, questions, planners[mode]())) for mode in args.modes.split(",")}
    print(json.dumps(results, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps({"config": args.config, **results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
