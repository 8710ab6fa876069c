"""Benchmarks: the registry of named test sets and the loader that turns their files into scored items.

Eight sets ship inside the package (`agentflow/data/benchmarks/`); GAIA and GPQA are loaded from files the user
supplies, because their authors ask that they not be redistributed. Any JSON, JSONL or CSV file in the same
layout is a benchmark too (`agentflow eval path/to/file.jsonl`), with its scorer given or inferred.

Every item gets a stable id `<bench>:<index>:<pid>`: pids alone repeat (MedQA), and the index alone would not
show which source item a result belongs to.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.resources
import io
import json
import logging
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from agentflow.errors import ConfigError
from agentflow.scoring import gold_layout
from agentflow.scoring.gameof24 import puzzle_numbers
from agentflow.scoring.multiple_choice import gold_letter, normalize_options
from agentflow.scoring.qa import accepted_answers

log = logging.getLogger(__name__)

KINDS = ("qa", "math", "gameof24", "multiple_choice")
_KIND_SCORER = {"qa": "exact_match", "math": "math", "gameof24": "gameof24", "multiple_choice": "multiple_choice"}
"""The default scorer of each gold layout; `--scorer` picks any registered scorer (its layout is registered)."""


@dataclass(frozen=True)
class BenchmarkSpec:
    """A named benchmark: where its items come from and how they are scored."""

    name: str
    kind: str
    description: str
    file: str | None = None
    """File shipped in agentflow/data/benchmarks/; None when the user must supply the data."""
    obtain: str = ""
    """Where to get the data of a benchmark that is not shipped."""

    @property
    def scorer(self) -> str:
        return _KIND_SCORER[self.kind]


BENCHMARKS: dict[str, BenchmarkSpec] = {spec.name: spec for spec in [
    BenchmarkSpec("bamboogle", "qa", "Bamboogle: 2-hop questions Google answers wrongly", "bamboogle.json"),
    BenchmarkSpec("2wiki", "qa", "2WikiMultihopQA: multi-hop over Wikipedia", "2wiki.json"),
    BenchmarkSpec("hotpotqa", "qa", "HotpotQA: multi-hop over Wikipedia", "hotpotqa.json"),
    BenchmarkSpec("musique", "qa", "MuSiQue: 2-4 hop composed questions", "musique.json"),
    BenchmarkSpec("gaia", "qa", "GAIA validation, text-only items (user-supplied)", None,
                  "GAIA is gated and not redistributable: accept its terms on Hugging Face "
                  "(https://huggingface.co/datasets/gaia-benchmark/GAIA), download the validation set "
                  "(2023/validation/metadata.jsonl, or a JSON file in the layout of the shipped sets), then run "
                  "`agentflow eval gaia --data PATH`. Items with attached files are skipped (text-only)."),
    BenchmarkSpec("aime24", "math", "AIME 2024 problems", "aime24.json"),
    BenchmarkSpec("amc23", "math", "AMC 2023 problems", "amc23.json"),
    BenchmarkSpec("gameof24", "gameof24", "Game of 24 puzzles", "gameof24.json"),
    BenchmarkSpec("gpqa", "multiple_choice", "GPQA multiple choice (user-supplied)", None,
                  "GPQA is gated and not redistributable: accept its terms on Hugging Face "
                  "(https://huggingface.co/datasets/Idavidrein/gpqa), download e.g. gpqa_diamond.csv (or a JSON "
                  "file with `choices` and `answer_idx`), then run `agentflow eval gpqa --data PATH`."),
    BenchmarkSpec("medqa", "multiple_choice", "MedQA (USMLE) multiple choice", "medqa.json"),
]}


class BenchmarkItem(BaseModel):
    """One question of a benchmark, ready for the agent and the scorer."""

    id: str = Field(..., description="Stable id: <bench>:<index>:<pid>.")
    bench: str
    index: int = Field(..., description="Position in the source file (0-based).")
    pid: str = ""
    question: str = Field(..., description="The text given to the agent (the item's `query` when present).")
    gold: Any = Field(..., description="The reference, in the form the scorer expects.")


class Benchmark(BaseModel):
    """A loaded benchmark: items in file order, the scorer, and the identity of the data they came from."""

    name: str
    scorer: str
    source: str = Field(..., description="'package:<file>' or the path of the user's file.")
    sha256: str = Field(..., description="Hash of the source bytes: a changed file is a different benchmark.")
    items: list[BenchmarkItem]
    notes: list[str] = Field(default_factory=list, description="What the loader skipped or assumed.")


def load_benchmark(bench: str, *, data: str | Path | None = None, scorer: str | None = None,
                   limit: int | None = None) -> Benchmark:
    """Load a named benchmark (with `data` for the user-supplied ones) or a JSON/JSONL/CSV file path."""
    spec = BENCHMARKS.get(bench)
    if spec is not None:
        if scorer is not None and scorer != spec.scorer:
            raise ConfigError(f"{bench} is scored with {spec.scorer!r}; --scorer is for benchmark files only")
        if data is None and spec.file is None:
            raise ConfigError(f"{bench} needs --data PATH. {spec.obtain}")
        if data is not None:
            path = Path(data)
            if not path.is_file():
                raise ConfigError(f"--data {path}: no such file. {spec.obtain}")
            raw, source = path.read_bytes(), str(path.resolve())
            name = spec.name
        else:
            assert spec.file is not None
            resource = importlib.resources.files("agentflow").joinpath(f"data/benchmarks/{spec.file}")
            raw, source = resource.read_bytes(), f"package:{spec.file}"
            name = spec.name
        kind = spec.kind
        records = _read_records(raw, Path(spec.file or str(data)).suffix)
    else:
        if data is not None:
            raise ConfigError("--data goes with a benchmark name (gaia, gpqa); give a file path as BENCH instead")
        path = Path(bench)
        if not path.is_file():
            raise ConfigError(f"unknown benchmark {bench!r} and no such file; benchmarks: {', '.join(BENCHMARKS)}")
        raw, source, name = path.read_bytes(), str(path.resolve()), _bench_name(path)
        records = _read_records(raw, path.suffix)
        if scorer is not None:
            kind = gold_layout(scorer)
        else:
            kind = infer_kind(records, name)
    items, notes = _make_items(name, kind, records, source)
    if limit is not None:
        items = items[:limit]
    return Benchmark(name=name, scorer=scorer or _KIND_SCORER[kind], source=source,
                     sha256=hashlib.sha256(raw).hexdigest(), items=items, notes=notes)


def _bench_name(path: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", path.stem) or "file"


def _read_records(raw: bytes, suffix: str) -> list[dict[str, Any]]:
    text = raw.decode("utf-8-sig")
    suffix = suffix.lower()
    if suffix == ".csv":
        return [dict(row) for row in csv.DictReader(io.StringIO(text))]
    if suffix == ".jsonl":
        records = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ConfigError(f"line {number} is not valid JSON: {err}") from None
    else:
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"not valid JSON: {err}") from None
        records = loaded if isinstance(loaded, list) else loaded.get("data") if isinstance(loaded, dict) else None
        if not isinstance(records, list):
            raise ConfigError("a benchmark JSON file must hold a list of items (or {\"data\": [...]})")
    if not records or not all(isinstance(r, dict) for r in records):
        raise ConfigError("a benchmark file must hold one or more items, each a JSON object")
    return records


def infer_kind(records: list[dict[str, Any]], name: str = "") -> str:
    """Guess how a benchmark file is scored from its fields; `--scorer` overrides the guess."""
    first = records[0]
    if any(k in first for k in ("options", "choices", "Correct Answer")):
        return "multiple_choice"
    questions = [r.get("question") for r in records]
    if "24" in name or all(isinstance(q, list) and len(q) == 4 for q in questions):
        return "gameof24"
    answers = [_answer_field(r) for r in records]
    if all(isinstance(a, (int, float)) and not isinstance(a, bool) or
           isinstance(a, str) and re.fullmatch(r"\s*-?\d+(?:[./]\d+)?\s*", a) for a in answers):
        return "math"
    return "qa"


def _answer_field(record: dict[str, Any]) -> Any:
    for key in ("answer", "Final answer", "final_answer", "gold"):
        if key in record:
            return record[key]
    return None


def _question_text(record: dict[str, Any]) -> str:
    for key in ("query", "question", "Question", "problem"):
        value = record.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ""


def _make_items(name: str, kind: str, records: list[dict[str, Any]],
                source: str) -> tuple[list[BenchmarkItem], list[str]]:
    items: list[BenchmarkItem] = []
    skipped_with_files = 0
    for index, record in enumerate(records):
        if str(record.get("file_name") or "").strip():
            skipped_with_files += 1  # GAIA items that need an attached file: this evaluation is text-only
            continue
        pid = str(record.get("pid", record.get("task_id", record.get("idx", index))))
        try:
            question, gold = _QUESTION_AND_GOLD[kind](record)
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"{source}: item {index} (pid {pid}): {err}") from None
        if not question:
            raise ConfigError(f"{source}: item {index} (pid {pid}) has no question text (query/question)")
        items.append(BenchmarkItem(id=f"{name}:{index}:{pid}", bench=name, index=index, pid=pid,
                                   question=question, gold=gold))
    notes = []
    if skipped_with_files:
        notes.append(f"skipped {skipped_with_files} items that need an attached file (text-only evaluation)")
    if not items:
        raise ConfigError(f"{source}: no usable items")
    return items, notes


def _qa(record: dict[str, Any]) -> tuple[str, Any]:
    answer = _answer_field(record)
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        raise ValueError("no answer")
    golds = [g for g in accepted_answers(answer) if g.strip()]
    if not golds:
        raise ValueError("no non-empty accepted answer")
    return _question_text(record), golds


def _math(record: dict[str, Any]) -> tuple[str, Any]:
    answer = _answer_field(record)
    if answer is None or str(answer).strip() == "":
        raise ValueError("no answer")
    return _question_text(record), str(answer).strip()


def _gameof24(record: dict[str, Any]) -> tuple[str, Any]:
    numbers = puzzle_numbers(record.get("numbers", record.get("question")))
    question = record.get("query") if isinstance(record.get("query"), str) and record["query"].strip() else None
    if question is None:
        question = (f"Using the numbers {numbers}, create an expression that equals 24. You must use basic "
                    "arithmetic operations (+, -, ×, /) and parentheses. Each number must be used exactly once.")
    return question.strip(), numbers


def _multiple_choice(record: dict[str, Any]) -> tuple[str, Any]:
    question = _question_text(record)
    if "Correct Answer" in record:
        # The Hugging Face GPQA layout: one right and three wrong texts. Shuffle them with a seed taken from the
        # question, so the order is fixed across runs and machines but the right answer is not always first.
        texts = [record["Correct Answer"]] + [record[f"Incorrect Answer {i}"] for i in (1, 2, 3)]
        texts = [str(t).strip() for t in texts]
        order = list(range(4))
        random.Random(hashlib.sha256(question.encode()).hexdigest()).shuffle(order)
        options = normalize_options([texts[i] for i in order])
        right = "ABCD"[order.index(0)]
    else:
        raw_options = record.get("options", record.get("choices"))
        if isinstance(raw_options, str):
            raw_options = accepted_answers(raw_options)
        options = normalize_options(raw_options)
        right = _right_letter(options, record)
    if not all(text.strip() in question for text in options.values()):
        lines = "\n".join(f"{letter}. {text}" for letter, text in options.items())
        question = f"{question}\n{lines}"
    return question, {"options": options, "answer": right}


def _right_letter(options: dict[str, str], record: dict[str, Any]) -> str:
    answer = record.get("answer")
    index = record.get("answer_idx")
    if index is None or str(index).strip() == "":
        if answer is None:
            raise ValueError("no answer or answer_idx")
        return gold_letter(options, _strip_letter(answer))
    from_text = gold_letter(options, _strip_letter(answer)) if answer not in (None, "") else None
    if isinstance(index, str) and re.fullmatch(r"\s*\(?[A-Za-z]\)?\s*", index):
        letter = gold_letter(options, _strip_letter(index))
    else:
        position = int(index)
        letters = list(options)
        # answer_idx is 0-based in most releases; when the answer text says otherwise, trust the text.
        candidates = [letters[p] for p in (position, position - 1) if 0 <= p < len(letters)]
        letter = from_text if from_text in candidates else candidates[0] if candidates else ""
        if not letter:
            raise ValueError(f"answer_idx {index} out of range")
    if from_text is not None and from_text != letter:
        raise ValueError(f"answer {answer!r} disagrees with answer_idx {index!r}")
    return letter


def _strip_letter(value: Any) -> Any:
    if isinstance(value, str):
        match = re.fullmatch(r"\s*\(?([A-Za-z])\)?\.?\s*", value)
        if match:
            return match.group(1).upper()
    return value


_QUESTION_AND_GOLD = {"qa": _qa, "math": _math, "gameof24": _gameof24, "multiple_choice": _multiple_choice}
