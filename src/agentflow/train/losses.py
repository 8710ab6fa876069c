"""The Flow-GRPO policy loss: a token-level clipped surrogate with separate low/high clip (DAPO's
clip-higher), plus an optional KL penalty to a frozen reference.

All tensors are (rows, tokens) with a 0/1 `mask` of response tokens; `advantages` is (rows,). To split a
batch into micro-batches for gradient accumulation, pass `normalizer` = the whole batch's token count
("token_mean") or row count ("seq_mean_token_mean"): the micro-batch losses then sum to the full-batch loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch

KLEstimator = Literal["k1", "k2", "k3"]
Aggregation = Literal["token_mean", "seq_mean_token_mean"]

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


def aggregate(values: torch.Tensor, mask: torch.Tensor, *, aggregation: Aggregation,
              normalizer: float | None = None) -> torch.Tensor:
    """Reduce (rows, tokens) values to a scalar over masked tokens."""
    mask = mask.to(values.dtype)
    if aggregation == "token_mean":
        denom = normalizer if normalizer is not None else mask.sum().clamp(min=1.0)
        return (values * mask).sum() / denom
    if aggregation == "seq_mean_token_mean":
        per_row = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        denom = normalizer if normalizer is not None else max(values.shape[0], 1)
        return per_row.sum() / denom
    raise ValueError(f"unknown loss aggregation {aggregation!r}; known: token_mean, seq_mean_token_mean")


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
    aggregation: Aggregation = "token_mean",
    normalizer: float | None = None,
    entropy: torch.Tensor | None = None,
) -> LossOutput:
    """-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) + kl_coef * KL(policy || ref), per token, aggregated.

    r = exp(logprobs - old_logprobs) where old log-probs are those the rollout sampled with. Metrics (plain
    floats over masked tokens): clip_fraction, approx_kl (k3 of policy vs rollout), kl_ref, entropy,
    ratio_mean.
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
            per_token = per_token + kl_coef * kl_ref
    loss = aggregate(per_token, mask, aggregation=aggregation, normalizer=normalizer)

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
