"""The Flow-GRPO update on the planner's first tool choice alone: can it learn a choice that depends on the
question when the reward says exactly which choice was right?

The mixed task's learning runs (docs/training.md) did not learn a question-dependent plan, and their reward
mixes the planner's choice with the frozen executor's programs, the search and the generator. This benchmark
takes those away and keeps everything of the trainer: the same config (`train_mixed.yaml` by default: planner
prompt, tool menu shuffled per rollout, whole constrained replies, llama.cpp rollouts with the adapter synced
each step, the loss, the batches stratified by kind). The flow stops after the planner's first turn: no tool
runs, the executor and the generator are not asked, and the trajectory's answer is the tool the planner named.
The questions' gold answer is the right first tool of their kind (`tools[0]`: `python` for compute questions,
`wikipedia_search` for the two look-up kinds), scored by exact match. So a trajectory's reward is 1 exactly
when the planner named the right first tool, and the held-out accuracy is the first tool's accuracy, greedy.

    python benchmarks/tool_choice_bandit.py --out runs/bandit --steps 15
    python benchmarks/tool_choice_bandit.py --out runs/bandit_last --steps 15 --set flow.planner_tool_last=true
    python benchmarks/tool_choice_bandit.py --out runs/bandit_balanced --steps 15 --balance
    python benchmarks/tool_choice_bandit.py --out runs/bandit_balanced --steps 30 --balance --resume
    python benchmarks/tool_choice_bandit.py --out runs/plan_bandit --steps 15 --plan \
        --config runs/flow.yaml --set flow.engines.policy.adapter=runs/bandit/final/adapter
    python benchmarks/learning_mixed.py runs/bandit --out benchmarks/results/tool_choice_bandit.json

`--plan` rewards the whole plan instead: the flow runs as in training (up to max_turns, the executor writes each
tool call and the tools run) but the generator is not asked; the trajectory's answer is the actions the planner
named, in order (`wikipedia_search>python>answer`), and the gold answer the question's own tools followed by
`answer`. The reward (`plan_prefix`) is the share of the gold actions the planner named before its first wrong
one: 1 exactly when it called the right tools in the right order and then stopped, 1/2 for a look-up that
searched and then did not stop. So each turn's choice is paid, the second tool and the stop included, which an
outcome reward pays only through the executor's programs and the generator; the held-out accuracy is the
share of exactly right plans, greedy.

(`learning_mixed.py` reads the run's per-step tool shares by kind, its evaluations and its timings.)
`--set KEY=VALUE` overrides one key of the training config (dotted path, YAML value).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from agentflow.config import STOP_ACTION
from agentflow.flow import Flow
from agentflow.scoring import Score, register_scorer
from agentflow.train.config import TrainConfig
from agentflow.train.data import default_paths
from agentflow.train.trainer import Trainer

PLAN_SEPARATOR = ">"


def write_split(source: Path, out: Path, *, balance: bool = False, plan: bool = False) -> None:
    """`source`'s questions with their first tool as the gold answer, scored by exact match (`plan`: their tools
    then `answer`, joined by `>`, scored by `plan_prefix`). `balance`: as many
    questions of each first tool (the first ones in the file of each: the smallest class's count), so that a
    batch stratified by `first_tool` holds as many questions for which `python` is right as for `wikipedia_search`."""
    questions = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    for question in questions:
        answer = PLAN_SEPARATOR.join([*question["tools"], STOP_ACTION]) if plan else question["tools"][0]
        question.update(answer=answer, first_tool=question["tools"][0], reward="plan_prefix" if plan else "exact_match")
    if balance:
        counts = Counter(q["answer"] for q in questions)
        seen: Counter[str] = Counter()
        kept = []
        for question in questions:
            seen[question["answer"]] += 1
            if seen[question["answer"]] <= min(counts.values()):
                kept.append(question)
        questions = kept
    out.write_text("".join(json.dumps(q) + "\n" for q in questions))


async def _no_tool(self: Flow, turn: Any, traj: Any, tool_name: str, entry: Any, emit: Any, *,
                   steps: str = "") -> None:
    entry.result = "(not run)"


async def _tool_as_answer(self: Flow, traj: Any, memory: Any, emit: Any) -> None:
    traj.answer = (traj.turns[0].tool or "") if traj.turns else ""


async def _plan_as_answer(self: Flow, traj: Any, memory: Any, emit: Any) -> None:
    traj.answer = PLAN_SEPARATOR.join(turn.tool or "" for turn in traj.turns)


@register_scorer("plan_prefix", description="The share of the gold plan's actions named before the first wrong one.")
def plan_prefix(prediction: str, gold: Any) -> Score:
    """Correct when the plan is the gold plan; the reward is the share of its actions matched from the start."""
    named, wanted = prediction.split(PLAN_SEPARATOR), str(gold).split(PLAN_SEPARATOR)
    matched = 0
    while matched < min(len(named), len(wanted)) and named[matched] == wanted[matched]:
        matched += 1
    return Score(correct=named == wanted, value=matched / len(wanted), details={"matched": matched})


def set_key(raw: dict[str, Any], assignment: str) -> None:
    key, _, value = assignment.partition("=")
    *path, last = key.split(".")
    node = raw
    for part in path:
        node = node[part]
    node[last] = yaml.safe_load(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="src/agentflow/configs/train_mixed.yaml")
    parser.add_argument("--out", type=Path, required=True, help="the run's directory")
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-size", type=int, default=90, help="first N held-out questions (30 a kind)")
    parser.add_argument("--balance", action="store_true",
                        help="train on as many questions whose right first tool is `python` as `wikipedia_search` "
                             "(the task has twice as many of the second), each batch half and half")
    parser.add_argument("--plan", action="store_true",
                        help="reward each action of the plan, the stop included (the flow's tools run; no generator)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out from its last checkpoint (to --steps), as `agentflow train "
                             "--resume` does; give the arguments it was started with")
    args = parser.parse_args()

    raw = TrainConfig.from_yaml(args.config).model_dump()
    data = args.out / "data"
    data.mkdir(parents=True, exist_ok=True)
    train, held_out = default_paths(raw["data"]["task"])
    write_split(Path(raw["data"]["train_path"] or train), data / "train.jsonl", balance=args.balance,
                plan=args.plan)
    if args.balance:
        raw["data"]["stratify_field"] = "first_tool"
    write_split(Path(raw["data"]["eval_path"] or held_out), data / "heldout.jsonl", plan=args.plan)
    raw["data"].update(train_path=str(data / "train.jsonl"), eval_path=str(data / "heldout.jsonl"))
    if not args.plan:
        raw["flow"]["limits"]["max_turns"] = 1
    raw.update(max_steps=args.steps, seed=args.seed, eval_size=args.eval_size, output_dir=str(args.out))
    for assignment in args.set:
        set_key(raw, assignment)
    if args.plan:
        Flow._generate = _plan_as_answer  # type: ignore[method-assign]
    else:
        Flow._execute = _no_tool  # type: ignore[method-assign]
        Flow._generate = _tool_as_answer  # type: ignore[method-assign]
    logging.basicConfig(level=logging.WARNING)
    result = Trainer(TrainConfig.from_dict(raw)).run(resume=args.resume)
    print(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
