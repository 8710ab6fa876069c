"""Seconds and peak memory of one Flow-GRPO update on a recorded step's rollouts, under several update settings.

The rows are a real step's planner calls (a training run's `DIR/rollouts/step-N.jsonl`: prompt and reply ids,
the engine's log-probs, rewards), so every setting updates the same rows from the same weights; only the update
runs (the trainer's own `_grpo_step`, its rollouts replaced by the recorded ones). Each setting runs in a fresh
process, so its peak RSS is its own. The loss and gradient norm are printed too: settings that only change how
the work is cut up must agree on them. Run it on a quiet machine.

    python benchmarks/update_speed.py --rollouts RUN/rollouts/step-000002.jsonl \
        --config src/agentflow/configs/train_mixed.yaml \
        --setting "gradient_checkpointing=true micro_batch_tokens=4096 share_prompt_prefix=false" \
        --setting "gradient_checkpointing=false micro_batch_tokens=1024" [--out benchmarks/results/update_speed.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml


def parse_setting(text: str) -> dict[str, Any]:
    """"key=value key=value" (values in YAML) as a dict."""
    pairs = (item.split("=", 1) for item in text.split())
    return {key: yaml.safe_load(value) for key, value in pairs}


def one_update(rollouts: Path, config: Path, setting: dict[str, Any], out: Path) -> dict[str, Any]:
    """Set up the trainer of `config` + `setting` and run its update on the recorded `rollouts` (in this process)."""
    from agentflow.scoring.base import Score
    from agentflow.train import trainer as trainer_module
    from agentflow.train.config import TrainConfig
    from agentflow.train.data import Question
    from agentflow.train.rollout import Rollout, RolloutBatch
    from agentflow.trajectory import Trajectory

    raw = TrainConfig.from_yaml(config).model_dump()  # its flow file read as training reads it
    raw.update(setting, output_dir=str(out), max_steps=1, eval_at_start=False, eval_every=0)
    cfg = TrainConfig.from_dict(raw)
    questions: dict[str, Question] = {}
    recorded: list[Rollout] = []
    for line in rollouts.read_text().splitlines():
        record = json.loads(line)
        if record["reward"] is None:  # excluded for an infrastructure failure: not trained
            continue
        question = questions.setdefault(record["group"], Question(
            id=record["group"], question=record["question"], answer=record["gold"], reward="recorded"))
        recorded.append(Rollout(question, int(record["id"].rsplit("#", 1)[1]),
                                Trajectory.model_validate(record["trajectory"]),
                                Score(correct=record["reward"] > 0, value=record["reward"])))

    async def replay(flow: Any, batch: Any, **_: Any) -> RolloutBatch:  # run_rollouts's options do not matter
        return RolloutBatch(rollouts=recorded, seconds=0.0)

    trainer_module.run_rollouts = replay  # type: ignore[assignment]
    trainer = trainer_module.Trainer(cfg)
    trainer.out_dir.mkdir(parents=True, exist_ok=True)
    trainer._setup()
    metrics = asyncio.run(trainer._grpo_step(list(questions.values())))
    keys = ("seconds/update", "seconds/ref_logprobs", "rows", "loss", "grad_norm", "kl_ref",
            "update/prefix_tokens_saved", "ref_logprobs/prefix_tokens_saved", "update/response_tokens_cut")
    return {"setting": setting, **{key: metrics[key] for key in keys if key in metrics},
            "tokens": sum(len(c.completion.prompt_token_ids) + len(c.completion.token_ids)
                          for r in recorded for c in r.trajectory.role_calls("planner")),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=Path, required=True, help="a run's rollouts/step-N.jsonl")
    parser.add_argument("--config", type=Path, default=Path("src/agentflow/configs/train_mixed.yaml"))
    parser.add_argument("--setting", action="append", default=[], help='"key=value ..." over the config')
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child process's setting, as JSON
    args = parser.parse_args()
    if args.one is not None:
        with tempfile.TemporaryDirectory(prefix="update-speed-") as work:
            print(json.dumps(one_update(args.rollouts, args.config, json.loads(args.one), Path(work))))
        return
    results = []
    for text in args.setting or [""]:
        started = time.perf_counter()
        child = subprocess.run([sys.executable, __file__, "--rollouts", str(args.rollouts), "--config",
                                str(args.config), "--one", json.dumps(parse_setting(text))],
                               check=True, capture_output=True, text=True)
        result = json.loads(child.stdout.strip().splitlines()[-1])
        result["wall_seconds_with_setup"] = time.perf_counter() - started
        print(json.dumps(result), flush=True)
        results.append(result)
    summary = {"rollouts": str(args.rollouts), "config": str(args.config), "results": results}
    if args.out:
        args.out.write_text(json.dumps(summary, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
