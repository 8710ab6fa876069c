"""The shipped training task, "tool_use": questions where choosing the right tool decides success.

Two kinds, mixed half and half:
- arithmetic: multi-digit products and three-term sums that a 135M model cannot do in its head, but the
  `python` tool computes exactly;
- nationality of people from the offline Wikipedia vital-article summaries: "What nationality was X?",
  generated only where the summary's first sentence says "X was a <Nationality> ..." with a nationality
  from a fixed list, so the `wikipedia_search` tool's output contains the answer. "American" is left
  out: it is a quarter of the corpus, and a model that always guesses it would look as if it used the
  tool. Each item is kept only when searching the offline index for the person's name returns their
  article first (checked at generation time with the tool's own index).

Both kinds are scored with `cover_em` (`agentflow.scoring.qa`): correct when the gold answer appears in the
normalised answer as a whole-token span. The bundled 135M generator rarely answers with a bare word
("Georgy Zhukov was a Soviet military leader"), so exact match would score correct answers 0; and the
`math` scorer would accept "6873 * 683" restated from the question, which needs no tool at all.

Generation is deterministic (a seeded RNG over the sorted corpus); people are split between train and
held-out, and arithmetic questions are drawn without repetition, so no question is shared. Regenerate with
`python -m agentflow.train.tasks` (writes src/agentflow/data/tasks/tool_use/{train,heldout}.jsonl).
This was the single-turn demonstration task; `lookup_compute` (two tools in sequence) replaced it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from agentflow.scoring.qa import COVER_EM

TASK_NAME = "tool_use"
SEED = 20251129
SPLITS = {"train": (300, 300), "heldout": (60, 60)}
"""Split -> (arithmetic questions, nationality questions)."""

NATIONALITIES = frozenset("""
    Afghan Albanian Algerian Argentine Armenian Australian Austrian Azerbaijani Bangladeshi Belgian Bolivian
    Brazilian British Bulgarian Burmese Cambodian Canadian Chilean Chinese Colombian Congolese Croatian Cuban
    Czech Danish Dutch Egyptian English Ethiopian Filipino Finnish French Georgian German Ghanaian Greek
    Hungarian Icelandic Indian Indonesian Iranian Iraqi Irish Israeli Italian Jamaican Japanese Kenyan Korean
    Lebanese Lithuanian Malaysian Mexican Mongolian Moroccan Nepalese Nigerian Norwegian Pakistani Persian
    Peruvian Polish Portuguese Romanian Russian Saudi Scottish Senegalese Serbian Slovak Slovenian Soviet
    Spanish Swedish Swiss Syrian Thai Tunisian Turkish Ugandan Ukrainian Uruguayan Venezuelan Vietnamese Welsh
""".split())
"""Nationality adjectives accepted as answers (religions, empires and 'American' are not)."""

_NATIONALITY = re.compile(r"^[^.]*? (was|is) an? ([A-Z][a-z]+) [a-z]")


def _arithmetic(rng: random.Random, seen: set[str]) -> dict[str, Any]:
    while True:
        if rng.random() < 0.6:
            a, b = rng.randint(120, 9999), rng.randint(120, 999)
            question, answer = f"What is {a} * {b}?", a * b
        else:
            a, b, c = rng.randint(1000, 99999), rng.randint(1000, 99999), rng.randint(1000, 99999)
            question, answer = f"What is {a} + {b} + {c}?", a + b + c
        if question not in seen:
            seen.add(question)
            return {"question": question, "answer": str(answer), "reward": COVER_EM, "kind": "arithmetic",
                    "tool": "python"}


def nationality_items(summaries: dict[str, dict[str, Any]],
                      search: Callable[[str], list[str]] | None = None) -> list[dict[str, Any]]:
    """One question per person whose summary opens with a listed nationality, sorted by title.

    `search(query) -> titles` (the offline index) filters out people whose article is not the first hit
    for their own name.
    """
    items = []
    for title in sorted(summaries):
        article = summaries[title]
        if article.get("topic") != "People" or "(" in title:
            continue
        found = _NATIONALITY.match(article.get("extract") or "")
        if not found or found.group(2) not in NATIONALITIES:
            continue
        if search is not None and search(title)[:1] != [title]:
            continue
        tense = found.group(1)
        items.append({"question": f"What nationality {tense} {title}?", "answer": found.group(2),
                      "reward": COVER_EM, "kind": "nationality", "tool": "wikipedia_search",
                      "source_title": title})
    return items


def generate(summaries: dict[str, dict[str, Any]], *, seed: int = SEED,
             search: Callable[[str], list[str]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Build the splits: {split: records}. Pure function of the corpus, the seed and the index."""
    rng = random.Random(seed)
    people = nationality_items(summaries, search)
    rng.shuffle(people)
    seen: set[str] = set()
    splits: dict[str, list[dict[str, Any]]] = {}
    used = 0
    for split, (n_arith, n_people) in sorted(SPLITS.items()):
        if used + n_people > len(people):
            raise ValueError(f"only {len(people)} nationality questions in the corpus; need {used + n_people}")
        records = [_arithmetic(rng, seen) for _ in range(n_arith)] + people[used:used + n_people]
        used += n_people
        rng.shuffle(records)
        for i, record in enumerate(records):
            record["id"] = f"{TASK_NAME}-{split}-{i:04d}"
        splits[split] = records
    return splits
