"""What a second trained role costs: parameters, optimiser state and peak RSS of `agentflow train` with
`train_roles: [planner]` and with `[planner, executor]` (one LoRA adapter each over one base), in the same flow
(the executor moved onto the policy's engine in both, so only the trained roles differ), each in a fresh
process whose own peak RSS is read from the kernel (`wait4`).

    python benchmarks/train_roles_memory.py --config src/agentflow/configs/train_mixed.yaml --steps 1 \
        [--micro-batch-tokens 1024] [--out benchmarks/results/train_roles_memory.json]

`--micro-batch-tokens` bounds the update's activations, the largest term of the peak; both runs use the same.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from agentflow.config import read_yaml_mapping


def adapter_parameters(raw: dict[str, Any]) -> int:
    """Parameters of one LoRA adapter of the config's policy (loads the base once)."""
    from peft import LoraConfig, get_peft_model

    from agentflow.engines.hf import load_policy
    from agentflow.train.config import TrainConfig

    cfg = TrainConfig.model_validate(raw)
    model, _ = load_policy(cfg.policy, trainable=True)
    model = get_peft_model(model, LoraConfig(r=cfg.lora.rank, lora_alpha=cfg.lora.alpha,
                                             target_modules=cfg.lora.targets, task_type="CAUSAL_LM"))
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def run(raw: dict[str, Any], roles: list[str], steps: int, work: Path) -> dict[str, Any]:
    config = {**raw, "train_roles": roles}
    name = "+".join(roles)
    path = work / f"train_{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    out = work / name
    started = time.perf_counter()
    child = subprocess.Popen([str(Path(sys.executable).parent / "agentflow"), "train", "--config", str(path),
                              "--out", str(out), "--max-steps", str(steps)])
    _, status, usage = os.wait4(child.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"agentflow train ({name}) failed: exit {os.waitstatus_to_exitcode(status)}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps_done = [r for r in records if "seconds/step" in r]
    rows = {role: sum(r.get("rows" if role == "planner" else f"{role}/rows", 0) for r in steps_done)
            for role in roles}
    return {"train_roles": roles, "peak_rss_mb": round(usage.ru_maxrss / 1024), "rows": rows,
            "seconds_per_step": round(sum(r["seconds/step"] for r in steps_done) / len(steps_done), 1),
            "wall_seconds": round(time.perf_counter() - started)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--micro-batch-tokens", type=int, default=1024)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    raw = read_yaml_mapping(args.config)
    if isinstance(raw.get("flow"), str):
        raw["flow"] = read_yaml_mapping(args.config.parent / raw["flow"])
    flow = raw["flow"]
    flow["roles"]["executor"]["engine"] = flow["roles"]["planner"]["engine"]
    raw.update(eval_at_start=False, eval_every=0, eval_size=1, save_every=1000, export_gguf=False,
               micro_batch_tokens=args.micro_batch_tokens)
    with tempfile.TemporaryDirectory(prefix="train_roles_memory_") as tmp:
        one = run(raw, ["planner"], args.steps, Path(tmp))
        two = run(raw, ["planner", "executor"], args.steps, Path(tmp))
    params = adapter_parameters(raw)
    summary = {
        "config": str(args.config), "steps": args.steps, "micro_batch_tokens": args.micro_batch_tokens,
        "adapter_parameters": params, "adapter_mb_fp32": round(params * 4 / 2**20, 1),
        "adamw_state_mb": round(2 * params * 4 / 2**20, 1), "gradients_mb": round(params * 4 / 2**20, 1),
        "runs": [one, two],
        "peak_rss_extra_mb": two["peak_rss_mb"] - one["peak_rss_mb"],
    }
    text = json.dumps(summary, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
