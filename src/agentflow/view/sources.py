"""What each PATH given to `agentflow view` is: a trajectory file, an eval run or a training run directory."""

from __future__ import annotations

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
