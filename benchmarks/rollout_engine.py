"""Steps per hour of Flow-GRPO with the planner's rollouts on transformers (before) and on llama.cpp with the
adapter synced each step (after), in the same training config, each in a fresh `agentflow train` process.

Per step it reads the run's metrics: seconds of the step, of its rollout, update and sync, the sync's bytes,
the prompt tokens read and taken from the prompt cache per role, and (llama.cpp) the log-prob gap to the
trainer before and after truncated importance sampling. Evaluation is cut to one held-out question (it is not
part of a step's time). Run it on a quiet machine: every other process on the cores changes the numbers.

    python benchmarks/rollout_engine.py --config src/agentflow/configs/train_mixed.yaml --steps 3 \
        [--engines transformers,llamacpp] [--out benchmarks/results/rollout_engine_summary.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import xllamacpp
import yaml

from agentflow.train.config import TrainConfig

PHASES = ("seconds/step", "seconds/rollout", "seconds/update", "sync/seconds", "sync/bytes", "rows",
          "rollout_planner_tokens_per_s", "logprob_gap/mean", "logprob_gap/max", "logprob_gap/share_over",
          "logprob_gap/after_tis_mean", "tis/truncated_share", "logprob_gap/mask_disagreements", "reward_mean")
TOKENS = ("rollout/prompt_tokens", "rollout/cached_prompt_tokens")
"""Per step, the prompt tokens of every call and those the engines took from their prompt cache, per role."""


def run(config: Path, engine: str, steps: int, work: Path) -> dict[str, Any]:
    """Train `steps` steps with the planner rolled out on `engine`; the per-step metrics and their means."""
    raw = yaml.safe_load(config.read_text())
    if isinstance(raw.get("flow"), str):
        raw["flow"] = str((config.parent / raw["flow"]).resolve())
    raw["rollout_engine"] = {**raw.get("rollout_engine", {}), "kind": engine}
    raw.update(eval_at_start=False, eval_every=0, eval_size=1, save_every=max(steps, 1), export_gguf=False)
    path = work / f"train_{engine}.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = work / engine
    started = time.perf_counter()
    subprocess.run([str(Path(sys.executable).parent / "agentflow"), "train", "--config", str(path), "--out",
                    str(out), "--max-steps", str(steps)], check=True)
    wall = time.perf_counter() - started
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    per_step = [{key: r[key] for key in r if key in PHASES or key.startswith(TOKENS)} | {"step": r["step"]}
                for r in records if "seconds/step" in r]
    means = {key: statistics.fmean(s[key] for s in per_step if key in s)
             for key in sorted({key for s in per_step for key in s} - {"step"})}
    return {"engine": engine, "steps": per_step, "mean": means, "wall_seconds_with_setup": wall,
            "steps_per_hour": 3600.0 / means["seconds/step"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--engines", default="transformers,llamacpp")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rollout-engine-") as tmp:
        runs = {engine: run(args.config, engine, args.steps, Path(tmp)) for engine in args.engines.split(",")}
    for result in runs.values():
        mean = result["mean"]
        print(f"{result['engine']:>12}: {result['steps_per_hour']:.1f} steps/h  step {mean['seconds/step']:.0f}s = "
              f"rollout {mean['seconds/rollout']:.0f}s + update {mean['seconds/update']:.0f}s"
              + (f" + sync {mean['sync/seconds']:.1f}s ({mean['sync/bytes'] / 2**20:.1f} MiB)"
                 if "sync/seconds" in mean else ""))
    summary: dict[str, Any] = {"config": str(args.config), "steps": args.steps, "runs": runs,
                               "llamacpp_build": xllamacpp.get_system_info().strip()}
    if {"transformers", "llamacpp"} <= runs.keys():
        before, after = runs["transformers"], runs["llamacpp"]
        flow = TrainConfig.from_yaml(args.config).flow
        summary.update({
            "engine": "llamacpp",
            # the executor writes every tool call: no tool has an input fixed in the config
            "executor_in_loop": not any("input" in tool for tool in flow.tools.values()),
            "steps_per_hour_before": round(before["steps_per_hour"], 2),
            "steps_per_hour_after": round(after["steps_per_hour"], 2),
            "sync_seconds": round(after["mean"].get("sync/seconds", float("nan")), 3),
            "sync_bytes": int(after["mean"].get("sync/bytes", 0)),
            "logprob_gap_mean": after["mean"].get("logprob_gap/mean"),
            "logprob_gap_max": max(s.get("logprob_gap/max", 0.0) for s in after["steps"]),
            "logprob_gap_after_tis_mean": after["mean"].get("logprob_gap/after_tis_mean"),
            "tis": {"enabled": True, "cap": yaml.safe_load(args.config.read_text()).get(
                "rollout_engine", {}).get("tis_cap", 2.0)}})
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
