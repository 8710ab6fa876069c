"""Rollout: G trajectories per question through the same `Flow` that `solve` and `eval` run, scored with the
scorer registry, turned into one training row per planner call.

Nothing is recomputed here: the prompt ids, response ids and sampling log-probs of each row are those the
policy engine recorded while it generated the reply.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

from agentflow.config import STOP_ACTION
from agentflow.flow import Flow
from agentflow.scoring import get_scorer
from agentflow.scoring.base import Score
from agentflow.train.data import Question
from agentflow.trajectory import Failure, Trajectory

log = logging.getLogger(__name__)


@dataclass
class Rollout:
    """One trajectory of one question, with its score (None when it failed for infrastructure reasons)."""

    question: Question
    index: int
    trajectory: Trajectory
    score: Score | None
    infrastructure: Failure | None = None

    @property
    def trajectory_id(self) -> str:
        return f"{self.question.id}#{self.index}"


@dataclass
class TurnRow:
    """One planner call as a training row."""

    trajectory: int
    prompt_ids: list[int]
    response_ids: list[int]
    old_logprobs: list[float]
    schema: dict[str, Any] | None = None
    """The JSON schema decoding was constrained to (its masks are replayed for the log-probs), or None."""
    allowed: torch.Tensor | None = None
    """(len(response_ids), vocab) booleans rebuilt from `schema` by the trainer; None: unconstrained."""
    engine_logprobs: list[float] | None = None
    """Rows sampled by another engine than the trainer's: its raw log-probs of the response (NaN: unknown);
    the update then recomputes `old_logprobs` itself and sets `tis_weights`."""
    tis_weights: list[float] | None = None
    """Truncated importance weight of each response token (None: 1)."""
    role: str = "planner"
    """The module whose call this is: its adapter computes the row, and only its loss counts the row."""
    action: int | None = None
    """Index in `response_ids` of the row's action: the first token of its schema's enum-valued property (the
    planner's tool, wherever the schema puts it), set with the masks (`logprobs.action_index`); -1: the reply
    never reached it; None: no such property (the action is the first token that was not forced)."""
    action_tokens: list[int] | None = None
    """With `action_logprob: tool`: the tokens the schema allowed at `action` that start the same tool as the one
    drawn (`logprobs.action_tokens`); the action's log-prob is then their total's. None: the drawn token's."""
    action_choices: list[list[int]] | None = None
    """With `action_logprob: tool`: every token the schema allowed at `action`, grouped by the tool each starts
    (`logprobs.action_choices`); the action's entropy is then the tool choice's. None: over the tokens."""


@dataclass
class RolloutBatch:
    """The scored rollouts of one step, infrastructure failures already set aside."""

    rollouts: list[Rollout]
    excluded: list[Rollout] = field(default_factory=list)
    seconds: float = 0.0
    tool_names: list[str] = field(default_factory=list)
    """The flow's tools (and the planner's `answer` action): each gets a share every step, 0 when not picked, so
    a dropped tool's curve reaches 0."""

    def rewards(self) -> torch.Tensor:
        return torch.tensor([r.score.value for r in self.rollouts if r.score is not None], dtype=torch.float32)

    def group_ids(self) -> list[str]:
        return [r.question.id for r in self.rollouts]

    def trajectory_ids(self) -> list[str]:
        return [r.trajectory_id for r in self.rollouts]

    def rows(self, *, engine_logprobs: bool = False, role: str = "planner") -> tuple[list[TurnRow], torch.Tensor]:
        """Training rows (one per call of `role`: the planner's turns by default) and the trajectory index of
        each row. `engine_logprobs`: the policy engine is not the trainer's model, and its log-probs are kept
        as `TurnRow.engine_logprobs`."""
        rows: list[TurnRow] = []
        for t, rollout in enumerate(self.rollouts):
            for turn, call in enumerate(rollout.trajectory.role_calls(role), 1):
                completion = call.completion
                assert completion is not None
                if not completion.prompt_token_ids or completion.token_ids is None or completion.logprobs is None:
                    raise ValueError(f"trajectory {rollout.trajectory_id!r} {role} call {turn}: the policy engine "
                                     f"returned no token ids / log-probs; the {role} must run on the trainer's "
                                     "policy engine (transformers, or the llama.cpp rollout engine)")
                if len(completion.token_ids) != len(completion.logprobs):
                    raise ValueError(f"trajectory {rollout.trajectory_id!r} {role} call {turn}: "
                                     f"{len(completion.token_ids)} tokens but {len(completion.logprobs)} log-probs")
                if not completion.token_ids:
                    continue
                rows.append(TurnRow(t, list(completion.prompt_token_ids), list(completion.token_ids),
                                    list(completion.logprobs), schema=call.response_schema,
                                    engine_logprobs=list(completion.logprobs) if engine_logprobs else None,
                                    role=role))
        return rows, torch.tensor([r.trajectory for r in rows], dtype=torch.long)

    def metrics(self) -> dict[str, Any]:
        """Reward, accuracy, turns and tool choices (overall and per turn index) of the scored trajectories,
        and the share of trajectories excluded for infrastructure failures."""
        scored = self.rollouts
        n = max(len(scored), 1)
        tools = Counter(turn.tool if turn.tool_valid else "invalid" for r in scored for turn in r.trajectory.turns)
        n_turns = sum(tools.values())
        right_tool = [turn.tool == expected for r in scored for turn in r.trajectory.turns
                      if (expected := expected_tool(r.question, turn.index))]
        out: dict[str, Any] = {
            "reward_mean": sum(r.score.value for r in scored if r.score) / n,
            "accuracy": sum(1 for r in scored if r.score and r.score.correct) / n,
            "turns_per_trajectory": n_turns / n,
            "trajectories": len(scored),
            "infrastructure_failures": len(self.excluded),
            "excluded_share": len(self.excluded) / max(len(scored) + len(self.excluded), 1),
            # the policy's own failures, scored 0 rather than excluded
            "timed_out_share": sum(1 for r in scored if r.trajectory.stop_reason == "timeout") / n,
            "context_overflows": sum(1 for r in scored if any(f.kind == "context_overflow"
                                                              for f in r.trajectory.failures)),
            **prompt_token_metrics([r.trajectory for r in scored]),
        }
        names = sorted({*self.tool_names, "invalid", *tools})
        out.update({f"tool/{name}": tools[name] / max(n_turns, 1) for name in names})
        by_turn: dict[int, Counter[str]] = {}
        for r in scored:
            for turn in r.trajectory.turns:
                by_turn.setdefault(turn.index, Counter())[turn.tool if turn.tool_valid else "invalid"] += 1
        for index, counts in sorted(by_turn.items()):
            total = sum(counts.values())
            out.update({f"tool/turn{index}/{name}": counts[name] / total for name in sorted({*names, *counts})})
        out.update(menu_position_metrics([r.trajectory for r in scored]))
        if right_tool:
            out["tool_choice_accuracy"] = sum(right_tool) / len(right_tool)
        return out


def menu_position_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """`menu_position/turnN/K`: the share of the valid actions picked at turn N that the planner's menu listed
    K-th (1 = first). A small planner follows the order it is shown; while it does, its choice cannot follow
    the question (docs/training.md). Turns recorded without their menu order are left out."""
    positions: dict[int, Counter[int]] = {}
    for trajectory in trajectories:
        for turn in trajectory.turns:
            if turn.tool_valid and turn.tool in turn.menu:
                positions.setdefault(turn.index, Counter())[turn.menu.index(turn.tool) + 1] += 1
    out: dict[str, float] = {}
    for index, counts in sorted(positions.items()):
        total = sum(counts.values())
        listed = max(len(t.menu) for trajectory in trajectories for t in trajectory.turns if t.index == index)
        out.update({f"menu_position/turn{index}/{k}": counts[k] / total for k in range(1, listed + 1)})
    return out


def prompt_token_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """Prompt tokens of a rollout's model calls per role (the analysis, each turn's planner, executor and
    verifier, the generator), and how many of them the engine took from its prompt cache where it says: what a
    rollout reads is what it costs on a CPU."""
    totals: Counter[str] = Counter()
    for trajectory in trajectories:
        calls = [trajectory.analysis, trajectory.generator,
                 *(c for turn in trajectory.turns for c in (turn.planner, turn.executor, turn.verifier))]
        for call in calls:
            if call is None or call.completion is None:
                continue
            completion = call.completion
            for scope in (f"/{call.role}", ""):
                totals[f"prompt_tokens{scope}"] += completion.prompt_tokens
                if completion.cached_prompt_tokens is not None or not scope:
                    totals[f"cached_prompt_tokens{scope}"] += completion.cached_prompt_tokens or 0
    return {f"rollout/{key}": float(value) for key, value in sorted(totals.items())}


def expected_tool(question: Question, turn: int) -> str | None:
    """The right tool at a turn (1-based), where the question names it: `tools` (one per turn) or `tool`."""
    tools = question.meta.get("tools")
    if isinstance(tools, list):
        return tools[turn - 1] if 0 < turn <= len(tools) else None
    return question.meta.get("tool")


def score_trajectory(question: Question, trajectory: Trajectory, *, tool_call_cost: float = 0.0) -> Score:
    """The reward of one trajectory: the scorer named by the question, on the flow's extracted answer, less
    `tool_call_cost` for each tool call after the first (a turn that took the planner's stop action is not a
    call; a turn whose tool was invalid is one, `answer` included where the flow offers no stop), never below 0.
    `correct` is the scorer's."""
    score = get_scorer(question.reward)(trajectory.answer, question.answer)
    if not tool_call_cost:
        return score
    calls = sum(1 for turn in trajectory.turns if not (turn.tool == STOP_ACTION and turn.tool_valid))
    value = max(score.value - tool_call_cost * max(calls - 1, 0), 0.0)
    return score.model_copy(update={"value": value, "details": {**score.details, "tool_calls": calls,
                                                                "tool_call_cost": tool_call_cost}})


async def run_rollouts(flow: Flow, questions: list[Question], *, group_size: int, concurrency: int,
                       tool_call_cost: float = 0.0, variants: list[int] | None = None) -> RolloutBatch:
    """Run `group_size` trajectories per question concurrently (at most `concurrency` in flight), each scored
    with `score_trajectory` (`tool_call_cost`: see there). Each trajectory's `variant` (its menu order) is its index
    in the group, or `variants[index]` (trajectories given one variant then share their menu)."""
    if variants is not None and len(variants) != group_size:
        raise ValueError(f"{len(variants)} variants for groups of {group_size}")
    loop = asyncio.get_running_loop()
    start = loop.time()
    gate = asyncio.Semaphore(concurrency)

    async def one(question: Question, index: int) -> Rollout:
        order = index if variants is None else variants[index]
        trajectory = Trajectory(question=question.question, variant=order, stop_reason="error")
        try:
            async with gate:
                trajectory = await flow.asolve(question.question, variant=order)
            failure = trajectory.infrastructure_failure
            if failure is None:
                return Rollout(question, index, trajectory, score_trajectory(question, trajectory,
                                                                           tool_call_cost=tool_call_cost))
        except Exception as err:  # a bug of ours (flow, scorer) says nothing about the policy: never a reward
            log.exception("question %s trajectory %d crashed", question.id, index)
            failure = Failure(stage="flow", kind="internal_error", infrastructure=True,
                              message=f"{type(err).__name__}: {err}"[:1000])
            trajectory.failures.append(failure)
        log.warning("question %s trajectory %d excluded: %s (%s)", question.id, index, failure.kind,
                    failure.message)
        return Rollout(question, index, trajectory, None, failure)

    results = await asyncio.gather(*(one(q, i) for q in questions for i in range(group_size)))
    batch = RolloutBatch(rollouts=[r for r in results if r.infrastructure is None],
                         excluded=[r for r in results if r.infrastructure is not None],
                         tool_names=flow.actions() if hasattr(flow, "actions") else list(getattr(flow, "tools", {})))
    batch.seconds = loop.time() - start
    return batch
