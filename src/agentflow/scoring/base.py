"""The scorer contract and its registry: one implementation serves as eval metric and as training reward.

A scorer is a plain function `(prediction, gold) -> Score`. `prediction` is the agent's answer text (an
`<answer>...</answer>` block is extracted when present); `gold` is the reference in the form the scorer
documents (a string or list of accepted strings, a number, the puzzle numbers, options and the right letter).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from agentflow.errors import ConfigError


class Score(BaseModel):
    """The verdict on one answer. `value` is the reward used in training; `correct` is what accuracy counts."""

    correct: bool
    value: float = Field(..., ge=0.0, le=1.0, description="Reward in [0, 1].")
    details: dict[str, Any] = Field(default_factory=dict, description="How the verdict was reached.")


Scorer = Callable[[str, Any], Score]

_REGISTRY: dict[str, Scorer] = {}
_DESCRIPTIONS: dict[str, str] = {}
_GOLD_LAYOUTS: dict[str, str] = {}

GOLD_LAYOUTS = ("qa", "math", "gameof24", "multiple_choice")
"""How a benchmark file's gold answer is read for a scorer: `qa` (accepted answer strings), `math` (one
answer string), `gameof24` (the puzzle's numbers), `multiple_choice` (options and the right one)."""


def register_scorer(name: str, *, description: str = "", gold: str = "qa") -> Callable[[Scorer], Scorer]:
    """Decorator that makes a scorer available by name to `agentflow eval` and to the trainer's rewards.

    `gold` names the layout of the gold answer the scorer expects (one of GOLD_LAYOUTS), so `agentflow eval
    FILE --scorer NAME` can read any registered scorer's gold from a user's file."""
    if gold not in GOLD_LAYOUTS:
        raise ValueError(f"scorer {name!r}: gold layout {gold!r} is not one of {', '.join(GOLD_LAYOUTS)}")

    def decorate(fn: Scorer) -> Scorer:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"scorer name {name!r} registered twice")
        _REGISTRY[name] = fn
        _DESCRIPTIONS[name] = description or (fn.__doc__ or "").strip().splitlines()[0]
        _GOLD_LAYOUTS[name] = gold
        return fn

    return decorate


def gold_layout(name: str) -> str:
    """The gold layout the scorer registered under `name` expects."""
    get_scorer(name)
    return _GOLD_LAYOUTS[name]


def get_scorer(name: str) -> Scorer:
    """The scorer registered under `name`; a ConfigError naming the available ones otherwise."""
    if name not in _REGISTRY:
        raise ConfigError(f"unknown scorer {name!r}; available: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def available_scorers() -> dict[str, str]:
    """Registered scorer names with a one-line description each."""
    return dict(sorted(_DESCRIPTIONS.items()))


def binary(correct: bool, **details: Any) -> Score:
    """A right/wrong Score whose reward is 1 or 0."""
    return Score(correct=correct, value=1.0 if correct else 0.0, details=details)
