"""The shipped training task "mixed": three kinds of question, each needing its own plan.

- `compute`: arithmetic the 135M model cannot do in its head ("Multiply 6873 by 683."): `python`, then answer.
- `lookup`: a fact stated in a Wikipedia summary ("What atomic number does the element gold have?"):
  `wikipedia_search`, then answer.
- `lookup_compute`: the fact, then arithmetic on it ("Multiply the atomic number of gold by 7."):
  `wikipedia_search`, then `python`, then answer.

No one tool sequence serves all three: a planner must read the question to plan, which is what Flow-GRPO is to
teach (a planner that learns one sequence for every question cannot pass). In the flow it is trained in, the
planner writes its whole reply (tool and sub-goal), the executor writes every tool call, and the planner ends
the turns itself with the action `answer` (`planner_stop`), so a question that needs one tool stops after one.

Train and held-out share no element and no phrasing: each kind has six templates, three for training and
three held out; elements are split between the splits. The facts are the atomic numbers stated in the offline
summaries ("... atomic number 79 ..."); an element is kept only if the offline index returns its article
first when searched for its name and for each of its questions, so a look-up that is tried can succeed.
Scored with `cover_em` (the gold appears in the answer as a whole token). Deterministic: a seeded RNG over
the sorted corpus; regenerate with `python -m agentflow.train.tasks`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from agentflow.scoring.qa import COVER_EM
from agentflow.train.tasks.lookup_compute import _name, element_facts

TASK_NAME = "mixed"
SEED = 20261201
HELD_OUT_ELEMENTS = 35
COMPUTE_QUESTIONS = {"train": 90, "heldout": 105}
MULTIPLIERS_PER_TEMPLATE = {"train": 1, "heldout": 1}
"""Look-up-then-compute questions per element and template (each with its own multiplier)."""

PLANS: dict[str, list[str]] = {
    "compute": ["python"],
    "lookup": ["wikipedia_search"],
    "lookup_compute": ["wikipedia_search", "python"],
}
"""The right tools of each kind, in order (then the action `answer`)."""

TEMPLATES: dict[str, dict[str, tuple[str, ...]]] = {
    "lookup": {
        "train": ("What is the atomic number of {name}?", "Which atomic number does {name} have?",
                  "Tell me the atomic number of {name}."),
        "heldout": ("What atomic number does the element {name} have?", "Look up the atomic number of {name}.",
                    "{Name} has which atomic number?"),
    },
    "lookup_compute": {
        "train": ("What is the atomic number of {name} multiplied by {k}?",
                  "Take the atomic number of {name} and multiply it by {k}.",
                  "What is {k} times the atomic number of {name}?"),
        "heldout": ("Multiply the atomic number of {name} by {k}.",
                    "What do you get if you multiply the atomic number of {name} by {k}?",
                    "Compute {k} times the atomic number of the element {name}."),
    },
    "compute": {
        "train": ("What is {a} * {b}?", "Calculate {a} times {b}.", "What is the sum of {a}, {b} and {c}?"),
        "heldout": ("Multiply {a} by {b}.", "What do you get when you multiply {a} and {b}?",
                    "How much is {a} plus {b} plus {c}?"),
    },
}
"""Kind -> split -> phrasings. Compute templates with {c} are three-term sums, the others products."""


def _compute(template: str, rng: random.Random) -> tuple[str, int]:
    if "{c}" in template:
        a, b, c = (rng.randint(1000, 99999) for _ in range(3))
        return template.format(a=a, b=b, c=c), a + b + c
    a, b = rng.randint(120, 9999), rng.randint(120, 999)
    return template.format(a=a, b=b), a * b


def _element_questions(title: str, number: int, split: str, rng: random.Random) -> list[dict[str, Any]]:
    name = _name(title)
    fill = {"name": name, "Name": name[:1].upper() + name[1:]}
    base = {"reward": COVER_EM, "element": title, "atomic_number": number}
    items = [{"question": text.format(**fill), "answer": str(number), "kind": "lookup",
              "tools": PLANS["lookup"], "template": text, **base} for text in TEMPLATES["lookup"][split]]
    for text in TEMPLATES["lookup_compute"][split]:
        for k in rng.sample(range(3, 20), MULTIPLIERS_PER_TEMPLATE[split]):
            items.append({"question": text.format(k=k, **fill), "answer": str(number * k),
                          "kind": "lookup_compute", "tools": PLANS["lookup_compute"], "template": text, **base})
    return items


def generate(summaries: dict[str, dict[str, Any]], *, seed: int = SEED,
             search: Callable[[str], list[str]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Build the splits: {split: records}. Pure function of the corpus, the seed and the index.

    `search(query) -> titles` (the offline index) drops elements whose name or questions do not find their
    article first.
    """
    rng = random.Random(seed)
    elements: list[dict[str, list[dict[str, Any]]]] = []
    for title, number in element_facts(summaries):
        questions = {split: _element_questions(title, number, split, rng) for split in ("train", "heldout")}
        queries = [_name(title)] + [q["question"] for split in questions.values() for q in split]
        if search is not None and any(search(query)[:1] != [title] for query in queries):
            continue
        elements.append(questions)
    if len(elements) <= HELD_OUT_ELEMENTS:
        raise ValueError(f"only {len(elements)} usable elements; need more than {HELD_OUT_ELEMENTS}")
    rng.shuffle(elements)
    chosen = {"heldout": elements[:HELD_OUT_ELEMENTS], "train": elements[HELD_OUT_ELEMENTS:]}
    splits: dict[str, list[dict[str, Any]]] = {}
    seen: set[str] = set()
    for split in ("heldout", "train"):
        records = [q for questions in chosen[split] for q in questions[split]]
        templates = TEMPLATES["compute"][split]
        while sum(r["kind"] == "compute" for r in records) < COMPUTE_QUESTIONS[split]:
            template = templates[sum(r["kind"] == "compute" for r in records) % len(templates)]
            question, answer = _compute(template, rng)
            if question not in seen:
                seen.add(question)
                records.append({"question": question, "answer": str(answer), "reward": COVER_EM,
                                "kind": "compute", "tools": PLANS["compute"], "template": template})
        rng.shuffle(records)
        for i, record in enumerate(records):
            record["id"] = f"{TASK_NAME}-{split}-{i:04d}"
        splits[split] = records
    return splits
