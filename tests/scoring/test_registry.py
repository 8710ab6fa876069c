"""The scorer registry and answer extraction shared by eval and training."""

from __future__ import annotations

import pytest

from agentflow.errors import ConfigError
from agentflow.scoring import Score, available_scorers, extract_answer, get_scorer, register_scorer


def test_builtin_scorers_are_registered() -> None:
    assert {"exact_match", "f1", "cover_em", "math", "gameof24", "multiple_choice"} <= set(available_scorers())


def test_unknown_scorer_names_the_available_ones() -> None:
    with pytest.raises(ConfigError, match="exact_match"):
        get_scorer("nope")


def test_register_a_new_scorer() -> None:
    @register_scorer("test_length_reward", description="test only")
    def length(prediction: str, gold: object) -> Score:
        return Score(correct=len(prediction) == gold, value=min(1.0, len(prediction) / 10))

    assert get_scorer("test_length_reward")("abc", 3).correct
    with pytest.raises(ValueError, match="twice"):
        register_scorer("test_length_reward")(lambda p, g: Score(correct=False, value=0.0))


def test_score_value_is_bounded() -> None:
    with pytest.raises(ValueError):
        Score(correct=True, value=1.5)


@pytest.mark.parametrize(("text", "expected"), [
    ("<answer>42</answer>", "42"),
    ("reasoning... <answer> 42 </answer> trailing", "42"),
    ("Put it in <answer> and </answer> tags. <answer>Paris</answer>", "Paris"),
    ("<ANSWER>x</ANSWER>", "x"),
    ("cut off <answer>Par", "Par"),
    ("no tags at all ", "no tags at all"),
    ("", ""),
])
def test_extract_answer(text: str, expected: str) -> None:
    assert extract_answer(text) == expected
