"""One trajectory of our flow for verl: run it with the planner on the rollout servers, score it, build rows.

This is the whole of the agent loop's logic, kept free of verl imports so it is tested on any machine; the
verl class (`agentflow.verl.agent_loop`) only converts its result into verl's output type.

An agent-loop worker keeps one `FlowRunner`: engines and tools are built once (the Wikipedia index, HTTP
clients) and shared by every trajectory the worker runs. The flow is the same code `solve`, `eval` and the
single-machine trainer run; rewards come from the same scorer registry (`agentflow.train.rollout`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentflow.engines.base import Engine
from agentflow.flow import Flow
from agentflow.scoring.base import Score
from agentflow.tools.base import Tool
from agentflow.train.data import Question
from agentflow.train.rollout import score_trajectory
from agentflow.trajectory import Trajectory
from agentflow.verl.config import VerlTrainConfig, response_length, workers_concurrency
from agentflow.verl.engine import ROLLOUT, RolloutContext, RolloutServerEngine, TokenServer
from agentflow.verl.rows import TrajectoryRows, build_rows

log = logging.getLogger(__name__)


@dataclass
class TrajectoryResult:
    """What one verl session produced: rows with the trajectory's reward, or an exclusion."""

    question: Question
    trajectory: Trajectory
    score: Score | None
    rows: TrajectoryRows | None
    excluded: str | None = None
    """Why the trajectory is not trained on (infrastructure failure kind); None when scored."""
    context: RolloutContext | None = None
    seconds: float = 0.0

    @property
    def planner_seconds(self) -> float:
        return sum(call.seconds for call in self.trajectory.planner_calls())


@dataclass
class RunnerStats:
    """Per-worker counters, logged as they change (verl has no channel for per-trajectory custom metrics)."""

    scored: int = 0
    excluded: Counter[str] = field(default_factory=Counter)
    dropped_rows: Counter[str] = field(default_factory=Counter)
    placeholders: int = 0


class FlowRunner:
    """Runs trajectories of one configured flow for verl. Safe for concurrent `run` calls on one event loop."""

    def __init__(self, cfg: VerlTrainConfig, policy: RolloutServerEngine, *, filler_token_id: int,
                 engines: dict[str, Engine] | None = None, tools: dict[str, Tool] | None = None,
                 trajectory_dir: Path | None = None) -> None:
        self.cfg = cfg
        self.policy = policy
        self.filler_token_id = filler_token_id
        self.response_length = response_length(cfg)
        base = cfg.rollout_flow_config()
        self._base = Flow.from_config(base, engines={**(engines or {}), cfg.policy_engine_name: policy},
                                      tools=tools)
        self._flows: dict[tuple[float, float], Flow] = {self._key(base.roles.planner.sampling): self._base}
        self._gate = asyncio.Semaphore(workers_concurrency(cfg))
        self.stats = RunnerStats()
        self._log_mode = cfg.verl.log_trajectories
        self._log_path: Path | None = None
        if trajectory_dir is not None and self._log_mode != "none":
            trajectory_dir.mkdir(parents=True, exist_ok=True)
            self._log_path = trajectory_dir / f"{socket.gethostname()}-{os.getpid()}.jsonl"

    @staticmethod
    def _key(sampling: Any) -> tuple[float, float]:
        return (round(float(sampling.temperature), 6), round(float(sampling.top_p), 6))

    def flow_for(self, verl_sampling: dict[str, Any]) -> Flow:
        """The flow whose planner settings are those verl asks for (training vs validation sampling), so the
        trajectory records what was actually sent. Flows share engines and tools."""
        base = self._base.config.roles.planner.sampling
        temperature = float(verl_sampling.get("temperature", base.temperature))
        top_p = float(verl_sampling.get("top_p", base.top_p))
        key = (round(temperature, 6), round(top_p, 6))
        flow = self._flows.get(key)
        if flow is None:
            config = self._base.config.model_copy(deep=True)
            config.roles.planner.sampling.temperature = temperature
            config.roles.planner.sampling.top_p = top_p
            flow = self._flows[key] = Flow(config, self._base.engines, self._base.tools)
        return flow

    async def run(self, question: Question, *, server: TokenServer, verl_sampling: dict[str, Any],
                  request_id: str, tags: dict[str, Any] | None = None) -> TrajectoryResult:
        """Run, score and turn into rows one trajectory of `question`.

        Infrastructure failures (engine down, rollout server error) exclude the trajectory: it returns with
        `excluded` set and no rows, and is counted, never scored 0.
        """
        flow = self.flow_for(verl_sampling)
        context = RolloutContext(server=server, request_id=request_id, verl_sampling=dict(verl_sampling))
        start = time.perf_counter()
        async with self._gate:
            token = ROLLOUT.set(context)
            try:
                # each rollout of a group has its own request id: a distinct run variant (tool-menu order)
                trajectory = await flow.asolve(question.question, variant=zlib.crc32(request_id.encode()))
            finally:
                ROLLOUT.reset(token)
        result = TrajectoryResult(question=question, trajectory=trajectory, score=None, rows=None,
                                  context=context, seconds=time.perf_counter() - start)
        failure = trajectory.infrastructure_failure
        if failure is not None:
            result.excluded = failure.kind
            self.stats.excluded[failure.kind] += 1
            log.warning("question %s: trajectory excluded (%s at %s: %s); %d excluded so far on this worker",
                        question.id, failure.kind, failure.stage, failure.message,
                        sum(self.stats.excluded.values()))
        else:
            result.score = score_trajectory(question, trajectory, tool_call_cost=self.cfg.tool_call_cost)
            result.rows = build_rows(trajectory, max_prompt_length=self.cfg.verl.max_prompt_length,
                                     response_length=self.response_length, filler_token_id=self.filler_token_id)
            self.stats.scored += 1
            self.stats.dropped_rows.update(result.rows.dropped)
            if result.rows.placeholder:
                self.stats.placeholders += 1
            if result.rows.dropped:
                log.info("question %s: %s planner turn(s) not trained on (%s)", question.id,
                         sum(result.rows.dropped.values()), dict(result.rows.dropped))
        self._log(result, tags or {})
        return result

    def _log(self, result: TrajectoryResult, tags: dict[str, Any]) -> None:
        if self._log_path is None:
            return
        record: dict[str, Any] = {
            **{k: _plain(v) for k, v in tags.items()},
            "id": result.question.id,
            "reward": result.score.value if result.score else None,
            "correct": result.score.correct if result.score else None,
            "excluded": result.excluded,
            "turns": len(result.trajectory.turns),
            "rows": 0 if result.rows is None or result.rows.placeholder else len(result.rows.rows),
            "dropped": dict(result.rows.dropped) if result.rows else {},
            "answer": result.trajectory.answer,
            "seconds": round(result.seconds, 3),
        }
        if self._log_mode == "full":
            record["trajectory"] = result.trajectory.model_dump(mode="json")
        with self._log_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    async def aclose(self) -> None:
        await self._base.aclose()


def _plain(value: Any) -> Any:
    """numpy scalars from verl's batch -> JSON-able Python values."""
    return value.item() if hasattr(value, "item") else value
