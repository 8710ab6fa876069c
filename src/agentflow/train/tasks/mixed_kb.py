"""The shipped training task "mixed_kb": seven kinds of question over six tools, one plan per kind.

The three kinds of `mixed` (compute: `python`; look up an atomic number: `wikipedia_search`; look it up, then
compute: `wikipedia_search`, `python`), and four look-ups in collections of the task's own, each offered as a
tool of its own (`document_search` under the collection's name):

- `staff`: a colleague's phone extension, in `staff_directory`;
- `product`: a product's price in euros, in `product_catalog`;
- `train`: a named train's number, in `train_timetable`;
- `book`: a book's call number, in `library_catalog`.

Why these: in `mixed` an unneeded call costs nothing (a surplus step prints the same number or fails, and the
generator reads every step), so a planner that learns one sequence, `wikipedia_search` then `python`, holds
every kind's plan in order and loses only where a module fails. Here no sequence of three tools holds the
tools of more than four of the seven kinds, and a kind whose tool is not called cannot be answered: its facts
exist only in its collection (names, numbers and collections are invented, so the model cannot know them).
That bounds every constant by construction, whatever the executor and the generator do.

Train and held-out share no entity and no phrasing (three templates of each kind for each split; the element
and compute kinds use `mixed`'s templates). The collections hold every entity of both splits and some that no
question asks about. Deterministic: a seeded RNG; regenerate with `python -m agentflow.train.tasks`.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from agentflow.scoring.qa import COVER_EM
from agentflow.train.tasks.lookup_compute import _name, element_facts
from agentflow.train.tasks.mixed import TEMPLATES as MIXED_TEMPLATES
from agentflow.train.tasks.mixed import _compute

TASK_NAME = "mixed_kb"
SEED = 20261206
PER_KIND = {"train": 90, "heldout": 45}
"""Questions of each kind in each split (three templates: 30 and 15 entities per collection kind)."""
UNASKED = 15
"""Entities per collection that no question asks about."""

PLANS: dict[str, list[str]] = {
    "compute": ["python"],
    "lookup": ["wikipedia_search"],
    "lookup_compute": ["wikipedia_search", "python"],
    "staff": ["staff_directory"],
    "product": ["product_catalog"],
    "train": ["train_timetable"],
    "book": ["library_catalog"],
}
"""The right tools of each kind, in order (then the action `answer`)."""

COLLECTION_OF = {"staff": "staff_directory", "product": "product_catalog", "train": "train_timetable",
                 "book": "library_catalog"}

TEMPLATES: dict[str, dict[str, tuple[str, ...]]] = {
    "staff": {
        "train": ("What is the phone extension of {e}?", "Which extension reaches {e}?",
                  "Tell me the desk phone extension of {e}."),
        "heldout": ("{e} has which phone extension?", "How do I call {e}: which extension?",
                    "Give me the extension number of {e}."),
    },
    "product": {
        "train": ("How much does the {e} cost?", "What is the price of the {e}?", "How many euros is the {e}?"),
        "heldout": ("What does the {e} sell for?", "Tell me the price in euros of the {e}.",
                    "What is the {e}'s price in euros?"),
    },
    "train": {
        "train": ("What is the train number of the {e}?", "Which train number does the {e} run as?",
                  "Tell me the number of the {e} train."),
        "heldout": ("The {e} runs under which train number?", "Look up the train number of the {e}.",
                    "What number does the {e} train have?"),
    },
    "book": {
        "train": ("What is the call number of the book {e}?", "Under which call number is {e} shelved?",
                  "Find the library call number of {e}."),
        "heldout": ("{e} has which call number in the library?", "Where is {e} shelved: what call number?",
                    "Give me the call number of the novel {e}."),
    },
    "lookup": MIXED_TEMPLATES["lookup"],
    "lookup_compute": MIXED_TEMPLATES["lookup_compute"],
    "compute": MIXED_TEMPLATES["compute"],
}
"""Kind -> split -> phrasings; {e} is the entity's name."""

SUB_GOALS = {"staff": "Extension of {e}", "product": "Price of the {e}", "train": "Train number of the {e}",
             "book": "Call number of {e}"}
"""What a planner that knows the plan asks of the look-up (the scripted ceiling's sub-goal)."""

_ONSETS = tuple("bdfgklmnprstvz")
_VOWELS = tuple("aeiou")
_CODAS = ("", "n", "r", "l", "s")
_ITEMS = ("kettle", "lamp", "backpack", "blender", "desk", "kite", "tent", "scooter", "toaster", "umbrella",
          "armchair", "camera", "guitar", "heater", "mirror")
_COLOURS = ("red", "blue", "green", "grey", "black", "white", "yellow", "brown")
_ROLES = ("accountant", "engineer", "designer", "recruiter", "analyst", "lawyer", "chemist", "planner")
_TEAMS = ("finance", "design", "sales", "legal", "research", "support", "logistics")
_BOOK_NOUNS = ("Chronicles", "Letters", "Garden", "Voyage", "Riddle", "Orchard", "Lantern", "Harbour", "Winter",
               "Archive")


def _word(rng: random.Random) -> str:
    """An invented two-syllable name, e.g. 'Velnor'."""
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(2)).capitalize()


class _Names:
    """Invented words, each used once, none a word of the Wikipedia summaries."""

    def __init__(self, rng: random.Random, vocabulary: set[str]) -> None:
        self.rng, self.taken = rng, set(vocabulary)

    def __call__(self) -> str:
        while True:
            word = _word(self.rng)
            if word.lower() not in self.taken and len(word) >= 5:
                self.taken.add(word.lower())
                return word


def _entity(kind: str, names: _Names, rng: random.Random) -> tuple[str, str, int]:
    """(name, the collection document's text, the number a question asks for)."""
    if kind == "staff":
        number = rng.randint(2000, 8999)
        return (f"{names()} {names()}",
                f"Phone extension {number}. {rng.choice(_ROLES).capitalize()} in the {rng.choice(_TEAMS)} team.",
                number)
    if kind == "product":
        number, item = rng.randint(100, 999), rng.choice(_ITEMS)
        return f"{names()} {item}", f"Price {number} euros. A {rng.choice(_COLOURS)} {item} from our catalogue.", number
    if kind == "train":
        number = rng.randint(10000, 99999)
        return f"{names()} Express", f"Train number {number}. Runs from {names()} to {names()}.", number
    number = rng.randint(1000, 9999)
    return (f"The {names()} {rng.choice(_BOOK_NOUNS)}",
            f"Call number {number}. A novel by {names()} {names()}.", number)


def _world(summaries: dict[str, dict[str, Any]], seed: int) -> dict[str, dict[str, list[tuple[str, str, int]]]]:
    """Kind -> split ('train', 'heldout', 'unasked') -> entities; one deterministic draw for questions and
    collections alike."""
    vocabulary = {w.lower() for item in summaries.values()
                  for w in re.findall(r"[A-Za-z]+", f"{item.get('title', '')} {item.get('extract', '')}")}
    rng = random.Random(seed)
    names = _Names(rng, vocabulary)
    sizes = {split: PER_KIND[split] // 3 for split in ("train", "heldout")} | {"unasked": UNASKED}
    return {kind: {split: [_entity(kind, names, rng) for _ in range(n)] for split, n in sizes.items()}
            for kind in COLLECTION_OF}


def collections(summaries: dict[str, dict[str, Any]], *, seed: int = SEED) -> dict[str, list[dict[str, str]]]:
    """Collection name -> its documents (`title`, `extract`: the format `document_search` reads), sorted by
    title so no split can be read off the order."""
    world = _world(summaries, seed)
    return {COLLECTION_OF[kind]: sorted(({"title": name, "extract": text} for split in splits.values()
                                         for name, text, _ in split), key=lambda d: d["title"])
            for kind, splits in world.items()}


def _element_kinds(summaries: dict[str, dict[str, Any]], rng: random.Random,
                   search: Callable[[str], list[str]] | None) -> dict[str, list[dict[str, Any]]]:
    """Look-up and look-up-then-compute questions: 15 held-out elements and 30 training ones."""
    usable = []
    for title, number in element_facts(summaries):
        name = _name(title)
        fill = {"name": name, "Name": name[:1].upper() + name[1:]}
        items = {}
        for split in ("train", "heldout"):
            items[split] = [{"question": t.format(**fill), "answer": str(number), "kind": "lookup",
                             "template": t, "sub_goals": [f"Find the atomic number of {name}"]}
                            for t in TEMPLATES["lookup"][split]]
            for t in TEMPLATES["lookup_compute"][split]:
                k = rng.randint(3, 19)
                items[split].append({"question": t.format(k=k, **fill), "answer": str(number * k),
                                     "kind": "lookup_compute", "template": t,
                                     "sub_goals": [f"Find the atomic number of {name}",
                                                   f"Multiply the atomic number by {k}"]})
            for item in items[split]:
                item.update(element=title, atomic_number=number)
        queries = [name] + [q["question"] for split in items.values() for q in split]
        if search is None or all(search(query)[:1] == [title] for query in queries):
            usable.append(items)
    held, trained = PER_KIND["heldout"] // 3, PER_KIND["train"] // 3
    if len(usable) < held + trained:
        raise ValueError(f"only {len(usable)} usable elements; need {held + trained}")
    rng.shuffle(usable)
    return {"heldout": [q for items in usable[:held] for q in items["heldout"]],
            "train": [q for items in usable[held:held + trained] for q in items["train"]]}


def generate(summaries: dict[str, dict[str, Any]], *, seed: int = SEED,
             search: Callable[[str], list[str]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Build the splits: {split: records}. Pure function of the corpus, the seed and the index (`search(query)
    -> titles` drops elements whose name or questions do not find their article first)."""
    rng = random.Random(seed + 1)
    elements = _element_kinds(summaries, rng, search)
    world = _world(summaries, seed)
    splits: dict[str, list[dict[str, Any]]] = {}
    seen: set[str] = set()
    for split in ("heldout", "train"):
        records = list(elements[split])
        for kind, entities in world.items():
            for name, _, number in entities[split]:
                for template in TEMPLATES[kind][split]:
                    records.append({"question": template.format(e=name), "answer": str(number), "kind": kind,
                                    "template": template, "entity": name,
                                    "sub_goals": [SUB_GOALS[kind].format(e=name)]})
        templates = TEMPLATES["compute"][split]
        count = 0
        while count < PER_KIND[split]:
            template = templates[count % len(templates)]
            question, answer = _compute(template, rng)
            if question in seen:
                continue
            seen.add(question)
            count += 1
            numbers = re.findall(r"\d+", question)
            records.append({"question": question, "answer": str(answer), "kind": "compute", "template": template,
                            "sub_goals": ["Compute " + (" + " if "{c}" in template else " * ").join(numbers)]})
        for record in records:
            record.update(tools=PLANS[record["kind"]], reward=COVER_EM)
        rng.shuffle(records)
        for i, record in enumerate(records):
            record["id"] = f"{TASK_NAME}-{split}-{i:04d}"
        splits[split] = records
    return splits
