"""Scorers: one registry used as evaluation metrics by `agentflow eval` and as rewards by `agentflow train`.

    from agentflow.scoring import get_scorer
    score = get_scorer("math")("The answer is \\boxed{1/2}", "0.5")   # Score(correct=True, value=1.0, ...)
"""

from agentflow.scoring import gameof24, math_equiv, multiple_choice, qa  # noqa: F401  (registers the scorers)
from agentflow.scoring.base import (
    GOLD_LAYOUTS,
    Score,
    Scorer,
    available_scorers,
    binary,
    get_scorer,
    gold_layout,
    register_scorer,
)
from agentflow.scoring.extract import extract_answer
from agentflow.scoring.qa import normalize_answer, token_f1

__all__ = ["GOLD_LAYOUTS", "Score", "Scorer", "available_scorers", "binary", "extract_answer", "get_scorer",
           "gold_layout", "normalize_answer", "register_scorer", "token_f1"]
