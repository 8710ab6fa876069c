"""Math scoring: numeric and symbolic equivalence through Hugging Face `math-verify`.

`math-verify` parses LaTeX and plain expressions (\\boxed{}, fractions, percentages, units around numbers)
into sympy and compares them, so "1/2", "0.5" and "\\frac{1}{2}" agree without hand-written rules.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from math_verify import parse, verify

from agentflow.scoring.base import Score, binary, register_scorer
from agentflow.scoring.extract import extract_answer

log = logging.getLogger(__name__)

TIMEOUT_S = 5
"""Per-parse and per-verify budget. math-verify enforces it with SIGALRM, which works only in the main thread."""


def _timeout() -> int | None:
    # Off the main thread (a trainer's reward worker) SIGALRM cannot be used: math-verify then runs unbounded.
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _parse(text: str) -> list[Any]:
    timeout = _timeout()
    parsed = parse(text, parsing_timeout=timeout)
    if not parsed and "$" not in text and "\\" in text:
        # Bare LaTeX such as "\frac{1}{2}" parses once it is put in math mode.
        parsed = parse(f"${text}$", parsing_timeout=timeout)
    return parsed


@register_scorer("math", gold="math",
                 description="Math: symbolic/numeric equivalence with math-verify (boxed, fractions, units).")
def math_equivalence(prediction: str, gold: Any) -> Score:
    """Math: correct when math-verify finds the prediction equal to the gold answer; reward 1/0."""
    answer = extract_answer(prediction)
    gold_text = str(gold)
    gold_parsed = _parse(gold_text)
    if not gold_parsed:
        raise ValueError(f"gold answer {gold_text!r} could not be parsed as math")
    if not answer:
        return binary(False, extracted="", reason="empty answer", gold=gold_text)
    pred_parsed = _parse(answer)
    if not pred_parsed:
        return binary(False, extracted=answer, reason="no math expression found", gold=gold_text)
    try:
        correct = verify(gold_parsed, pred_parsed, timeout_seconds=_timeout())
    except Exception as err:  # math-verify raises sympy's errors on exotic input; that answer is simply wrong
        log.debug("math-verify failed on %r: %s", answer, err)
        return binary(False, extracted=answer, reason=f"verify error: {err}", gold=gold_text)
    return binary(bool(correct), extracted=answer, parsed=str(pred_parsed[0]), gold=gold_text,
                  gold_parsed=str(gold_parsed[0]))
