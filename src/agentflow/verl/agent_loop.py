"""verl's side of the agent loop: `AgentflowAgentLoop`, registered as "agentflow". Imports verl.

verl builds one instance per trajectory (session) and awaits `run`; the v1 trainer accepts a list of
outputs, one per planner turn, stored as `{uid}_{session}_{index}`. All logic lives in
`agentflow.verl.runner`; this class only binds verl's server client and tokenizer and converts the result.

Rewards: every output carries the trajectory's reward (`reward_score`); verl's v1 GRPO reads each
session's last output, normalises over the question's G sessions and copies the advantage to all outputs
of the session: one group-normalised advantage per trajectory, broadcast to its turns (docs/verl.md).
An excluded trajectory returns no output: verl then simply has one session fewer in that group.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any
from uuid import uuid4

from omegaconf import OmegaConf
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from agentflow.verl.config import AGENT_LOOP_NAME, VerlTrainConfig, response_length
from agentflow.verl.data import question_from_row
from agentflow.verl.engine import RolloutServerEngine
from agentflow.verl.runner import FlowRunner, TrajectoryResult

log = logging.getLogger(__name__)

_RUNNERS: dict[str, FlowRunner] = {}
"""One runner per worker process and config (verl instantiates the agent loop once per trajectory)."""


def runner_for(section: dict[str, Any], *, tokenizer: Any, builder: Any) -> FlowRunner:
    """The worker's `FlowRunner` for our config section, built on first use."""
    key = json.dumps(section, sort_keys=True)
    runner = _RUNNERS.get(key)
    if runner is None:
        cfg = VerlTrainConfig.model_validate(section)
        policy = RolloutServerEngine(
            tokenize=builder.build_initial_tokens,
            decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
            model_name=str(cfg.policy.model), response_length=response_length(cfg))
        filler = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else (tokenizer.pad_token_id or 0)
        runner = FlowRunner(cfg, policy, filler_token_id=int(filler),
                            trajectory_dir=Path(cfg.output_dir).absolute() / "trajectories")
        _RUNNERS[key] = runner
    return runner


def to_outputs(result: TrajectoryResult) -> list[AgentLoopOutput]:
    """verl outputs of one trajectory: one per training row, each with the trajectory's reward."""
    if result.excluded is not None or result.rows is None or result.score is None:
        return []
    context = result.context
    versions = {}
    if context is not None and context.min_global_steps is not None:
        versions = {"min_global_steps": context.min_global_steps, "max_global_steps": context.max_global_steps}
    turns = len(result.trajectory.turns)
    planner_seconds = result.planner_seconds
    outputs = []
    for row in result.rows.rows:
        outputs.append(AgentLoopOutput(
            prompt_ids=row.prompt_ids,
            response_ids=row.response_ids,
            response_mask=row.response_mask,
            response_logprobs=row.response_logprobs,
            reward_score=result.score.value,
            num_turns=turns,
            metrics=AgentLoopMetrics(generate_sequences=planner_seconds,
                                     tool_calls=max(result.seconds - planner_seconds, 0.0),
                                     num_preempted=context.preempted if context else -1),
            extra_fields={
                **versions,
                "reward_extra_info": {"acc": float(result.score.correct), "planner_turns": turns},
                "turn_scores": [],
                "tool_rewards": [],
                "agentflow_turn": row.turn,
                "agentflow_question_id": result.question.id,
            },
        ))
    return outputs


@register(AGENT_LOOP_NAME)
class AgentflowAgentLoop(AgentLoopBase):
    """Runs our flow for one verl session; returns one output per planner turn."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        section = self.config.get("agentflow")
        if section is None:
            raise ValueError("verl config has no `agentflow` section: start runs with `agentflow train "
                             "--backend verl` (agentflow.verl.launch), which adds it")
        self.runner = runner_for(OmegaConf.to_container(section, resolve=True), tokenizer=self.tokenizer,
                                 builder=self.continuous_token_builder)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> list[AgentLoopOutput]:
        question = question_from_row(kwargs)
        tags = {k: kwargs[k] for k in ("uid", "session_id", "global_steps") if k in kwargs}
        result = await self.runner.run(question, server=self.server_manager, verl_sampling=sampling_params,
                                       request_id=uuid4().hex, tags=tags)
        outputs = to_outputs(result)
        step = kwargs.get("global_steps")
        for output in outputs:
            # a trajectory whose server reported no policy version is stamped with the batch's step
            output.extra_fields.setdefault("min_global_steps", step)
            output.extra_fields.setdefault("max_global_steps", step)
        return outputs
