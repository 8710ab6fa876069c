"""QA scoring: SQuAD-style normalisation, exact match against any accepted answer, token F1."""

from __future__ import annotations

import pytest

from agentflow.scoring import get_scorer, normalize_answer, token_f1
from agentflow.scoring.qa import accepted_answers, strip_answer_prefix

exact_match = get_scorer("exact_match")
f1 = get_scorer("f1")


@pytest.mark.parametrize(("text", "expected"), [
    ("The  Eiffel Tower!", "eiffel tower"),
    ("an Apple, a pear", "apple pear"),
    ("James MADISON.", "james madison"),
    ("Let\u2019s Make Money", "lets make money"),   # Unicode apostrophe is punctuation too
    ("138,535", "138535"),
    ("theatre", "theatre"),                          # "the" is removed only as a word
])
def test_normalize_answer(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected


@pytest.mark.parametrize(("prediction", "gold", "correct"), [
    ("James Madison", ["james madison"], True),
    ("<answer>the Prussian</answer>", ["Prussian"], True),            # article and tags
    ("PRUSSIAN.", "Prussian", True),                                  # casing, punctuation
    ("Prussia", ["Prussian"], False),
    ("U2", ["u2", "U-2"], True),
    ("no", ["Yes"], False),
    ("1999", ["1999"], True),
    ("", ["1999"], False),
    ("The answer is: Prussian.", ["Prussian"], True),                 # a leading answer phrase is removed
    ("Final answer: the Prussians", ["Prussian"], False),
    ("He was Prussian", ["Prussian"], False),                         # EM is exact: extra words are wrong
    ("The Answer", ["The Answer"], True),                             # a name is not an answer phrase
    ("Let'S Make Money", "Let'S Make Money", True),
    ("Kurt Weill", "['Kurt Julian Weill', 'Kurt Weill']", True),       # list stored as a string literal
])
def test_exact_match(prediction: str, gold: object, correct: bool) -> None:
    score = exact_match(prediction, gold)
    assert score.correct is correct
    assert score.value == (1.0 if correct else 0.0)


def test_empty_normalised_answer_is_never_correct() -> None:
    # "The" normalises to "", and so does an empty prediction: that must not count as a match.
    assert not exact_match("", ["The"]).correct
    assert not exact_match("a", ["the"]).correct


def test_f1_is_best_over_accepted_answers() -> None:
    assert token_f1("Kurt Weill", "Kurt Julian Weill") == pytest.approx(0.8)
    score = f1("Kurt Weill", ["Weill the composer", "Kurt Julian Weill"])
    assert score.value == pytest.approx(0.8)
    assert not score.correct
    assert score.details["f1"] == pytest.approx(0.8)


def test_strip_answer_prefix() -> None:
    assert strip_answer_prefix("The correct answer to the question is: Lima") == "Lima"
    assert strip_answer_prefix("Answer - Lima") == "Lima"
    assert strip_answer_prefix("Answers differ") == "Answers differ"
    assert strip_answer_prefix("answered by Smith") == "answered by Smith"
    assert strip_answer_prefix("The answer is") == "The answer is"


def test_exact_match_reports_f1_and_containment() -> None:
    score = exact_match("He was Prussian", ["Prussian"])
    assert score.details["f1"] == pytest.approx(2 * (1 / 3) / (1 + 1 / 3))
    assert score.details["gold_in_prediction"] is True
    assert exact_match("Prussians", ["Prussian"]).details["gold_in_prediction"] is False


def test_accepted_answers_forms() -> None:
    assert accepted_answers(["a", "b"]) == ["a", "b"]
    assert accepted_answers("['a', 'b']") == ["a", "b"]
    assert accepted_answers("[not a list") == ["[not a list"]
    assert accepted_answers(33) == ["33"]


@pytest.mark.parametrize(("prediction", "gold", "correct"), [
    ("Georgy Zhukov was a Soviet military leader.", "Soviet", True),
    ("The answer is 4694259", "4694259", True),
    ("He was a Soviet general", ["Russian", "Soviet"], True),
    ("Prussians", "Prussian", False),  # whole tokens only
    ("46942590", "4694259", False),
    ("", "Soviet", False),
])
def test_cover_em_accepts_a_gold_answer_inside_a_sentence(prediction, gold, correct):
    score = get_scorer("cover_em")(prediction, gold)
    assert score.correct is correct and score.value == (1.0 if correct else 0.0)
