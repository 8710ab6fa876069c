"""Multiple choice: one option by letter or text; none or several is wrong, never a default "A"."""

from __future__ import annotations

import pytest

from agentflow.scoring import get_scorer
from agentflow.scoring.multiple_choice import gold_letter, normalize_options

mcq = get_scorer("multiple_choice")

MEDQA = {"options": ["A. Hemolytic uremic syndrome", "B. Oral ulcers", "C. Colorectal cancer",
                     "D. Pancreatic cancer", "E. Cancer"],
         "answer": "Colorectal cancer"}


@pytest.mark.parametrize("prediction", [
    "C", "(C)", "C.", "**C**", "<answer>C</answer>",
    "The answer is C.", "Answer: (C)", "answer: C", "The correct option is C", "The answer is: C.",
    "The correct answer is:\nC. Colorectal cancer",
    "C. Colorectal cancer", "(C) Colorectal cancer",
    "colorectal cancer", "Colorectal Cancer.",
    "The patient is at greatest risk of colorectal cancer.",           # "Cancer" (E) only inside it
    "The answer is C. Colorectal cancer is more likely than pancreatic cancer.",
])
def test_right_answers(prediction: str) -> None:
    score = mcq(prediction, MEDQA)
    assert score.correct, score.details
    assert score.details["chosen"] == "C"


@pytest.mark.parametrize(("prediction", "reason"), [
    ("I am not sure.", "no option"),
    ("A 34-year-old man has colitis.", "no option"),                   # the article "A" is not option A
    ("The answer is A patient with colitis", "no option"),
    ("Colorectal cancer or pancreatic cancer", "several options"),
    ("C or D", "several option letters"),
    ("The answer is C, or maybe the answer is D.", "several option letters"),
    ("C. Oral ulcers", "disagree"),
    ("The correct answer is: B. Colorectal cancer", "disagree"),   # letter and text name two options
    ("", "no option"),
])
def test_ambiguous_or_unmatched_answers_are_wrong(prediction: str, reason: str) -> None:
    score = mcq(prediction, MEDQA)
    assert not score.correct
    assert score.details["chosen"] is None
    assert reason in score.details["reason"]


def test_option_contained_in_another_prefers_full_text() -> None:
    gold = dict(MEDQA, answer="Cancer")
    assert mcq("Cancer", gold).correct                                  # exact text of E, though C and D contain it
    assert mcq("E", gold).correct
    assert not mcq("Colorectal cancer", gold).correct
    score = mcq("cancer, colorectal cancer", gold)                      # E mentioned on its own, and C
    assert not score.correct and score.details["reason"] == "matches several options"


def test_wrong_option_is_wrong_not_default() -> None:
    score = mcq("Pancreatic cancer", MEDQA)
    assert not score.correct and score.details["chosen"] == "D"


def test_gpqa_style_choices_with_index() -> None:
    gold = {"options": ["4", "14", "40", "41"], "answer": 2}
    assert normalize_options(gold["options"]) == {"A": "4", "B": "14", "C": "40", "D": "41"}
    assert mcq("C", gold).correct
    assert mcq("40", gold).correct
    assert not mcq("4", gold).correct                                   # "4" is option A, not part of "40"
    assert not mcq("41", gold).correct


def test_gold_letter_forms() -> None:
    options = normalize_options(MEDQA["options"])
    assert gold_letter(options, "C") == "C"
    assert gold_letter(options, "colorectal cancer") == "C"
    assert gold_letter(options, 0) == "A"
    with pytest.raises(ValueError):
        gold_letter(options, "Appendicitis")
    with pytest.raises(ValueError):
        mcq("C", {"options": MEDQA["options"]})
