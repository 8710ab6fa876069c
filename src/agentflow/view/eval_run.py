"""An eval run directory (`agentflow eval --out DIR`) as the viewer sees it: summaries and item rows, followed
while the run writes; one item with its trajectory."""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agentflow.eval.results import ItemResult, summarize
from agentflow.view.jsonl_tail import JsonlTail

log = logging.getLogger(__name__)


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def gold_text(gold: Any) -> str:
    """A gold answer as one line: lists joined (any of them is right), other values as JSON."""
    if isinstance(gold, str):
        return gold
    if isinstance(gold, list) and all(isinstance(g, str) for g in gold):
        return " | ".join(gold)
    return json.dumps(gold, ensure_ascii=False)


ROW_COLUMNS = ("id", "bench", "index", "status", "correct", "question", "prediction", "gold", "turns", "tools",
               "invalid_tool_turns", "seconds", "tokens", "stop_reason", "error", "error_message", "judge")


def item_row(record: ItemResult) -> list[Any]:
    """What the item table needs of one result line, in ROW_COLUMNS order (a 10,000-item run is sent as rows
    of values, not of key/value objects); long texts are cut, the item page has them whole."""
    tokens = record.tokens
    error = record.error
    return [record.id, record.bench, record.index, record.status, record.correct, clip(record.question, 300),
            clip(record.prediction, 200), clip(gold_text(record.gold), 150), record.turns, record.tools,
            record.invalid_tool_turns, round(record.seconds, 2),
            tokens.get("prompt_tokens", 0) + tokens.get("completion_tokens", 0), record.stop_reason,
            error.kind if error else None, clip(error.message, 200) if error else None,
            record.judge.get("correct") if record.judge else None]


TOKEN_ARRAYS = ("prompt_token_ids", "token_ids", "logprobs")


def without_token_arrays(value: Any) -> Any:
    """A trajectory without its per-token ids and log-probs (the trainer's, often most of the file), which no page
    shows; the file on disk keeps them."""
    if isinstance(value, dict):
        return {k: without_token_arrays(v) for k, v in value.items() if k not in TOKEN_ARRAYS}
    if isinstance(value, list):
        return [without_token_arrays(v) for v in value]
    return value


def read_json_file(path: Path) -> tuple[Any, str | None]:
    """(content, None), or (None, why it could not be read)."""
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except FileNotFoundError:
        return None, f"{path.name} is missing"
    except (OSError, ValueError) as err:
        return None, f"{path.name} cannot be read: {err}"


def inside(directory: Path, relative: str) -> Path | None:
    """`directory/relative` if it stays inside `directory` (a results line must not point elsewhere)."""
    root = directory.resolve()
    path = (root / relative).resolve()
    return path if path.is_relative_to(root) else None


class EvalRunView:
    """Reads DIR/results.jsonl incrementally (thread-safe): a poll costs one `stat` when nothing changed."""

    kind = "eval"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._tail = JsonlTail(directory / "results.jsonl")
        self._lock = threading.Lock()
        self.generation = 0
        self.rows: list[list[Any]] = []
        self.items: dict[str, ItemResult] = {}
        self._summaries: tuple[tuple[int, int], list[dict[str, Any]], dict[str, int]] | None = None

    def refresh(self) -> None:
        with self._lock:
            new = self._tail.read_new_lines()
            if self._tail.reset:
                self.generation += 1
                self.rows, self.items = [], {}
            for number, line in new:
                try:
                    record = ItemResult.model_validate_json(line)
                except ValidationError as err:
                    log.warning("%s:%d: skipping a line that is not a result: %s", self._tail.path, number,
                                err.errors()[0]["msg"])
                    continue
                self.items[record.id] = record
                self.rows.append(item_row(record))

    def config(self) -> dict[str, Any]:
        """config.json, or {} when it is missing or unreadable."""
        return self._config()

    def _config(self) -> dict[str, Any]:
        config, _ = read_json_file(self.directory / "config.json")
        return config if isinstance(config, dict) else {}

    def _state(self, config: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """'finished' when summary.json was written after the last invocation started, else 'in progress'."""
        summary, _ = read_json_file(self.directory / "summary.json")
        invocations = config.get("invocations") or [{}]
        started = str(invocations[-1].get("started_at", ""))
        if isinstance(summary, dict) and str(summary.get("written_at", "")) >= started:
            return ("interrupted" if summary.get("interrupted") else "finished"), summary
        return "in progress", {}

    def _summarize(self, config: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, int]]:
        """Per-benchmark summaries (the numbers `agentflow eval` prints) and failure kinds; recomputed only when
        a result line was added, not on every poll. Call with the lock held."""
        key = (self.generation, len(self.rows))
        if self._summaries is None or self._summaries[0] != key:
            by_bench: dict[str, list[ItemResult]] = {}
            for record in self.items.values():
                by_bench.setdefault(record.bench, []).append(record)
            scorers = config.get("benchmarks", {})
            benchmarks = [summarize(name, records, scorer=scorers.get(name, {}).get("scorer", "")).model_dump(
                mode="json", exclude={"failed_items", "this_run"}) for name, records in sorted(by_bench.items())]
            failures = Counter(r.error.kind if r.error else "unknown" for r in self.items.values()
                               if r.status != "scored")
            self._summaries = (key, benchmarks, dict(failures.most_common()))
        return self._summaries[1], self._summaries[2]

    def overview(self, *, after: int = 0, generation: int | None = None) -> dict[str, Any]:
        """Summaries per benchmark and the item rows from line `after` on (all rows after a reset)."""
        self.refresh()
        config = self._config()
        state, summary = self._state(config)
        with self._lock:
            if generation != self.generation or after > len(self.rows):
                after = 0
            rows = self.rows[after:]
            count, gen = len(self.rows), self.generation
            benchmarks, failures = self._summarize(config)
        pending = {name: entry.get("pending", 0) for name, entry in summary.get("benchmarks", {}).items()}
        benchmarks = [{**entry, "pending": pending.get(entry["bench"], 0)} for entry in benchmarks]
        return {"kind": self.kind, "path": str(self.directory), "name": self.directory.name, "state": state,
                "config": config, "benchmarks": benchmarks, "failure_kinds": failures, "generation": gen,
                "lines": count, "from": after, "columns": ROW_COLUMNS, "rows": rows}

    def item(self, item_id: str) -> dict[str, Any] | None:
        """The whole result line of one item and its trajectory (or why it could not be read)."""
        self.refresh()
        with self._lock:
            record = self.items.get(item_id)
        if record is None:
            return None
        trajectory, problem = None, None
        if record.trajectory:
            path = inside(self.directory, record.trajectory)
            if path is None:
                problem = f"the trajectory path {record.trajectory!r} leaves the run directory"
            else:
                trajectory, problem = read_json_file(path)
                trajectory = without_token_arrays(trajectory)
        else:
            problem = "no trajectory was recorded for this item"
        return {"kind": "eval_item", "run": self.directory.name, "item": record.model_dump(mode="json"),
                "trajectory": trajectory, "trajectory_problem": problem}
