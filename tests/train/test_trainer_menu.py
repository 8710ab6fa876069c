"""group_menu_orders through the trainer (tiny random policy, fast): a group's trajectories see K menu orders
(the variants their menus are drawn from: tests/test_flow.py), G / K each, new each step; each rollout
record's trajectory says which."""

from __future__ import annotations

import json
from pathlib import Path

from agentflow.train.trainer import Trainer
from tests.train.test_trainer_resume import config, helper, one_thread, policy  # noqa: F401 (one_thread: fixture)


def test_a_group_sees_k_menu_orders_g_over_k_trajectories_each(tmp_path: Path) -> None:
    base = config(tmp_path, "orders", 2)
    flow = base.flow.model_copy(update={"shuffle_tools": True})
    cfg = base.model_copy(update={"flow": flow, "group_size": 4, "group_shares_menu": True,
                                  "group_menu_orders": 2})
    Trainer(cfg, engines={"policy": policy(), "helper": helper()}).run()
    run = tmp_path / "orders"
    for step, variants in ((1, [2, 2, 3, 3]), (2, [4, 4, 5, 5])):
        records = [json.loads(line) for line in
                   (run / "rollouts" / f"step-{step:06d}.jsonl").read_text().splitlines()]
        by_group: dict[str, list[int]] = {}
        for record in records:
            by_group.setdefault(record["group"], []).append(record["trajectory"]["variant"])
        assert len(by_group) == 2 and all(sorted(v) == variants for v in by_group.values())
