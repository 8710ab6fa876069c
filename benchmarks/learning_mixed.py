"""The mixed task's learning result over seeds: `benchmarks/results/learning_mixed_summary.json`.

Each seed is one `agentflow train` run in a fresh process (its step-0 evaluation is the frozen planner, its last
one the trained planner, all held-out questions, greedy; a seed trained with `eval_at_start: false` takes the
frozen evaluation of the run named by `--frozen`); the ceiling and the constants come from
`planner_ceiling.py` on the same questions; `--frozen-again` is one more evaluation of the frozen planner (the
evaluation's own noise).

    for seed in 0 1 2; do
        agentflow train -c src/agentflow/configs/train_mixed.yaml --seed $seed --max-steps 15 --out runs/mixed_s$seed
    done
    agentflow train -c src/agentflow/configs/train_mixed.yaml --algorithm frozen --out runs/mixed_frozen_again
    python benchmarks/learning_mixed.py runs/mixed_s0 runs/mixed_s1 runs/mixed_s2 \
        --frozen-again runs/mixed_frozen_again --ceiling benchmarks/results/mixed_ceiling_heldout.json \
        --out benchmarks/results/learning_mixed_summary.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def read_metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def evaluations(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if "eval/accuracy_all" in r]


def per_kind(record: dict[str, Any]) -> dict[str, float]:
    return {k.removeprefix("eval/accuracy/"): round(v, 4) for k, v in record.items()
            if k.startswith("eval/accuracy/")}


def per_turn(record: dict[str, Any]) -> dict[str, float]:
    """Share of each action at each turn, e.g. {'turn1/python': 0.33, ...} (zero shares left out)."""
    return {k.removeprefix("eval/tool/"): round(v, 3) for k, v in record.items()
            if k.startswith("eval/tool/turn") and v}


def per_kind_turn_tools(run: Path, label: str, kinds: dict[str, str]) -> dict[str, dict[str, float]]:
    """For each kind, the share of each tool sequence in the evaluation `label` (DIR/eval/LABEL.jsonl)."""
    counts: dict[str, dict[str, int]] = {}
    for line in (run / "eval" / f"{label}.jsonl").read_text().splitlines():
        record = json.loads(line)
        kind = kinds.get(record["id"], "all")
        sequence = " > ".join(str(t) for t in record["tools"]) or "(none)"
        counts.setdefault(kind, {}).setdefault(sequence, 0)
        counts[kind][sequence] += 1
    return {kind: {seq: round(n / sum(c.values()), 3) for seq, n in sorted(c.items(), key=lambda kv: -kv[1])[:5]}
            for kind, c in sorted(counts.items())}


def question_kinds(config: dict[str, Any]) -> dict[str, str]:
    """The kind of every training and held-out question, by id."""
    from agentflow.train.config import TrainConfig
    from agentflow.train.data import default_paths, load_questions

    cfg = TrainConfig.model_validate(config)
    train, held_out = default_paths(cfg.data.task)
    items = [*load_questions(cfg.data.train_path or train, cfg.data),
             *load_questions(cfg.data.eval_path or held_out, cfg.data)]
    return {q.id: str(q.meta.get("kind", "all")) for q in items}


def rollout_first_tools(run: Path, kinds: dict[str, str]) -> dict[str, list[dict[str, float]]]:
    """For each kind, per training step, the share of its rollouts whose first action was each tool: where a
    collapse to one plan shows (the token entropy does not: the free sub-goal text keeps it high)."""
    shares: dict[str, list[dict[str, float]]] = {}
    for path in sorted((run / "rollouts").glob("step-*.jsonl")):
        counts: dict[str, dict[str, int]] = {}
        for line in path.read_text().splitlines():
            record = json.loads(line)
            first = str(record["tools"][0]) if record["tools"] else "(none)"
            kind_counts = counts.setdefault(kinds.get(record["group"], "all"), {})
            kind_counts[first] = kind_counts.get(first, 0) + 1
        for kind in sorted(set(kinds.values())):
            total = sum(counts.get(kind, {}).values())
            shares.setdefault(kind, []).append(
                {tool: round(n / total, 3) for tool, n in sorted(counts[kind].items())} if total else {})
    return shares


def rollout_plans(run: Path, kinds: dict[str, str]) -> dict[str, dict[str, dict[str, float]]]:
    """For each kind, over all training steps, the rollouts grouped by plan (first tool, then the set of tools
    used in any turn: "python > {python, wikipedia_search}"): how many and their mean reward. What the outcome
    reward pays a first tool for, given what the later turns do. Where the rollouts record whether the answer
    was right (runs since `correct` was written), also the share right: with `tool_call_cost` the reward is not."""
    plans: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for path in sorted((run / "rollouts").glob("step-*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["reward"] is None:  # excluded: an infrastructure failure
                continue
            tools = [str(t) for t in record["tools"]]
            plan = f"{tools[0]} > {{{', '.join(sorted(set(tools) - {'answer'}))}}}" if tools else "(none)"
            plans.setdefault(kinds.get(record["group"], "all"), {}).setdefault(plan, []).append(record)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for kind, by_plan in sorted(plans.items()):
        for plan, records in sorted(by_plan.items()):
            entry = {"rollouts": len(records),
                     "reward_mean": round(statistics.fmean(r["reward"] for r in records), 3)}
            if all("correct" in r for r in records):
                entry["right_share"] = round(statistics.fmean(bool(r["correct"]) for r in records), 3)
            out.setdefault(kind, {})[plan] = entry
    return out


def frozen_evaluation(run: Path) -> dict[str, Any] | None:
    evals = evaluations(read_metrics(run))
    return evals[0] if evals and evals[0].get("step") == 0 else None


def seed_summary(run: Path, kinds: dict[str, str], frozen_run: Path | None = None) -> dict[str, Any]:
    """One seed's numbers; its frozen evaluation is its own step-0 one, or (a run trained with eval_at_start:
    false) `frozen_run`'s."""
    rows = read_metrics(run)
    config = json.loads((run / "config.json").read_text())
    evals = [r for r in evaluations(rows) if r.get("step") != 0]
    source = run if frozen_evaluation(run) is not None else frozen_run
    frozen = frozen_evaluation(source) if source is not None else None
    if frozen is None or not evals:
        raise SystemExit(f"{run}: needs a final evaluation in metrics.jsonl, and a step-0 (frozen) one there or "
                         "in the --frozen run")
    assert source is not None
    trained = evals[-1]
    steps = [r for r in rows if "seconds/step" in r]
    train_seconds = sum(r["seconds/step"] for r in steps)
    last = max(int(p.stem.removeprefix("step-")) for p in (run / "eval").glob("step-*.jsonl"))
    return {
        "run": str(run), "seed": config["seed"], "config": config, "frozen_run": str(source),
        "frozen_accuracy": frozen["eval/accuracy_all"], "trained_accuracy": trained["eval/accuracy_all"],
        "held_out_questions": trained["eval/questions"],
        "frozen_by_kind": per_kind(frozen), "trained_by_kind": per_kind(trained),
        "frozen_tools_by_turn": per_turn(frozen), "trained_tools_by_turn": per_turn(trained),
        "frozen_sequences_by_kind": per_kind_turn_tools(source, "step-0", kinds),
        "trained_sequences_by_kind": per_kind_turn_tools(run, f"step-{last}", kinds),
        "frozen_tool_choice_accuracy": frozen.get("eval/tool_choice_accuracy"),
        "trained_tool_choice_accuracy": trained.get("eval/tool_choice_accuracy"),
        "steps": len(steps),
        "rollout_first_tool_by_kind": rollout_first_tools(run, kinds),
        "rollout_plans_by_kind": rollout_plans(run, kinds),
        "per_step": {name: [round(r.get(name, 0.0), 4) for r in steps] for name in (
            "reward_mean", "accuracy", "entropy", "grad_norm", "no_signal_share", "tool_choice_accuracy",
            "turns_per_trajectory", "clip_fraction_last_epoch", "excluded_share", "action_entropy", "seconds/step")},
        "phase_seconds": {
            "training_steps": round(train_seconds),
            "rollouts": round(sum(r.get("seconds/rollout", 0.0) for r in steps)),
            "updates": round(sum(r.get("seconds/update", 0.0) + r.get("seconds/masks", 0.0)
                                 + r.get("seconds/old_logprobs", 0.0) + r.get("seconds/ref_logprobs", 0.0)
                                 for r in steps)),
            "syncs": round(sum(r.get("sync/seconds", 0.0) for r in steps)),
            "eval_frozen": round(frozen["eval/seconds"]), "eval_trained": round(trained["eval/seconds"])},
        "steps_per_hour": round(3600 * len(steps) / max(train_seconds, 1e-9), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="one run directory per seed")
    parser.add_argument("--frozen", type=Path, default=None,
                        help="the frozen evaluation (a run's step-0 one) of seeds trained with eval_at_start: false")
    parser.add_argument("--frozen-again", type=Path, default=None, help="a run of --algorithm frozen")
    parser.add_argument("--ceiling", type=Path, default=None,
                        help="planner_ceiling.py's JSON (oracle, constants) on the same held-out questions; without "
                             "it, the seeds' frozen and trained numbers alone (runs evaluated on a subset)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    first_config = json.loads((args.runs[0] / "config.json").read_text())
    kinds = question_kinds(first_config)
    seeds = [seed_summary(run, kinds, args.frozen) for run in args.runs]
    for s in seeds:
        s.pop("config")
    frozen_runs = {s["frozen_run"]: s["frozen_accuracy"] for s in seeds}  # each frozen evaluation once
    ceiling = json.loads(args.ceiling.read_text()) if args.ceiling else None
    constants = {m.removeprefix("const:"): r["accuracy"] for m, r in (ceiling or {}).items()
                 if m.startswith("const:")}
    best = max(constants, key=constants.get) if constants else None
    frozen = list(frozen_runs.values())
    if args.frozen_again is not None:
        frozen.append(evaluations(read_metrics(args.frozen_again))[0]["eval/accuracy_all"])
    trained = [s["trained_accuracy"] for s in seeds]
    frozen_mean, trained_mean = statistics.mean(frozen), statistics.mean(trained)
    tools = first_config["flow"]["tools"]
    kind_names = sorted(set(kinds.values()))
    summary = {
        "task": first_config["data"]["task"], "kinds": kind_names,
        "held_out_questions": seeds[0]["held_out_questions"],
        "max_turns": first_config["flow"]["limits"]["max_turns"],
        "fixed_tool_inputs": any(isinstance(t, dict) and t.get("input") for t in tools.values()),
        "planner_writes_whole_reply": first_config.get("planner_prefix") is None,
        "frozen_accuracy": round(frozen_mean, 4),
        "frozen_evaluations": frozen,
        # every frozen evaluation (a seed's step 0, --frozen-again) is one of the same greedy planner: their
        # spread is the evaluation's noise
        "eval_noise_points": round(100 * (max(frozen) - min(frozen)), 1) if len(frozen) > 1 else None,
        "trained_accuracy": round(trained_mean, 4), "trained_accuracy_by_seed": trained,
        "seeds": [s["seed"] for s in seeds],
        "gain_over_frozen_points": round(100 * (trained_mean - frozen_mean), 1),
        "gain_over_frozen_points_by_seed": [round(100 * (s["trained_accuracy"] - s["frozen_accuracy"]), 1)
                                            for s in seeds],
        "best_constant_accuracy": constants[best] if best else None,
        "best_constant_sequence": best.split("+") if best else None,
        "gain_over_best_constant_points": round(100 * (trained_mean - constants[best]), 1) if best else None,
        "ceiling_accuracy": ceiling["oracle"]["accuracy"] if ceiling else None,
        "ceiling_by_kind": ceiling["oracle"]["by_kind"] if ceiling else None,
        "best_constant_by_kind": ceiling[f"const:{best}"]["by_kind"] if ceiling and best else None,
        "frozen_by_kind": {k: round(statistics.mean(s["frozen_by_kind"].get(k, 0.0) for s in seeds), 4)
                           for k in kind_names},
        "trained_by_kind": {k: round(statistics.mean(s["trained_by_kind"].get(k, 0.0) for s in seeds), 4)
                            for k in kind_names},
        "steps": [s["steps"] for s in seeds],
        "batch_size": first_config["batch_size"], "group_size": first_config["group_size"],
        "rollout_engine": first_config.get("rollout_engine", {}).get("kind", "transformers"),
        "steps_per_hour": round(statistics.mean(s["steps_per_hour"] for s in seeds), 1),
        "wall_seconds_by_phase": {k: [s["phase_seconds"][k] for s in seeds] for k in seeds[0]["phase_seconds"]},
        "by_seed": seeds,
    }
    text = json.dumps(summary, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
