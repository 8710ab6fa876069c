"""`agentflow train plot`: curves drawn from metrics.jsonl, with the tool picked at each planner turn."""

from __future__ import annotations

import json
from pathlib import Path

from agentflow.train.plot import panels_of, plot_run

RECORDS = [
    {"step": 1, "reward_mean": 0.2, "excluded_share": 0.0, "tool/turn1/python": 0.75,
     "tool/turn1/wikipedia_search": 0.25, "tool/turn2/python": 1.0},
    {"step": 2, "reward_mean": 0.5, "excluded_share": 0.1, "tool/turn1/wikipedia_search": 1.0,
     "tool/turn2/python": 0.5, "tool/turn2/wikipedia_search": 0.5},
    {"step": 2, "eval/accuracy_all": 0.4},
]


def test_each_planner_turn_gets_a_panel_of_tool_choices() -> None:
    keys = [key for key, _ in panels_of(RECORDS)]
    assert keys == ["reward_mean", "eval/accuracy_all", "excluded_share", "tool/turn1/", "tool/turn2/"]


def test_the_menu_position_of_the_pick_gets_a_panel_per_turn(tmp_path: Path) -> None:
    records = [{**RECORDS[0], "menu_position/turn1/1": 0.75, "menu_position/turn1/2": 0.25},
               {**RECORDS[1], "menu_position/turn1/1": 0.5, "menu_position/turn1/2": 0.5}]
    keys = [key for key, _ in panels_of(records)]
    assert keys[-3:] == ["tool/turn1/", "tool/turn2/", "menu_position/turn1/"]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert plot_run(tmp_path).read_bytes().startswith(b"\x89PNG")


def test_the_plot_is_written(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    out = plot_run(tmp_path)
    assert out == tmp_path / "curves.png" and out.read_bytes().startswith(b"\x89PNG")


def test_a_run_with_several_trained_roles_draws_each_roles_metrics(tmp_path: Path) -> None:
    from agentflow.train.plot import roles_of

    records = [{"step": s, "reward_mean": 0.1 * s, "rows": 6.0, "entropy": 1.0 / s, "executor/rows": 4.0,
                "executor/entropy": 2.0 / s, "executor/grad_norm": 0.5} for s in (1, 2)]
    assert roles_of(records) == ["executor"]
    keys = [key for key, _ in panels_of(records)]
    # the executor's grad norm has a panel though the planner logged none; rows per role come second
    assert keys == ["reward_mean", "rows", "entropy", "grad_norm"]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert plot_run(tmp_path).read_bytes().startswith(b"\x89PNG")
    assert roles_of(RECORDS) == [] and "rows" not in [key for key, _ in panels_of(RECORDS)]
