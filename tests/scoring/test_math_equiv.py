"""Math scoring through math-verify: forms of the same number, boxed answers, units around numbers."""

from __future__ import annotations

import threading

import pytest

from agentflow.scoring import Score, get_scorer

math = get_scorer("math")


@pytest.mark.parametrize(("prediction", "gold"), [
    ("1/2", "0.5"),
    ("0.5", "1/2"),
    ("\\frac{1}{2}", "0.5"),
    ("The answer is \\boxed{33}.", 33),
    ("<answer>27 miles</answer>", 27),              # units text around the number
    ("It takes 27 minutes", "27"),
    ("3,159", 3159),
    ("1625.0", 1625),
    ("$-1$", -1),
    ("<answer>\\boxed{\\frac{72}{2}}</answer>", 36),
])
def test_equivalent_answers(prediction: str, gold: object) -> None:
    score = math(prediction, gold)
    assert score.correct, score.details
    assert score.value == 1.0


@pytest.mark.parametrize(("prediction", "gold"), [
    ("34", 33),
    ("", 33),
    ("I do not know", 33),
    ("0.51", "1/2"),
    ("\\boxed{-27}", 27),
])
def test_wrong_answers(prediction: str, gold: object) -> None:
    score = math(prediction, gold)
    assert not score.correct
    assert score.value == 0.0


def test_unparseable_gold_is_a_data_error() -> None:
    with pytest.raises(ValueError, match="could not be parsed"):
        math("3", "no number here")


def test_scoring_works_off_the_main_thread() -> None:
    # math-verify's timeout uses SIGALRM, which raises outside the main thread unless it is switched off.
    results: list[Score] = []
    thread = threading.Thread(target=lambda: results.append(math("\\boxed{1/2}", "0.5")))
    thread.start()
    thread.join()
    assert results and results[0].correct
