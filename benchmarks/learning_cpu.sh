#!/usr/bin/env bash
# Flow-GRPO learning demonstration on 2 CPU cores, over two planner turns: the bundled planner is evaluated
# frozen on the held-out split of the shipped lookup_compute task (twice: the difference is the evaluation's
# own noise), trained inside the live flow, and evaluated again.
#   [CONFIG=FILE] bash benchmarks/learning_cpu.sh [OUT_DIR] [extra `agentflow train` options, e.g. --max-steps 4]
# Results: OUT_DIR/summary.json (the numbers below), OUT_DIR/metrics.jsonl (per step), OUT_DIR/eval/*.jsonl (per
# question), OUT_DIR/curves.png (reward, held-out accuracy, tool picked at each turn), OUT_DIR/final/adapter.
# The ceiling (a scripted planner that picks the right tools) is read from CEILING, written by
#   python benchmarks/planner_ceiling.py --config src/agentflow/configs/train_cpu_demo.yaml --limit 60 \
#       --modes oracle,constants --out benchmarks/results/planner_ceiling_lookup.json
set -euo pipefail
CONFIG=${CONFIG:-src/agentflow/configs/train_cpu_demo.yaml}
CEILING=${CEILING:-benchmarks/results/planner_ceiling_lookup.json}
OUT=${1:-runs/learning_cpu}
shift || true
export OMP_WAIT_POLICY=PASSIVE TOKENIZERS_PARALLELISM=false
start=$(date +%s)
python -m agentflow.train.cli --config "$CONFIG" --out "$OUT" "$@"
trained=$(date +%s)
python -m agentflow.train.cli --config "$CONFIG" --out "$OUT/frozen_again" --algorithm frozen
python -m agentflow.train.cli plot "$OUT"
python - "$OUT" "$start" "$trained" "$CEILING" <<'PY'
import json, sys, time
from pathlib import Path

out, start, trained_at, ceiling_file = Path(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4])
config = json.loads((out / "config.json").read_text())
rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
evals = [r for r in rows if "eval/accuracy_all" in r]
steps = [r for r in rows if "seconds/step" in r]
frozen, trained = evals[0], evals[-1]
again = [json.loads(line) for line in (out / "frozen_again" / "metrics.jsonl").read_text().splitlines()]
again = next(r for r in again if "eval/accuracy_all" in r)


def per_turn(record, prefix):
    return {k.removeprefix(prefix): round(v, 3) for k, v in record.items() if k.startswith(prefix + "tool/turn")}


train_seconds = sum(r["seconds/step"] for r in steps)
summary = {
    "task": config["data"]["task"], "max_turns": config["flow"]["limits"]["max_turns"],
    "frozen_accuracy": frozen["eval/accuracy_all"], "frozen_accuracy_again": again["eval/accuracy_all"],
    "trained_accuracy": trained["eval/accuracy_all"],
    "gain_points": round(100 * (trained["eval/accuracy_all"] - frozen["eval/accuracy_all"]), 1),
    "held_out_questions": trained["eval/questions"],
    "ceiling_accuracy": json.loads(ceiling_file.read_text())["oracle"]["accuracy"] if ceiling_file.is_file() else None,
    "steps": len(steps), "batch_size": config["batch_size"], "group_size": config["group_size"],
    "frozen_tools_by_turn": per_turn(frozen, "eval/"), "trained_tools_by_turn": per_turn(trained, "eval/"),
    "rollout_tools_by_turn": {r["step"]: per_turn(r, "") for r in steps},
    "rollout_reward_by_step": [round(r["reward_mean"], 3) for r in steps],
    "excluded_share_by_step": [round(r.get("excluded_share", 0.0), 3) for r in steps],
    "wall_seconds": round(time.time() - start),
    "phase_seconds": {
        "eval_frozen": round(frozen["eval/seconds"]), "eval_trained": round(trained["eval/seconds"]),
        "eval_frozen_again": round(again["eval/seconds"]),
        "rollouts": round(sum(r.get("seconds/rollout", 0.0) for r in steps)),
        "updates": round(sum(r.get("seconds/update", 0.0) + r.get("seconds/masks", 0.0)
                             + r.get("seconds/ref_logprobs", 0.0) for r in steps)),
        "training_steps": round(train_seconds), "train_command": round(trained_at - start)},
    "steps_per_hour": round(3600 * len(steps) / max(train_seconds, 1e-9), 1),
}
print(json.dumps(summary, indent=2))
(out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
PY
