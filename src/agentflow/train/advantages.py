"""Advantage estimators of Flow-GRPO, in a registry: one outcome reward per trajectory becomes one advantage
per planner turn (row).

Every estimator has the same keyword-only signature, so the trainer never changes when one is added:

    fn(*, rewards, group_ids, trajectory_ids, row_trajectory, eps) -> advantages of the rows

- `rewards`: float tensor (T,), one reward per trajectory.
- `group_ids`: T question ids; trajectories of one question form a group.
- `trajectory_ids`: T unique trajectory ids, used only to name offenders in errors.
- `row_trajectory`: long tensor (R,), the trajectory index of each planner-turn row.

Standard deviations are Bessel-corrected (as `torch.std`, TRL and verl do). A group of one trajectory
carries no signal under the group estimators: its advantages are 0 (under `batch_trajectory`, a batch of one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

AdvantageFn = Callable[..., torch.Tensor]
ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {}


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register an estimator under `name` (the value of the config field `advantage`)."""

    def decorator(fn: AdvantageFn) -> AdvantageFn:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return decorator


def get_advantage(name: str) -> AdvantageFn:
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        known = ", ".join(sorted(ADVANTAGE_ESTIMATORS))
        raise ValueError(f"unknown advantage estimator {name!r}; known: {known}") from None


def _validate(rewards: torch.Tensor, group_ids: Sequence[str], trajectory_ids: Sequence[str],
              row_trajectory: torch.Tensor) -> None:
    """Raise ValueError naming the offending trajectory or question, so a bad batch is found at once."""
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D (one per trajectory), got shape {tuple(rewards.shape)}")
    n = rewards.shape[0]
    if len(group_ids) != n or len(trajectory_ids) != n:
        raise ValueError(f"{n} rewards but {len(group_ids)} group ids and "
                         f"{len(trajectory_ids)} trajectory ids")
    if len(set(trajectory_ids)) != n:
        dup = next(t for t in trajectory_ids if list(trajectory_ids).count(t) > 1)
        raise ValueError(f"trajectory id {dup!r} appears more than once")
    bad = (~torch.isfinite(rewards)).nonzero().flatten().tolist()
    if bad:
        i = bad[0]
        raise ValueError(f"trajectory {trajectory_ids[i]!r} (question {group_ids[i]!r}) has a non-finite "
                         f"reward {rewards[i].item()}")
    if row_trajectory.ndim != 1 or row_trajectory.dtype not in (torch.int32, torch.int64):
        raise ValueError("row_trajectory must be a 1-D integer tensor of trajectory indices")
    if row_trajectory.numel() and (row_trajectory.min() < 0 or row_trajectory.max() >= n):
        raise ValueError(f"row_trajectory holds index {row_trajectory.max().item()} outside 0..{n - 1}")


def _group_index(group_ids: Sequence[str]) -> tuple[torch.Tensor, int]:
    index: dict[str, int] = {}
    ids = [index.setdefault(g, len(index)) for g in group_ids]
    return torch.tensor(ids, dtype=torch.long), len(index)


def _normalise(values: torch.Tensor, groups: torch.Tensor, n_groups: int, *, eps: float,
               scale: bool) -> torch.Tensor:
    """(v - group mean) / (group std + eps) per element; 0 in groups of one element."""
    values = values.to(torch.float64)
    count = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, groups, torch.ones_like(values))
    mean = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, groups, values) / count
    centred = values - mean[groups]
    out = centred
    if scale:
        sq = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, groups, centred**2)
        std = torch.sqrt(sq / (count - 1).clamp(min=1))
        std = std[groups]
        # a group whose values are all equal has std 0: its advantages are 0, not 0/0
        out = torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))
    out = torch.where(count[groups] > 1, out, torch.zeros_like(out))
    return out.to(torch.float32)


@register_advantage("grpo_trajectory")
def grpo_trajectory(*, rewards: torch.Tensor, group_ids: Sequence[str], trajectory_ids: Sequence[str],
                    row_trajectory: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Default: normalise over the G trajectories of each question, then copy to every planner turn.

    Each trajectory counts once, however many turns it took (the paper's Flow-GRPO credit assignment).
    """
    _validate(rewards, group_ids, trajectory_ids, row_trajectory)
    groups, n_groups = _group_index(group_ids)
    per_trajectory = _normalise(rewards, groups, n_groups, eps=eps, scale=True)
    return per_trajectory[row_trajectory]


@register_advantage("grpo_turn_rows")
def grpo_turn_rows(*, rewards: torch.Tensor, group_ids: Sequence[str], trajectory_ids: Sequence[str],
                   row_trajectory: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The original code's variant: broadcast, then normalise over all turn rows of the question's group.

    A trajectory with more turns contributes more rows to the mean and std, so long trajectories weigh more.
    """
    _validate(rewards, group_ids, trajectory_ids, row_trajectory)
    groups, n_groups = _group_index(group_ids)
    return _normalise(rewards[row_trajectory], groups[row_trajectory], n_groups, eps=eps, scale=True)


@register_advantage("no_std")
def no_std(*, rewards: torch.Tensor, group_ids: Sequence[str], trajectory_ids: Sequence[str],
           row_trajectory: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Reward minus the group mean over trajectories, unscaled (Dr. GRPO): no low-variance bias."""
    _validate(rewards, group_ids, trajectory_ids, row_trajectory)
    groups, n_groups = _group_index(group_ids)
    return _normalise(rewards, groups, n_groups, eps=eps, scale=False)[row_trajectory]


@register_advantage("batch_trajectory")
def batch_trajectory(*, rewards: torch.Tensor, group_ids: Sequence[str], trajectory_ids: Sequence[str],
                     row_trajectory: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Normalise over all trajectories of the batch, then copy to every planner turn: REINFORCE++'s global
    normalisation (Hu et al. 2025) with the outcome reward.

    A question whose G trajectories all got the same reward keeps a signal: its reward against the batch's
    mean. Under the group estimators such a group has none, so a policy that gives one kind of question the
    wrong tool every time never hears of it again (docs/training.md, the tool-choice probe). The advantages of
    a batch sum to zero, so what every question shares (naming one tool more often) gets no push of its own.
    The baseline no longer knows the question: a hard question's trajectories are pushed down with the rest.
    """
    _validate(rewards, group_ids, trajectory_ids, row_trajectory)
    everyone = torch.zeros(rewards.shape[0], dtype=torch.long)
    return _normalise(rewards, everyone, 1, eps=eps, scale=True)[row_trajectory]


def role_advantages(estimator: str, *, rewards: torch.Tensor, group_ids: Sequence[str],
                    trajectory_ids: Sequence[str], row_trajectory: dict[str, torch.Tensor], eps: float,
                    scope: str = "per_role") -> dict[str, torch.Tensor]:
    """Advantages of every trained role's rows (`row_trajectory`: role -> the trajectory of each of its rows).
    `per_role`: each role's rows normalised among themselves; `shared`: the rows of all roles at once."""
    fn = get_advantage(estimator)

    def estimate(rows: torch.Tensor) -> torch.Tensor:
        return fn(rewards=rewards, group_ids=group_ids, trajectory_ids=trajectory_ids, row_trajectory=rows, eps=eps)

    if scope == "per_role" or len(row_trajectory) == 1:
        return {role: estimate(rows) for role, rows in row_trajectory.items()}
    if scope != "shared":
        raise ValueError(f"role advantage scope must be per_role or shared, not {scope!r}")
    together = estimate(torch.cat(list(row_trajectory.values())))
    out, start = {}, 0
    for role, rows in row_trajectory.items():
        out[role], start = together[start:start + rows.numel()], start + rows.numel()
    return out


def no_signal_groups(rewards: torch.Tensor, group_ids: Sequence[str]) -> int:
    """Number of questions whose trajectories all got the same reward: they carry no gradient signal."""
    by_group: dict[str, list[float]] = {}
    for g, r in zip(group_ids, rewards.tolist(), strict=True):
        by_group.setdefault(g, []).append(r)
    return sum(1 for values in by_group.values() if max(values) == min(values))
