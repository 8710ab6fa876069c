"""Shared set-up of the verl tests: a config, a runner wired to the fakes, and the registry's advantages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from agentflow.engines.base import Engine
from agentflow.train.advantages import get_advantage
from agentflow.train.data import Question
from agentflow.verl.config import VerlTrainConfig, response_length
from agentflow.verl.engine import RolloutServerEngine
from agentflow.verl.runner import FlowRunner, TrajectoryResult
from tests.conftest import EchoTool
from tests.verl.fakes import EOS, ByteTokenizer


def verl_config(tmp_path: Path, **overrides: Any) -> VerlTrainConfig:
    """Planner on the rollout servers, every other role on a frozen OpenAI-compatible engine, tool `echo`."""
    verl = {"max_prompt_length": 4096, "agent_workers": 1, **overrides.pop("verl", {})}
    limits = {"max_turns": 3, **overrides.pop("limits", {})}
    planner = {"temperature": 1.0, "max_tokens": 64, **overrides.pop("planner", {})}
    raw: dict[str, Any] = {
        "flow": {
            "engines": {
                "policy": {"kind": "transformers", "model": "org/planner"},
                "frozen": {"kind": "openai", "model": "frozen-model", "base_url": "http://127.0.0.1:9/v1",
                           "api_key_env": None},
            },
            "roles": {"planner": {"engine": "policy", "sampling": planner},
                      "executor": {"engine": "frozen"}, "verifier": {"engine": "frozen"},
                      "generator": {"engine": "frozen"}, "tools": {"engine": "frozen"}},
            "tools": {"echo": {}},
            "limits": limits,
            "query_analysis": False,
        },
        "batch_size": 1,
        "group_size": 4,
        "micro_batch_tokens": 8192,
        "output_dir": str(tmp_path / "run"),
        "verl": verl,
        **overrides,
    }
    return VerlTrainConfig.from_dict(raw)


def make_runner(cfg: VerlTrainConfig, frozen: Engine) -> FlowRunner:
    tokenizer = ByteTokenizer()
    policy = RolloutServerEngine(tokenize=tokenizer.apply, decode=tokenizer.decode, model_name="org/planner",
                                 response_length=response_length(cfg))
    return FlowRunner(cfg, policy, filler_token_id=EOS, engines={"frozen": frozen}, tools={"echo": EchoTool()},
                      trajectory_dir=Path(cfg.output_dir) / "trajectories")


def question(answer: Any = "Paris", *, qid: str = "q1", reward: str = "exact_match") -> Question:
    return Question(id=qid, question="What is the capital of France?", answer=answer, reward=reward)


def registry_advantages(results: list[TrajectoryResult], estimator: str) -> list[list[float]]:
    """Per trajectory, the advantage of each of its rows by our registry (as the single-machine trainer
    computes it): the numbers verl must reproduce. Excluded trajectories take no part (empty list)."""
    scored = [r for r in results if r.excluded is None]
    rows = [(t, row) for t, r in enumerate(scored) for row in r.rows.rows if row.trainable]
    values = get_advantage(estimator)(
        rewards=torch.tensor([r.score.value for r in scored]),
        group_ids=[r.question.id for r in scored],
        trajectory_ids=[f"t{t}" for t in range(len(scored))],
        row_trajectory=torch.tensor([t for t, _ in rows], dtype=torch.long),
        eps=1e-6,
    ).tolist()
    out: dict[int, list[float]] = {}
    for (t, _), value in zip(rows, values, strict=True):
        out.setdefault(t, []).append(value)
    by_result = iter(range(len(scored)))
    return [[] if r.excluded is not None else out.get(next(by_result), []) for r in results]
