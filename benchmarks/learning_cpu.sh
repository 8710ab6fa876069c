#!/usr/bin/env bash
# Flow-GRPO learning demonstration on CPU: evaluate the frozen bundled planner on the held-out split of the
# shipped tool_use task, train it inside the live flow, evaluate again, draw the curves.
#   [CONFIG=FILE] bash benchmarks/learning_cpu.sh [OUT_DIR] [extra `agentflow train` options, e.g. --max-steps 4]
# Results: OUT_DIR/metrics.jsonl (eval/accuracy_all at step 0 = frozen, at the last step = trained),
# OUT_DIR/eval/*.jsonl (per question), OUT_DIR/curves.png, OUT_DIR/final/ (adapter, merged model, GGUF).
set -euo pipefail
CONFIG=${CONFIG:-src/agentflow/configs/train_cpu_demo.yaml}
OUT=${1:-runs/learning_cpu}
shift || true
export OMP_WAIT_POLICY=PASSIVE TOKENIZERS_PARALLELISM=false
start=$(date +%s)
python -m agentflow.train.cli --config "$CONFIG" --out "$OUT" "$@"
python -m agentflow.train.cli plot "$OUT"
python - "$OUT" "$start" <<'PY'
import json, sys, time
from pathlib import Path
out, start = Path(sys.argv[1]), float(sys.argv[2])
rows = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
evals = [r for r in rows if "eval/accuracy_all" in r]
frozen, trained = evals[0], evals[-1]
summary = {"frozen_accuracy": frozen["eval/accuracy_all"], "trained_accuracy": trained["eval/accuracy_all"],
           "frozen_by_kind": {k: v for k, v in frozen.items() if k.startswith("eval/accuracy/")},
           "trained_by_kind": {k: v for k, v in trained.items() if k.startswith("eval/accuracy/")},
           "frozen_tool_choice": frozen.get("eval/tool_choice_accuracy"),
           "trained_tool_choice": trained.get("eval/tool_choice_accuracy"),
           "held_out_questions": trained["eval/questions"], "steps": trained["step"],
           "wall_seconds": round(time.time() - start)}
print(json.dumps(summary, indent=2))
(out / "summary.json").write_text(json.dumps(summary, indent=2))
PY
