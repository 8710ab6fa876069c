"""Training and held-out questions: loading, and a resumable deterministic batch order.

The batch order is a pure function of (seed, position): epoch e is the permutation of the items drawn by
`random.Random(seed * 1_000_003 + e)`, cut into len(items) // batch_size batches; the len(items) % batch_size
items left at its end are not drawn in that epoch, so a batch never holds a question twice (its G
trajectories would merge into one group). With strata (`data.stratify_field`), each stratum is shuffled by
that generator and the strata are interleaved in proportion to their sizes, so each batch holds every
stratum in its share. A checkpoint stores only `position` (items drawn), so `--resume` produces exactly the
batches the killed run would have produced.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentflow.errors import ConfigError
from agentflow.train.config import DataSettings


@dataclass(frozen=True)
class Question:
    """One training or held-out item."""

    id: str
    question: str
    answer: Any
    reward: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


def _read_records(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        lines = path.read_text(encoding="utf-8").splitlines()
        records = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ConfigError(f"{path}:{number}: not valid JSON: {err}") from None
        return records
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict):
            data = list(data.values())
        if not isinstance(data, list):
            raise ConfigError(f"{path}: expected a JSON list of records")
        return data
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ConfigError(f"{path}: reading parquet needs `pip install pyarrow`") from None
        return pq.read_table(path).to_pylist()
    raise ConfigError(f"{path}: unsupported format {suffix!r}; use .jsonl, .json or .parquet")


def load_questions(path: str | Path, settings: DataSettings) -> list[Question]:
    """Load questions; every record needs the question and answer fields. Ids must be unique."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"question file not found: {path}")
    questions: list[Question] = []
    seen: set[str] = set()
    known = {settings.question_field, settings.answer_field, settings.reward_field, settings.id_field}
    for number, record in enumerate(_read_records(path), 1):
        if not isinstance(record, dict):
            raise ConfigError(f"{path}: record {number} is not an object")
        missing = [f for f in (settings.question_field, settings.answer_field) if f not in record]
        if missing:
            raise ConfigError(f"{path}: record {number} lacks field(s) {', '.join(missing)}")
        item_id = str(record.get(settings.id_field, f"{path.stem}-{number}"))
        if item_id in seen:
            raise ConfigError(f"{path}: item id {item_id!r} appears twice")
        seen.add(item_id)
        questions.append(Question(
            id=item_id, question=str(record[settings.question_field]), answer=record[settings.answer_field],
            reward=str(record.get(settings.reward_field) or settings.default_reward),
            meta={k: v for k, v in record.items() if k not in known}))
    if not questions:
        raise ConfigError(f"{path}: no questions")
    return questions


def training_questions(settings: DataSettings) -> list[Question]:
    """The training questions (`train_path`, else the shipped task's split) less `exclude_train_ids`."""
    questions = load_questions(settings.train_path or default_paths(settings.task)[0], settings)
    if not settings.exclude_train_ids:
        return questions
    dropped = set(settings.exclude_train_ids)
    unknown = sorted(dropped - {q.id for q in questions})
    if unknown:
        raise ConfigError(f"data.exclude_train_ids: {len(unknown)} id(s) not among the training questions, "
                          f"e.g. {unknown[0]!r}")
    kept = [q for q in questions if q.id not in dropped]
    if not kept:
        raise ConfigError("data.exclude_train_ids drops every training question")
    return kept


def held_out_questions(settings: DataSettings) -> list[Question]:
    """The held-out questions (`eval_path`, else the shipped task's split), all of them."""
    return load_questions(settings.eval_path or default_paths(settings.task)[1], settings)


def default_paths(task: str | None = None) -> tuple[Path, Path]:
    """Train and held-out files of a shipped task (default: `lookup_compute`)."""
    from agentflow.train.tasks import DEFAULT_TASK, task_path

    return task_path("train", task or DEFAULT_TASK), task_path("heldout", task or DEFAULT_TASK)


class BatchSampler:
    """Deterministic, resumable batches: epoch-wise shuffles seeded by (seed, epoch)."""

    def __init__(self, items: list[Question], *, batch_size: int, seed: int, position: int = 0,
                 stratify_field: str | None = None) -> None:
        if batch_size > len(items):
            raise ConfigError(f"batch_size {batch_size} exceeds the {len(items)} training questions")
        self.items = items
        self.batch_size = batch_size
        self.seed = seed
        self.position = position
        self.strata: list[list[int]] = [list(range(len(items)))]
        """Item indices per stratum, in file order (one stratum: no `stratify_field`)."""
        if stratify_field is not None:
            by_value: dict[str, list[int]] = {}
            for index, item in enumerate(items):
                if stratify_field not in item.meta:
                    raise ConfigError(f"item {item.id!r} has no field {stratify_field!r} (data.stratify_field)")
                by_value.setdefault(str(item.meta[stratify_field]), []).append(index)
            self.strata = [by_value[value] for value in sorted(by_value)]
        self._epoch_cache: tuple[int, list[int]] | None = None

    def _order(self, epoch: int) -> list[int]:
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            rng = random.Random(self.seed * 1_000_003 + epoch)
            keyed: list[tuple[float, int, int]] = []
            for rank_of_stratum, stratum in enumerate(self.strata):
                order = list(stratum)
                rng.shuffle(order)
                # the k-th of n items of a stratum sits at (k + 0.5) / n of the epoch: proportional interleaving
                keyed += [((k + 0.5) / len(order), rank_of_stratum, index) for k, index in enumerate(order)]
            self._epoch_cache = (epoch, [index for _, _, index in sorted(keyed)])
        return self._epoch_cache[1]

    def next_batch(self) -> list[Question]:
        epoch, index = divmod(self.position // self.batch_size, len(self.items) // self.batch_size)
        start = index * self.batch_size
        self.position += self.batch_size
        return [self.items[i] for i in self._order(epoch)[start:start + self.batch_size]]
