"""What the bundled offline index can and cannot answer, as README.md and docs/tools.md state it."""

from __future__ import annotations

import json

import pytest

from agentflow.bundled import wiki_summaries_path
from agentflow.wiki_index import get_index

ANSWERED = [
    ("Who painted the Mona Lisa?", "Mona Lisa", "Leonardo da Vinci"),
    ("Who wrote Hamlet?", "Hamlet", "William Shakespeare"),
    ("What is the chemical symbol of gold?", "Gold", "Au"),
    ("Who developed the theory of relativity?", "Theory of relativity", "Albert Einstein"),
]


@pytest.mark.parametrize(("query", "title", "answer"), ANSWERED)
def test_the_documented_examples_find_their_article_first(query: str, title: str, answer: str) -> None:
    first = get_index().search(query, 3)[0]
    assert first.title == title and answer in first.extract


def test_the_documented_hole_is_real_no_summary_names_canberra() -> None:
    corpus = json.loads(wiki_summaries_path().read_text(encoding="utf-8"))
    assert len(corpus) == 10_033
    assert not any("Canberra" in entry["extract"] for entry in corpus.values())
    assert [hit.title for hit in get_index().search("What is the capital of Australia?", 3)] == [
        "Tasmania", "Perth", "Murray River"]
