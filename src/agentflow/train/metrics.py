"""Training metrics: one JSON line per log call in DIR/metrics.jsonl, TensorBoard scalars, and a rich line."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

HEADLINE = ("reward_mean", "accuracy", "no_signal_share", "turns_per_trajectory", "tool_choice_accuracy",
            "kl_ref", "clip_fraction", "entropy", "grad_norm", "seconds/rollout", "seconds/update",
            "eval/accuracy_all")


class MetricsLogger:
    def __init__(self, out_dir: Path, *, console: Any = None, tensorboard: bool = True) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "metrics.jsonl"
        self.console = console
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(out_dir / "tensorboard"))
            except ImportError:  # tensorboard is a dependency, but a missing one must not stop training
                log.warning("tensorboard is not installed; metrics go to metrics.jsonl only")
        self._file = self.path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, "time": round(time.time(), 3), **metrics}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self.writer is not None:
            for key, value in metrics.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    self.writer.add_scalar(key, value, step)
            self.writer.flush()
        if self.console is not None:
            shown = [f"{k}={metrics[k]:.3g}" for k in HEADLINE if isinstance(metrics.get(k), int | float)]
            if shown:
                self.console.print(f"[bold]step {step}[/bold] " + " ".join(shown))

    def close(self) -> None:
        self._file.close()
        if self.writer is not None:
            self.writer.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no metrics.jsonl in {run_dir}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
