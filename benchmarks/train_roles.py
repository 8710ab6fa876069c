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

The comparison on the `mixed` task (planner alone vs planner and executor trained together, same seed, steps
and held-out questions) is added to the same file under `mixed_comparison`:

    python benchmarks/train_roles.py --mixed PLANNER_RUN ROLES_RUN FROZEN_RUN \
        --out benchmarks/results/train_roles_summary.json

FROZEN_RUN's step-0 evaluation (the frozen flow, on at least the same questions) is restricted to the questions
the two runs were evaluated on.
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


def rollout_measure(run: Path) -> list[float]:
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


def final_eval(run: Path) -> list[dict[str, Any]]:
    labels = sorted(int(p.stem.removeprefix("step-")) for p in (run / "eval").glob("step-*.jsonl"))
    if not labels:
        raise SystemExit(f"{run}: no evaluation in eval/")
    return read_jsonl(run / "eval" / f"step-{labels[-1]}.jsonl")


def by_kind(records: list[dict[str, Any]], meta: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Accuracy and the most frequent tool sequences, per kind of question."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        kinds.setdefault(meta[record["id"]]["kind"], []).append(record)
    out = {}
    for kind, rows in sorted(kinds.items()):
        sequences: dict[str, int] = {}
        for row in rows:
            key = " > ".join(row["tools"]) or "(none)"
            sequences[key] = sequences.get(key, 0) + 1
        top = sorted(sequences.items(), key=lambda kv: -kv[1])[:3]
        out[kind] = {"accuracy": round(sum(r["correct"] for r in rows) / len(rows), 4), "questions": len(rows),
                     "top_sequences": {k: round(v / len(rows), 3) for k, v in top}}
    return out


def mixed_comparison(planner_run: Path, roles_run: Path, frozen_run: Path) -> dict[str, Any]:
    configs = {name: json.loads((run / "config.json").read_text())
               for name, run in (("planner_only", planner_run), ("planner_and_executor", roles_run))}
    keys = ("seed", "max_steps", "batch_size", "group_size", "learning_rate", "temperature", "eval_size",
            "action_entropy_coef", "data")
    differ = [k for k in keys if configs["planner_only"].get(k) != configs["planner_and_executor"].get(k)]
    if differ:
        raise SystemExit(f"the two runs differ in {differ}: not the same comparison")
    meta = held_out_meta(configs["planner_only"])
    evals = {"planner_only": final_eval(planner_run), "planner_and_executor": final_eval(roles_run)}
    ids = sorted(r["id"] for r in evals["planner_only"])
    if ids != sorted(r["id"] for r in evals["planner_and_executor"]):
        raise SystemExit("the two runs were not evaluated on the same questions")
    frozen = [r for r in read_jsonl(frozen_run / "eval" / "step-0.jsonl") if r["id"] in set(ids)]
    if len(frozen) != len(ids):
        raise SystemExit(f"{frozen_run}: its step-0 evaluation lacks some of the questions")
    result: dict[str, Any] = {"task": "mixed", "held_out_questions": len(ids),
                              "seed": configs["planner_only"]["seed"],
                              "steps": configs["planner_only"]["max_steps"],
                              "runs": {"planner_only": str(planner_run), "planner_and_executor": str(roles_run),
                                       "frozen": str(frozen_run)}}
    for name, records in (("frozen", frozen), *evals.items()):
        entry: dict[str, Any] = {"accuracy": round(sum(r["correct"] for r in records) / len(records), 4),
                                 "by_kind": by_kind(records, meta)}
        if any(r.get("calls") for r in records):
            oks = [call_right("python", call, meta[r["id"]]) for r in records
                   for tool, call in zip(r["tools"], r["calls"], strict=False) if tool == "python"]
            entry["python_calls_right"] = {"right": round(sum(oks) / max(len(oks), 1), 4), "calls": len(oks)}
        if name != "frozen":
            run = planner_run if name == "planner_only" else roles_run
            steps = [r for r in read_jsonl(run / "metrics.jsonl") if "seconds/step" in r]
            entry["per_step_reward"] = [round(r.get("reward_mean", 0.0), 3) for r in steps]
            entry["per_step_no_signal_share"] = [round(r.get("no_signal_share", 0.0), 3) for r in steps]
            entry["per_step_rollout_python_right"] = rollout_measure(run)
            entry["wall_seconds"] = {"training_steps": round(sum(r["seconds/step"] for r in steps)),
                                     "rollouts": round(sum(r.get("seconds/rollout", 0.0) for r in steps)),
                                     "updates": round(sum(v for r in steps for k, v in r.items()
                                                          if k.endswith("seconds/update"))),
                                     "syncs": round(sum(r.get("sync/seconds", 0.0) for r in steps))}
            entry["per_step_planner_action_entropy"] = [round(r.get("action_entropy", 0.0), 3) for r in steps]
        result[name] = entry
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, nargs="?", help="the run of `agentflow train -c train_executor.yaml`")
    parser.add_argument("--frozen", type=Path, default=None,
                        help="the run whose step-0 evaluation is the frozen one (default: RUN itself)")
    parser.add_argument("--mixed", type=Path, nargs=3, metavar=("PLANNER_RUN", "ROLES_RUN", "FROZEN_RUN"),
                        help="add the mixed task's comparison to --out (an existing summary)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.mixed:
        summary = json.loads(args.out.read_text()) if args.out and args.out.is_file() else {}
        summary["mixed_comparison"] = mixed_comparison(*args.mixed)
        text = json.dumps(summary, indent=2)
        print(json.dumps(summary["mixed_comparison"], indent=2))
        if args.out:
            args.out.write_text(text + "\n")
        return
    if args.run is None:
        parser.error("give RUN, or --mixed")

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
            "rollout_python_right": rollout_measure(args.run),
        },
    }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
