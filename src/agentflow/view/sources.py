"""What each PATH given to `agentflow view` is: a trajectory file, an eval run or a training run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentflow.errors import ConfigError
from agentflow.view.eval_run import EvalRunView, read_json_file, without_token_arrays
from agentflow.view.train_run import TrainRunView


class TrajectoryFileView:
    """One trajectory JSON (`agentflow solve --trajectory-out`, or a file under an eval run's trajectories/)."""

    kind = "trajectory"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.directory = path.parent

    def overview(self, **_: Any) -> dict[str, Any]:
        trajectory, problem = read_json_file(self.path)
        if trajectory is not None and not (isinstance(trajectory, dict) and "question" in trajectory):
            trajectory, problem = None, f"{self.path.name} is not a trajectory (no 'question' key)"
        return {"kind": "trajectory_file", "path": str(self.path), "name": self.path.name,
                "trajectory": without_token_arrays(trajectory), "trajectory_problem": problem}


Source = EvalRunView | TrainRunView | TrajectoryFileView


def _readable_lines(path: Path) -> bool | None:
    """None: the file is missing or empty (a run that has not written yet); else whether a line is a JSON
    object."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    if not text.strip():
        return None
    for line in text.splitlines():
        try:
            if isinstance(json.loads(line), dict):
                return True
        except ValueError:
            continue
    return False


def problem_of(source: Source) -> str | None:
    """Why a source shows nothing (one line), or None. Checked once at start, so the terminal says it before
    any page does."""
    if isinstance(source, TrajectoryFileView):
        return source.overview()["trajectory_problem"]
    marker = "results.jsonl" if isinstance(source, EvalRunView) else "metrics.jsonl"
    config, _ = read_json_file(source.directory / "config.json")
    if _readable_lines(source.directory / marker) is False and not isinstance(config, dict):
        return f"{marker} has no readable line and config.json is missing or unreadable"
    return None


def open_source(path: Path) -> Source:
    """The view of one PATH, by what it holds; a clear error for anything else."""
    if path.is_file():
        if path.suffix != ".json":
            raise ConfigError(f"{path}: a file to view must be a trajectory .json (a directory for runs)")
        return TrajectoryFileView(path)
    if not path.is_dir():
        raise ConfigError(f"{path} does not exist")
    if (path / "results.jsonl").is_file():
        return EvalRunView(path)
    if (path / "metrics.jsonl").is_file() or (path / "rollouts").is_dir():
        return TrainRunView(path)
    config, _ = read_json_file(path / "config.json")
    if isinstance(config, dict) and "fingerprint" in config:  # an eval run that has not finished an item yet
        return EvalRunView(path)
    if isinstance(config, dict) and "group_size" in config:  # a training run before its first step
        return TrainRunView(path)
    raise ConfigError(f"{path} is neither an eval run (results.jsonl), a training run (metrics.jsonl) nor a "
                      "trajectory .json")


def describe(index: int, source: Source) -> dict[str, Any]:
    path = source.path if isinstance(source, TrajectoryFileView) else source.directory
    return {"index": index, "kind": source.kind, "path": str(path), "name": path.name}
