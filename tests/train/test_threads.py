"""torch's thread count during training: the policy engine's while rolling out, torch_threads while updating."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from agentflow.train.config import TrainConfig
from agentflow.train.trainer import Trainer


def test_the_update_gets_torch_threads_and_the_rollouts_get_the_policy_engines(monkeypatch: pytest.MonkeyPatch):
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    config = TrainConfig.from_dict({"torch_threads": 2, "flow": {
        "engines": {"policy": {"kind": "transformers", "n_threads": 1}, "default": {"kind": "llamacpp"}},
        "roles": {"planner": {"engine": "policy"}}}})
    with Trainer._update_threads(SimpleNamespace(config=config)):
        assert calls == [2]
    assert calls == [2, 1]
