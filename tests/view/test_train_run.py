"""A training run directory as the viewer reads it, in the trainer's present format and with the fields it is
gaining (group, advantages, failure, trajectory; per-turn tool shares)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentflow.view.api import dumps
from agentflow.view.train_run import TrainRunView, groups_of
from tests.view.builders import train_run


@pytest.mark.parametrize("new_format", [False, True])
def test_overview_and_step_groups(tmp_path: Path, new_format: bool) -> None:
    view = TrainRunView(train_run(tmp_path / "run", new_format=new_format))
    data = view.overview()
    assert data["steps"] == [1, 2] and data["lines"] == 4
    assert [e["label"] for e in data["evals"]] == ["step-1", "step-2"] and data["evals"][0]["accuracy"] == 1.0
    assert json.loads(dumps(data))["metrics"][0]["loss"] is None      # a NaN loss is sent as null
    step = view.step(1)
    assert [g["group"] for g in step["groups"]] == ["q0", "q1"]
    group = step["groups"][0]
    assert group["reward_mean"] == 0.5 and group["signal"] and len(group["rollouts"]) == 2
    first = group["rollouts"][0]
    assert first["tools"] == ["python", "wikipedia_search"] and first["index"] == "0"
    assert first["advantages"] == ([0.7071, 0.7071] if new_format else None)
    assert first["has_trajectory"] is new_format
    assert step["metrics"]["reward_mean"] == 0.25 and step["metrics"]["eval/accuracy_all"] == 0.5
    rollout = view.rollout(1, "q1#1")
    assert rollout["gold"] == "x"
    if new_format:
        assert rollout["trajectory"]["turns"][0]["tool"] == "python" and rollout["trajectory_problem"] is None
        completion = rollout["trajectory"]["turns"][0]["planner"]["completion"]
        assert completion["text"] == '{"tool_name": "python"}' and "token_ids" not in completion  # not shown
    else:
        assert rollout["trajectory"] is None and "did not record" in rollout["trajectory_problem"]
    assert view.step(9) is None and view.rollout(1, "nope") is None
    assert view.held_out("step-2")["rows"][0]["correct"] is True and view.held_out("step-9") is None


def test_metrics_followed_while_training(tmp_path: Path) -> None:
    run = train_run(tmp_path / "run", new_format=False)
    view = TrainRunView(run)
    first = view.overview()
    with (run / "metrics.jsonl").open("a") as handle:
        handle.write(json.dumps({"step": 3, "reward_mean": 0.9}) + "\n" + '{"step": 4, "rew')
    update = view.overview(after=first["lines"], generation=first["generation"])
    assert update["metrics"] == [{"step": 3, "reward_mean": 0.9}] and update["lines"] == 5
    assert update["idle_seconds"] is not None and update["idle_seconds"] < 60


def test_groups_without_group_field_use_the_id_and_exclude_infrastructure_failures() -> None:
    records = [{"id": "a#0", "reward": 1.0}, {"id": "a#1", "reward": None, "infrastructure": "engine_timeout"},
               {"id": "b#0", "reward": 0.0}, {"id": "b#1", "reward": 0.0}]
    groups = groups_of(records)
    assert [g["group"] for g in groups] == ["a", "b"]
    assert groups[0]["reward_mean"] == 1.0 and not groups[0]["signal"] and groups[0]["reward_std"] == 0.0
    assert not groups[1]["signal"]
