"""A trained executor against the frozen one, on its own measure and end to end:
`benchmarks/results/train_roles_summary.json`.

The run is one `agentflow train` of `train_executor.yaml` (the lookup_compute task, `train_roles: [executor]`):
its step-0 evaluation is the frozen executor, its last one the trained executor, every held-out question,
greedy, the same planner. The executor's own measure is the share of its tool calls that return the right
thing: a search whose first result (the start of its output) gives the question's element with its atomic
number, a program that prints the answer.

    agentflow train -c src/agentflow/configs/train_executor.yaml --out runs/executor_s0
    python benchmarks/train_roles.py runs/executor_s0 --out benchmarks/results/train_roles_summary.json

A run trained with `eval_at_start: false` takes the frozen evaluation of the run named by `--frozen` (its
step-0 one: the same flow, greedy, so the training temperature does not enter it).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

MEASURE = ("share of the executor's tool calls that return the right thing: wikipedia_search whose output starts "
           "with the question's element and its atomic number (first 300 characters), python that prints the "
           "gold answer")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def held_out_meta(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    from agentflow.train.config import TrainConfig
    from agentflow.train.data import default_paths, load_questions

    cfg = TrainConfig.model_validate(config)
    _, held_out = default_paths(cfg.data.task)
    return {q.id: {**q.meta, "answer": q.answer} for q in load_questions(cfg.data.eval_path or held_out, cfg.data)}


def call_right(tool: str, call: dict[str, Any] | None, meta: dict[str, Any]) -> bool:
    if not call or call.get("error"):
        return False
    output = call.get("output") or ""
    if tool == "wikipedia_search":
        return f"atomic number {meta['atomic_number']}" in output
    if tool == "python":
        answers = meta["answer"] if isinstance(meta["answer"], list) else [meta["answer"]]
        return any(re.search(rf"(?<![\d.]){re.escape(str(a))}(?:\.0+)?(?![\d.])", output) for a in answers)
    return False


def measure(records: list[dict[str, Any]], meta: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The executor's own measure over one evaluation's records, pooled and per tool."""
    by_tool: dict[str, list[bool]] = {}
    for record in records:
        for tool, call in zip(record["tools"], record.get("calls") or [], strict=False):
            if tool in ("wikipedia_search", "python"):
                by_tool.setdefault(tool, []).append(call_right(tool, call, meta[record["id"]]))
    pooled = [ok for oks in by_tool.values() for ok in oks]
    return {"measure": round(sum(pooled) / max(len(pooled), 1), 4), "calls": len(pooled),
            "by_tool": {tool: {"right": round(sum(oks) / len(oks), 4), "calls": len(oks)}
                        for tool, oks in sorted(by_tool.items())},
            "accuracy": round(sum(r["correct"] for r in records) / max(len(records), 1), 4),
            "questions": len(records)}


def rollout_measure(run: Path, meta: dict[str, dict[str, Any]]) -> list[float]:
    """Per training step, the share of the sampled rollouts' python calls that printed the answer."""
    from agentflow.train.config import TrainConfig
    from agentflow.train.data import default_paths, load_questions

    config = json.loads((run / "config.json").read_text())
    cfg = TrainConfig.model_validate(config)
    train, _ = default_paths(cfg.data.task)
    train_meta = {q.id: {**q.meta, "answer": q.answer} for q in load_questions(cfg.data.train_path or train, cfg.data)}
    shares = []
    for path in sorted((run / "rollouts").glob("step-*.jsonl")):
        oks = [call_right("python", turn.get("tool_call"), train_meta[record["group"]])
               for record in read_jsonl(path) for turn in record["trajectory"]["turns"] if turn["tool"] == "python"]
        shares.append(round(sum(oks) / max(len(oks), 1), 3))
    return shares


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="the run directory of `agentflow train -c train_executor.yaml`")
    parser.add_argument("--frozen", type=Path, default=None,
                        help="the run whose step-0 evaluation is the frozen one (default: RUN itself)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    config = json.loads((args.run / "config.json").read_text())
    meta = held_out_meta(config)
    frozen_run = args.frozen or args.run
    labels = sorted(int(p.stem.removeprefix("step-")) for p in (args.run / "eval").glob("step-*.jsonl"))
    if not labels or labels[-1] == 0 or not (frozen_run / "eval" / "step-0.jsonl").is_file():
        raise SystemExit(f"{args.run}: needs a final evaluation in eval/, and a step-0 (frozen) one there or in "
                         "the --frozen run")
    frozen_records = read_jsonl(frozen_run / "eval" / "step-0.jsonl")
    trained_records = read_jsonl(args.run / "eval" / f"step-{labels[-1]}.jsonl")
    if sorted(r["id"] for r in frozen_records) != sorted(r["id"] for r in trained_records):
        raise SystemExit("the frozen and the trained evaluations are not of the same questions")
    frozen, trained = measure(frozen_records, meta), measure(trained_records, meta)
    rows = read_jsonl(args.run / "metrics.jsonl")
    steps = [r for r in rows if "seconds/step" in r]
    evals = [r for r in rows if "eval/seconds" in r]
    frozen_evals = [r for r in read_jsonl(frozen_run / "metrics.jsonl") if r.get("step") == 0 and "eval/seconds" in r]
    role = config["train_roles"][0]
    summary = {
        "task": config["data"]["task"], "roles_trained": config["train_roles"], "measure": MEASURE,
        "frozen_measure": frozen["measure"], "trained_measure": trained["measure"],
        "frozen_accuracy": frozen["accuracy"], "trained_accuracy": trained["accuracy"],
        "frozen_by_tool": frozen["by_tool"], "trained_by_tool": trained["by_tool"],
        "held_out_questions": trained["questions"], "steps": len(steps), "seed": config["seed"],
        "run": str(args.run), "frozen_run": str(frozen_run), "temperature": config["temperature"],
        "batch_size": config["batch_size"], "group_size": config["group_size"],
        "learning_rate": config["learning_rate"],
        "wall_seconds": {
            "training_steps": round(sum(r["seconds/step"] for r in steps)),
            "rollouts": round(sum(r.get("seconds/rollout", 0.0) for r in steps)),
            "updates": round(sum(r.get(f"{role}/seconds/update", r.get("seconds/update", 0.0)) for r in steps)),
            "syncs": round(sum(r.get("sync/seconds", 0.0) for r in steps)),
            "eval_frozen": round(frozen_evals[0]["eval/seconds"]) if frozen_evals else None,
            "eval_trained": round(evals[-1]["eval/seconds"]) if evals else None},
        "per_step": {
            "reward_mean": [round(r.get("reward_mean", 0.0), 3) for r in steps],
            "no_signal_share": [round(r.get("no_signal_share", 0.0), 3) for r in steps],
            f"{role}/entropy": [round(r.get(f"{role}/entropy", 0.0), 3) for r in steps],
            f"{role}/grad_norm": [round(r.get(f"{role}/grad_norm", 0.0), 4) for r in steps],
            "rollout_python_right": rollout_measure(args.run, meta),
        },
    }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
