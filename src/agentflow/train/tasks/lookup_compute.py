"""The shipped training task "lookup_compute": look a number up, then compute with it, two tools in sequence.

"What is the atomic number of gold multiplied by 7?" The bundled 135M model knows few atomic numbers and
cannot multiply reliably, so a right answer needs `wikipedia_search` first (the offline summary of Gold says
"... atomic number 79") and `python` after it (79 * 7, the code reading the looked-up text from `steps`).
The planner must choose the lookup at turn 1 and the computation at turn 2; the outcome reward, broadcast to
both turns, is what teaches the first choice as well as the second.

One kind of question only: the 135M executor cannot pick the operation a question asks for (shown one worked
program, it wrote the right one for 17 of 40 questions mixing four operations, 40 of 40 with one), and the CPU
demonstration gives both tools a fixed input (`tools.X.input`) so that the reward depends on the planner's
choices alone.

Facts: the 86 chemical elements whose summary states "atomic number N". An element is kept only if searching
the offline index for each of its questions returns its article first (checked at generation time with the
tool's own index), so a lookup that is tried can succeed. Elements, not questions, are split between train
and held-out: no held-out question shares its element (or anything else) with training.

Scored with `cover_em`: correct when the number appears in the answer as a whole token (the 135M generator
rarely answers with a bare number). Deterministic: a seeded RNG over the sorted corpus.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from agentflow.scoring.qa import COVER_EM

TASK_NAME = "lookup_compute"
SEED = 20261130
HELD_OUT_ELEMENTS = 40
QUESTIONS_PER_ELEMENT = {"train": 8, "heldout": 5}
TOOLS = ["wikipedia_search", "python"]
"""The right tool at turn 1 and at turn 2."""

_ATOMIC_NUMBER = re.compile(r"\batomic number (\d+)\b")

TEMPLATES: tuple[tuple[str, str, Callable[[int, int], int], tuple[int, int]], ...] = (
    ("times", "What is the atomic number of {name} multiplied by {k}?", lambda z, k: z * k, (3, 19)),
)
"""(kind, question, answer from the atomic number z and the constant k, range of k)."""


def element_facts(summaries: dict[str, dict[str, Any]]) -> list[tuple[str, int]]:
    """(title, atomic number) of every article whose summary states one, sorted by title."""
    facts = []
    for title in sorted(summaries):
        found = _ATOMIC_NUMBER.search(summaries[title].get("extract") or "")
        if found:
            facts.append((title, int(found.group(1))))
    return facts


def _name(title: str) -> str:
    return re.sub(r"\s*\(.*\)$", "", title).lower()


def _questions(title: str, number: int, count: int, rng: random.Random) -> list[dict[str, Any]]:
    """`count` distinct questions about one element, templates in turn from a random start."""
    start = rng.randrange(len(TEMPLATES))
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    for attempt in range(100 * count):
        if len(items) == count:
            break
        kind, text, answer, (low, high) = TEMPLATES[(start + attempt) % len(TEMPLATES)]
        k = rng.randint(low, high)
        question = text.format(name=_name(title), k=k)
        if question in seen:
            continue
        seen.add(question)
        items.append({"question": question, "answer": str(answer(number, k)), "reward": COVER_EM, "kind": kind,
                      "tools": TOOLS, "element": title, "atomic_number": number})
    return items


def generate(summaries: dict[str, dict[str, Any]], *, seed: int = SEED,
             search: Callable[[str], list[str]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Build the splits: {split: records}. Pure function of the corpus, the seed and the index.

    `search(query) -> titles` (the offline index) drops elements with a question whose search does not
    return the element's article first.
    """
    rng = random.Random(seed)
    per_element: list[tuple[str, list[dict[str, Any]]]] = []
    for title, number in element_facts(summaries):
        questions = _questions(title, number, max(QUESTIONS_PER_ELEMENT.values()), rng)
        if search is not None and any(search(q["question"])[:1] != [title] for q in questions):
            continue
        per_element.append((title, questions))
    if len(per_element) <= HELD_OUT_ELEMENTS:
        raise ValueError(f"only {len(per_element)} usable elements; need more than {HELD_OUT_ELEMENTS}")
    rng.shuffle(per_element)
    groups = {"heldout": per_element[:HELD_OUT_ELEMENTS], "train": per_element[HELD_OUT_ELEMENTS:]}
    splits: dict[str, list[dict[str, Any]]] = {}
    for split, elements in sorted(groups.items()):
        records = [q for _, questions in elements for q in questions[:QUESTIONS_PER_ELEMENT[split]]]
        rng.shuffle(records)
        for i, record in enumerate(records):
            record["id"] = f"{TASK_NAME}-{split}-{i:04d}"
        splits[split] = records
    return splits
