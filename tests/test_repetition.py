"""Degenerate repetition is cut from model text: any loop of words that runs to the end of a reply."""

from __future__ import annotations

import pytest

from agentflow.textsafe import cut_repetition


@pytest.mark.parametrize(("text", "kept"), [
    ("The answer is 42. " * 8, "The answer is 42."),
    ("Seurat was born in 1859. He was born in Paris. He was born in Paris. He was born in Paris. He was born",
     "Seurat was born in 1859. He was born in Paris."),
    ("1859 1859 1859 1859 1859 1859 1859", "1859"),
    ("What is 2+2? What is 2+2? What is 2+2? What is", "What is 2+2?"),
    ("Searches: Marshall McLuhan\n\nSearches: Marshall McLuhan\n\nSearches: Marshall McLuhan\n\nSear",
     "Searches: Marshall McLuhan"),  # the last copy cut mid-word
])
def test_a_loop_that_runs_to_the_end_is_cut_after_its_first_copy(text: str, kept: str) -> None:
    assert cut_repetition(text) == kept


@pytest.mark.parametrize("text", [
    "",
    "Paris",
    "ha ha ha",                                              # short repetition is language, not a loop
    "He said no, no, no and left the room for good.",        # repetition followed by other text
    "The sum is 3. The sum is 3. Then the product is 2.",    # repeated in the middle only
    "1 2 3 4 5 6 7 8 9 10",
])
def test_text_without_a_trailing_loop_is_unchanged(text: str) -> None:
    assert cut_repetition(text) == text


def test_long_text_is_cut_and_a_huge_one_is_bounded() -> None:
    text = "word " * 5 + "the loop goes on and on " * 150  # 905 words, inside the window
    assert cut_repetition(text) == "word word word word word the loop goes on and on"
    huge = "the loop goes on and on " * 20_000  # 120,000 words: only the last MAX_REPEAT_WINDOW are read
    cut = cut_repetition(huge)
    assert huge.startswith(cut) and len(huge) - len(cut) > 3_900  # the window's ~165 copies gone, one kept
