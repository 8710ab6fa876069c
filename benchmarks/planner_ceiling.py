"""How far can the planner take the flow? Held-out accuracy of the training flow with a scripted oracle
planner (always the right tool, and the sub-goal a good tool input: the person's name, or the expression),
next to a planner that never names a tool. Everything else (executor, tools, generator, scoring) is the
flow of the training config, so this bounds what training the planner alone can reach.

    python benchmarks/planner_ceiling.py [--config src/agentflow/configs/train_cpu_demo.yaml] [--limit N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections import defaultdict

from agentflow.engines.scripted import ScriptedEngine
from agentflow.flow import Flow
from agentflow.train.config import TrainConfig
from agentflow.train.data import default_paths, load_questions
from agentflow.train.rollout import run_rollouts


def oracle(questions):
    by_text = {q.question: q for q in questions}

    def reply(messages):
        text = re.search(r"Question: (.*)", messages[-1]["content"]).group(1).strip()
        q = by_text[text]
        if q.meta.get("kind") == "arithmetic":
            goal = "Compute " + text.removeprefix("What is ").rstrip("?")
        else:
            goal = q.meta.get("source_title", text)
        return json.dumps({"context": "", "sub_goal": goal, "tool_name": q.meta["tool"]})

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
    parser.add_argument("--modes", default="oracle,no_tool")
    args = parser.parse_args()
    cfg = TrainConfig.from_yaml(args.config)
    questions = load_questions(cfg.data.eval_path or default_paths()[1], cfg.data)[:args.limit]
    planners = {"oracle": lambda: oracle(questions),
                "no_tool": lambda: ScriptedEngine(['{"context": "", "sub_goal": "answer", "tool_name": "none"}'])}
    results = {mode: asyncio.run(measure(cfg, questions, planners[mode]())) for mode in args.modes.split(",")}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
