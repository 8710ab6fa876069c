"""Game of 24: the expression is checked by the rules, never compared as text and never evaluated as code."""

from __future__ import annotations

import pytest

from agentflow.scoring import get_scorer
from agentflow.scoring.gameof24 import check_expression, puzzle_numbers

game24 = get_scorer("gameof24")


@pytest.mark.parametrize(("prediction", "numbers"), [
    ("(1+1+1)×8", [1, 1, 1, 8]),
    ("8*(1+1+1)", [1, 1, 1, 8]),                     # not the reference expression, still right
    ("(1+1+1)*8 = 24", [1, 1, 1, 8]),
    ("24 = 8 × (1 + 1 + 1)", [1, 1, 1, 8]),
    ("<answer>(13-1)×(1+1)</answer>", [1, 1, 1, 13]),
    ("8/(3-8/3)", [3, 3, 8, 8]),                     # needs exact fractions: 8/3 is not a float here
    ("8 \\div (3 - 8 \\div 3)", [3, 3, 8, 8]),
    ("The answer is (1+1+1)*8.", [1, 1, 1, 8]),      # expression inside a sentence
    ("[(1+2)+3]×4", [1, 2, 3, 4]),
])
def test_valid_solutions(prediction: str, numbers: list[int]) -> None:
    score = game24(prediction, numbers)
    assert score.correct, score.details


@pytest.mark.parametrize(("prediction", "numbers", "reason"), [
    ("(4*3)*(1+1)", [1, 2, 3, 4], "uses"),           # 24, but 1 is used twice and 2 never
    ("2*3*4", [1, 2, 3, 4], "uses"),                 # 24 with a number missing
    ("1*2*3*4*1", [1, 2, 3, 4], "uses"),
    ("1+2+3+4", [1, 2, 3, 4], "evaluates to 10"),
    ("8/(1-1)+1+1", [1, 1, 1, 8], "division by zero"),
    ("-1+1+1*8", [1, 1, 1, 8], "unary"),
    ("2**3*3*1", [1, 2, 3, 3], "Pow"),
    ("4*6.0*1*1", [1, 1, 4, 6], "whole numbers"),
    ("__import__('os').system('true')", [1, 1, 1, 8], "not allowed"),
    ("(1+1+1)8", [1, 1, 1, 8], "not a valid"),
    ("24", [1, 1, 1, 8], "uses"),
    ("", [1, 1, 1, 8], "empty"),
    ("I could not find one, sorry", [1, 1, 1, 8], "no arithmetic expression"),
    ("The answer to the question is twenty-four" + " really" * 40, [1, 1, 1, 8], "no arithmetic expression"),
])
def test_invalid_solutions(prediction: str, numbers: list[int], reason: str) -> None:
    score = game24(prediction, numbers)
    assert not score.correct
    assert score.value == 0.0
    assert reason in score.details["reason"]


def test_fraction_arithmetic_is_exact() -> None:
    # In floats 8/(3-8/3) is 23.999999999999996; a float checker would reject it or need a tolerance.
    assert check_expression("8/(3-8/3)", [3, 3, 8, 8]) == (True, "ok")
    assert not check_expression("8/(3-8/3)+1-1", [3, 3, 8, 8])[0]


def test_expression_length_is_bounded() -> None:
    ok, reason = check_expression("(" * 300 + "1" + ")" * 300, [1])
    assert not ok and "too long" in reason


def test_puzzle_numbers_forms() -> None:
    assert puzzle_numbers([1, 1, 1, 8]) == [1, 1, 1, 8]
    assert puzzle_numbers("[1, 1, 1, 8]") == [1, 1, 1, 8]
    assert puzzle_numbers({"numbers": [2, 3, 4, 1]}) == [2, 3, 4, 1]
    with pytest.raises(ValueError):
        puzzle_numbers("")
