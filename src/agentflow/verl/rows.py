"""A scored trajectory -> its training rows for verl: one row per planner turn.

A row is exactly what the rollout server produced for that turn: the prompt ids the chat template gave, the
sampled response ids and their log-probs; every response token is trained on (mask 1). Rows that cannot be
trained on are left out and counted:
- a prompt longer than `max_prompt_length` (the flow still ran the turn; only its row is dropped);
- a response longer than `response_length` keeps its first `response_length` tokens (cannot happen when
  the planner's max_tokens is the response length, as the mapping sets it; kept as a guard).
A trajectory left with no row still carries its reward into its group's statistics: it gets one
placeholder row whose response mask is all 0 (it moves no weight), the same device verl uses to pad batches.
verl's GRPO reads a session's advantage from its last row, so the placeholder is only ever a row alone.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from agentflow.trajectory import Trajectory


@dataclass
class TurnRow:
    """One training row: a planner turn (turn >= 1) or the placeholder of a trajectory without one (turn 0)."""

    turn: int
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]

    @property
    def trainable(self) -> bool:
        return any(self.response_mask)


@dataclass
class TrajectoryRows:
    """The rows of one trajectory and why any turn was left out."""

    rows: list[TurnRow]
    dropped: Counter[str] = field(default_factory=Counter)

    @property
    def placeholder(self) -> bool:
        return len(self.rows) == 1 and not self.rows[0].trainable


def build_rows(trajectory: Trajectory, *, max_prompt_length: int, response_length: int,
               filler_token_id: int) -> TrajectoryRows:
    """Rows of a scored (not infrastructure-failed) trajectory; see the module docstring for the rules.

    Raises ValueError naming the turn when a planner call lacks token ids or log-probs: that is a bug in the
    engine, not something to train around.
    """
    rows: list[TurnRow] = []
    dropped: Counter[str] = Counter()
    first_prompt: list[int] | None = None
    for turn in trajectory.turns:
        call = turn.planner
        if call is None or call.completion is None:
            continue
        completion = call.completion
        if completion.prompt_token_ids is None or completion.token_ids is None or completion.logprobs is None:
            raise ValueError(f"turn {turn.index}: the planner call has no token ids / log-probs; the planner "
                             "must run on the rollout-server engine")
        if len(completion.token_ids) != len(completion.logprobs):
            raise ValueError(f"turn {turn.index}: {len(completion.token_ids)} tokens but "
                             f"{len(completion.logprobs)} log-probs")
        prompt = list(completion.prompt_token_ids)
        first_prompt = prompt if first_prompt is None else first_prompt
        if not completion.token_ids:
            dropped["empty_response"] += 1
            continue
        if len(prompt) > max_prompt_length:
            dropped["prompt_too_long"] += 1
            continue
        response = list(completion.token_ids)
        logprobs = [float(x) for x in completion.logprobs]
        if len(response) > response_length:
            dropped["response_truncated"] += 1
            response, logprobs = response[:response_length], logprobs[:response_length]
        rows.append(TurnRow(turn=turn.index, prompt_ids=prompt, response_ids=response,
                            response_mask=[1] * len(response), response_logprobs=logprobs))
    if not rows:
        # The prompt is only a carrier here (its tokens are never trained on); keep it within the limit.
        prompt = (first_prompt or [filler_token_id])[-max_prompt_length:]
        rows.append(TurnRow(turn=0, prompt_ids=prompt, response_ids=[filler_token_id], response_mask=[0],
                            response_logprobs=[0.0]))
    return TrajectoryRows(rows=rows, dropped=dropped)
