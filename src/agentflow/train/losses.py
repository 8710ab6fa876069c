"""The Flow-GRPO policy loss: a token-level clipped surrogate with separate low/high clip (DAPO's
clip-higher), plus an optional KL penalty to a frozen reference.

All tensors are (rows, tokens) with a 0/1 `mask` of response tokens; `advantages` is (rows,); a row is one
planner turn. The loss is a weighted sum of per-token terms, sum_r w_r sum_t loss[r, t], with row weights
from the aggregation (`row_weights`):

- `trajectory_turn_token_mean` (the paper's Flow-GRPO objective, the default): 1 / (B * G_q * T_i * |a|):
  every question of the B weighs the same, every trajectory of its G_q the same whatever its number of turns
  T_i, every turn of it the same whatever its length. When trajectories were excluded (infrastructure
  failures), G_q counts the question's scored trajectories, so a question that lost some keeps its weight.
- `token_mean`: 1 / (all tokens): a trajectory weighs by its token count (DAPO).
- `seq_mean_token_mean`: 1 / (rows * |a|): a trajectory weighs by its number of turns (original GRPO per turn).

Weights are computed once over the whole (mini-)batch, before rows that carry no gradient are dropped and
before it is split into micro-batches, so the micro-batch losses sum to the batch's loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch

KLEstimator = Literal["k1", "k2", "k3"]
Aggregation = Literal["trajectory_turn_token_mean", "token_mean", "seq_mean_token_mean"]
AGGREGATIONS: tuple[str, ...] = ("trajectory_turn_token_mean", "token_mean", "seq_mean_token_mean")

KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {}


def register_kl(name: str) -> Callable:
    def decorator(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable:
        KL_ESTIMATORS[name] = fn
        return fn

    return decorator


@register_kl("k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """log p - log q: unbiased, high variance, can be negative per token (Schulman's k1)."""
    return logprobs - ref_logprobs


@register_kl("k2")
def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """(log p - log q)^2 / 2: biased, low variance, never negative."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


@register_kl("k3")
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """q/p - log(q/p) - 1: unbiased and never negative (Schulman's k3; GRPO's choice)."""
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


@dataclass
class LossOutput:
    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


def row_weights(aggregation: str, *, response_lengths: torch.Tensor, row_trajectory: torch.Tensor | None = None,
                row_group_size: torch.Tensor | None = None, groups: int = 1) -> torch.Tensor:
    """(rows,) weight of each row's token sum in the loss (see the module docstring).

    `response_lengths`: tokens per row. For `trajectory_turn_token_mean`: `row_trajectory`, the trajectory
    index of each row; `row_group_size`, G_q of each row's question (scored trajectories, whether or not all
    their rows are passed; default: one question holding the trajectories that appear); `groups`, B.
    """
    lengths = response_lengths.to(torch.float64)
    if (lengths <= 0).any():
        raise ValueError("every row needs at least one response token")
    if aggregation == "token_mean":
        weights = torch.full_like(lengths, 1.0 / float(lengths.sum()))
    elif aggregation == "seq_mean_token_mean":
        weights = 1.0 / (lengths.numel() * lengths)
    elif aggregation == "trajectory_turn_token_mean":
        if row_trajectory is None:
            raise ValueError("trajectory_turn_token_mean needs row_trajectory")
        ids, turns_of_row = torch.unique(row_trajectory, return_inverse=True)
        turns = torch.bincount(turns_of_row).to(torch.float64)[turns_of_row]
        if row_group_size is None:
            row_group_size = torch.full_like(lengths, float(ids.numel()))
        if row_group_size.shape != lengths.shape or (row_group_size < 1).any() or groups < 1:
            raise ValueError(f"row_group_size must be (rows,) counts >= 1 and groups >= 1, got "
                             f"{tuple(row_group_size.shape)} and {groups}")
        weights = 1.0 / (groups * row_group_size.to(torch.float64) * turns * lengths)
    else:
        raise ValueError(f"unknown loss aggregation {aggregation!r}; known: {', '.join(AGGREGATIONS)}")
    return weights.to(torch.float32)


def action_credit(mask: torch.Tensor, action: torch.Tensor, free: torch.Tensor, share: float,
                  lengths: torch.Tensor | None = None) -> torch.Tensor:
    """(rows, tokens) per-token multipliers that give each row's action token `share` of the row's weight and
    spread the rest evenly over the row's other free tokens (forced tokens carry no gradient and get 0).

    Under the paper's 1/|a| every token of a reply weighs the same, so the one token that names the tool gets
    1/|a| of the reply's gradient and the free sub-goal text the rest. Multipliers sum to the row's length,
    so the row keeps its weight. A row whose action is its only free token puts it all there; a row without an
    action keeps 1s.
    `mask`: response tokens; `action`: each row's action position (`logprobs.action_positions`); `free`:
    positions where more than one token could be drawn; `lengths`: (rows,) each reply's whole length when the rows
    are cut short of it (the length the row's weight was computed from); None: the mask's."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"action share must be in [0, 1], got {share}")
    mask_b = mask.bool()
    action = action & mask_b
    others = free & mask_b & ~action
    length = (mask_b.sum(dim=1) if lengths is None else lengths.to(mask.device)).to(torch.float32)[:, None]
    n_others = others.sum(dim=1, keepdim=True).to(torch.float32)
    credit = torch.where(action, torch.where(n_others > 0, share * length, length), torch.zeros_like(length))
    credit = torch.where(others, (1.0 - share) * length / n_others.clamp(min=1.0), credit)
    return torch.where(action.any(dim=1, keepdim=True), credit, torch.ones_like(credit))


def clipped_surrogate_loss(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    aggregation: Aggregation = "trajectory_turn_token_mean",
    weights: torch.Tensor | None = None,
    row_trajectory: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    token_weights: torch.Tensor | None = None,
    kl_weights: torch.Tensor | None = None,
) -> LossOutput:
    """-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) + kl_coef * KL(policy || ref), per token, summed with
    row weights.

    r = exp(logprobs - old_logprobs) where old log-probs are those the rollout sampled with. `weights`: the
    (rows,) weights `row_weights` gave for the whole batch (pass them sliced for a micro-batch); None: computed
    from `aggregation` over these rows alone (with `row_trajectory` for the paper's). `token_weights`:
    (rows, tokens) importance weights multiplying each token's clipped term (truncated importance sampling
    for rollouts sampled by another engine; the KL term is not weighted); None: 1. `kl_weights`: (rows, tokens)
    multipliers of each token's KL term (`action_credit`, so that the KL holds back what the policy term moves);
    None: 1. Metrics (plain floats over masked tokens, unweighted): clip_fraction, approx_kl (k3 of policy vs
    rollout), kl_ref, entropy, ratio_mean.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(f"shape mismatch: logprobs {tuple(logprobs.shape)}, old_logprobs "
                         f"{tuple(old_logprobs.shape)}, mask {tuple(mask.shape)}")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be (rows,) = {tuple(logprobs.shape[:1])}, "
                         f"got {tuple(advantages.shape)}")
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")
    if kl_coef and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    mask_f = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype).unsqueeze(1)
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    if token_weights is not None:
        if token_weights.shape != logprobs.shape:
            raise ValueError(f"token_weights shape {tuple(token_weights.shape)} != logprobs {tuple(logprobs.shape)}")
        per_token = per_token * token_weights.to(per_token.dtype)
    kl_ref = None
    if ref_logprobs is not None:
        if ref_logprobs.shape != logprobs.shape:
            raise ValueError(f"ref_logprobs shape {tuple(ref_logprobs.shape)} != "
                             f"logprobs {tuple(logprobs.shape)}")
        try:
            kl_ref = KL_ESTIMATORS[kl_estimator](logprobs, ref_logprobs)
        except KeyError:
            known = ", ".join(KL_ESTIMATORS)
            raise ValueError(f"unknown KL estimator {kl_estimator!r}; known: {known}") from None
        if kl_coef:
            if kl_weights is not None and kl_weights.shape != logprobs.shape:
                raise ValueError(f"kl_weights shape {tuple(kl_weights.shape)} != logprobs {tuple(logprobs.shape)}")
            penalty = kl_ref if kl_weights is None else kl_ref * kl_weights.to(kl_ref.dtype)
            per_token = per_token + kl_coef * penalty
    if weights is None:
        weights = row_weights(aggregation, response_lengths=mask.sum(dim=1), row_trajectory=row_trajectory)
    if weights.shape != logprobs.shape[:1]:
        raise ValueError(f"weights must be (rows,) = {tuple(logprobs.shape[:1])}, got {tuple(weights.shape)}")
    loss = ((per_token * mask_f).sum(dim=1) * weights.to(per_token.dtype)).sum()

    with torch.no_grad():
        n = mask_f.sum().clamp(min=1.0)
        clipped_active = (clipped < unclipped).to(logprobs.dtype)

        def mean(x: torch.Tensor) -> float:
            return float((x * mask_f).sum() / n)

        metrics = {
            "clip_fraction": mean(clipped_active),
            "approx_kl": mean(kl_k3(logprobs, old_logprobs)),
            "ratio_mean": mean(ratio),
            "tokens": float(mask_f.sum()),
        }
        if kl_ref is not None:
            metrics["kl_ref"] = mean(kl_ref)
        if entropy is not None:
            metrics["entropy"] = mean(entropy)
    return LossOutput(loss=loss, metrics=metrics)
