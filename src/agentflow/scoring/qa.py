"""Open-domain QA scoring: SQuAD-style normalised exact match and token F1 against every accepted answer."""

from __future__ import annotations

import ast
import re
import unicodedata
from collections import Counter
from typing import Any

from agentflow.scoring.base import Score, binary, register_scorer
from agentflow.scoring.extract import extract_answer

_ARTICLES = re.compile(r"\b(a|an|the)\b")
# "The answer is: X", "Final answer: X", "The correct answer to the question is X" -> "X". Only a leading phrase
# that announces the answer is removed; the rest must still match exactly.
_ANSWER_PREFIX = re.compile(
    r"^\s*(?:the\s+)?(?:final\s+|correct\s+|short\s+)?answer\b(?:\s+to\s+(?:the|this)\s+question)?"
    r"\s*(?:is)?\s*[:\-]?\s*", re.IGNORECASE)


def strip_answer_prefix(text: str) -> str:
    """Remove a leading "The answer is:"-style phrase, which small models add even when asked not to."""
    stripped = _ANSWER_PREFIX.sub("", text, count=1)
    return stripped if stripped.strip() else text


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation (any Unicode punctuation, not only ASCII), drop articles, squeeze spaces."""
    text = unicodedata.normalize("NFKC", str(text)).lower()
    text = "".join(ch for ch in text if not unicodedata.category(ch).startswith("P"))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def accepted_answers(gold: Any) -> list[str]:
    """Gold as a list of strings: a list stays a list, a number becomes its text, and a string that is a
    Python/JSON list literal (as some released benchmark files store it) is unpacked."""
    if isinstance(gold, (list, tuple)):
        return [str(g) for g in gold]
    if isinstance(gold, str):
        stripped = gold.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            try:
                value = ast.literal_eval(stripped)
            except (ValueError, SyntaxError):
                return [gold]
            if isinstance(value, list) and value and all(isinstance(v, (str, int, float)) for v in value):
                return [str(v) for v in value]
        return [gold]
    return [str(gold)]


def token_f1(prediction: str, gold: str) -> float:
    """Harmonic mean of token precision and recall after normalisation (bag of tokens)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens and bool(gold_tokens))
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision = common / len(pred_tokens)
    recall = common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def qa_metrics(prediction: str, gold: Any) -> dict[str, Any]:
    """Exact match, best F1 and whether a gold answer appears inside the prediction (reported, never scored)."""
    answer = strip_answer_prefix(extract_answer(prediction))
    norm_pred = normalize_answer(answer)
    golds = accepted_answers(gold)
    norm_golds = [normalize_answer(g) for g in golds]
    exact = bool(norm_pred) and norm_pred in norm_golds
    f1 = max((token_f1(answer, g) for g in golds), default=0.0)
    padded = f" {norm_pred} "
    contains = any(g and f" {g} " in padded for g in norm_golds)
    return {"extracted": answer, "normalized": norm_pred, "exact_match": exact, "f1": round(f1, 6),
            "gold_in_prediction": contains, "accepted": golds}


@register_scorer("exact_match", description="QA: normalised exact match against any accepted answer (F1 in details).")
def exact_match(prediction: str, gold: Any) -> Score:
    """QA: correct when the normalised answer equals a normalised accepted answer; reward 1/0."""
    metrics = qa_metrics(prediction, gold)
    return Score(correct=metrics["exact_match"], value=1.0 if metrics["exact_match"] else 0.0, details=metrics)


@register_scorer("f1", description="QA: exact match decides correctness; the reward is the best token F1.")
def f1(prediction: str, gold: Any) -> Score:
    """QA with a graded reward: the best token F1 over accepted answers (correct still means exact match)."""
    metrics = qa_metrics(prediction, gold)
    return Score(correct=metrics["exact_match"], value=metrics["f1"], details=metrics)


COVER_EM = "cover_em"


@register_scorer(COVER_EM, description="QA: a gold answer appears in the normalised answer as a whole-token span.")
def cover_exact_match(prediction: str, gold: Any) -> Score:
    """Cover exact match (as in Search-R1's evaluation): right when the answer contains a gold answer.

    For generators that answer in a sentence ("Georgy Zhukov was a Soviet military leader"), where exact match
    would score right answers 0. The shipped tool_use training task uses it.
    """
    metrics = qa_metrics(prediction, gold)
    return binary(bool(metrics["gold_in_prediction"]), **metrics)
