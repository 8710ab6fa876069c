"""The results file: append-only JSONL, one line per finished item, that survives `kill -9`.

Each line is written with one `write` and made durable with `fsync` before the next item is counted, so a
killed run loses at most the line being written. A torn last line (no trailing newline) is cut off when the
file is opened again. When an item appears twice (a failed item retried with --retry-failed), the later line
wins.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from agentflow.textsafe import model_json

log = logging.getLogger(__name__)

RESULTS_FORMAT_VERSION = 1


class ItemError(BaseModel):
    """Why an item has no score: the failure kind, where it happened, and the message."""

    kind: str
    stage: str = ""
    message: str = ""


class ItemResult(BaseModel):
    """One line of results.jsonl."""

    id: str
    bench: str
    index: int
    status: Literal["scored", "infra_error"] = Field(
        ..., description="'infra_error': the run says nothing about the agent (engine down, timeout of ours).")
    question: str = ""
    prediction: str = ""
    gold: Any = None
    correct: bool | None = Field(None, description="None when the item was not scored.")
    value: float | None = Field(None, description="The scorer's reward in [0, 1].")
    score: dict[str, Any] = Field(default_factory=dict, description="The scorer's details.")
    judge: dict[str, Any] | None = Field(None, description="Optional LLM-judge verdict, beside the rule score.")
    turns: int = 0
    tools: dict[str, int] = Field(default_factory=dict, description="Tool calls by tool name.")
    invalid_tool_turns: int = 0
    tokens: dict[str, int] = Field(default_factory=dict, description="calls, prompt_tokens, completion_tokens.")
    seconds: float = 0.0
    stop_reason: str | None = None
    error: ItemError | None = None
    trajectory: str | None = Field(None, description="Trajectory file, relative to the results directory.")
    finished_at: str = ""


class ResultsLog:
    """Reads and appends results.jsonl. One writer at a time (the runner holds a lock on the directory)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def repair(self) -> int:
        """Cut a torn last line left by a killed writer; returns the number of bytes removed."""
        if not self.path.exists():
            return 0
        size = self.path.stat().st_size
        if size == 0:
            return 0
        with self.path.open("rb+") as handle:
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) == b"\n":
                return 0
            # Walk back to the last newline; everything after it is a partial line.
            block = 4096
            end = size
            keep = 0
            while end > 0:
                start = max(0, end - block)
                handle.seek(start)
                chunk = handle.read(end - start)
                newline = chunk.rfind(b"\n")
                if newline != -1:
                    keep = start + newline + 1
                    break
                end = start
            handle.truncate(keep)
            handle.flush()
            os.fsync(handle.fileno())
        log.warning("%s: removed a torn last line (%d bytes) left by an interrupted run", self.path, size - keep)
        return size - keep

    def read(self) -> dict[str, ItemResult]:
        """All results by item id, the later line winning. Unreadable lines are skipped with a warning."""
        results: dict[str, ItemResult] = {}
        if not self.path.exists():
            return results
        with self.path.open("rb") as handle:
            lines = handle.read().split(b"\n")
        torn = lines.pop() if lines else b""
        if torn.strip():
            log.warning("%s: ignoring a torn last line", self.path)
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                result = ItemResult.model_validate_json(line)
            except ValidationError as err:
                log.warning("%s:%d: skipping an unreadable line: %s", self.path, number, err.errors()[0]["msg"])
                continue
            results[result.id] = result
        return results

    def append(self, result: ItemResult) -> None:
        """Append one line and make it durable before returning."""
        data = (model_json(result) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)


def wilson_interval(successes: int, trials: int, *, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval of a proportion: sound at small n and at 0% or 100%, unlike p ± z·se."""
    if trials <= 0:
        return (0.0, 1.0)
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


class RunStats(BaseModel):
    """Speed of the items finished by one invocation (not of earlier, resumed ones)."""

    items: int = 0
    wall_seconds: float = 0.0
    items_per_minute: float | None = None


class BenchSummary(BaseModel):
    """Per-benchmark totals. Failed items are reported beside the accuracy, never silently dropped."""

    bench: str
    scorer: str = ""
    items: int = Field(0, description="Items with a result line (scored + infra_failed).")
    scored: int = 0
    correct: int = 0
    infra_failed: int = 0
    pending: int = Field(0, description="Selected items without a result yet (an interrupted run).")
    accuracy: float | None = Field(None, description="correct / scored.")
    accuracy_ci95: tuple[float, float] | None = Field(None, description="Wilson interval of `accuracy`.")
    accuracy_all: float | None = Field(None, description="correct / (scored + infra_failed): failures as wrong.")
    mean_value: float | None = Field(None, description="Mean reward of scored items.")
    mean_f1: float | None = Field(None, description="QA sets: mean best token F1.")
    judge_scored: int = 0
    judge_accuracy: float | None = None
    failure_reasons: dict[str, int] = Field(default_factory=dict)
    failed_items: dict[str, str] = Field(default_factory=dict, description="Item id -> reason.")
    mean_turns: float | None = None
    tool_calls: dict[str, int] = Field(default_factory=dict)
    invalid_tool_turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_calls: int = 0
    item_seconds_total: float = 0.0
    mean_item_seconds: float | None = None
    this_run: RunStats = Field(default_factory=RunStats)


def summarize(bench: str, results: list[ItemResult], *, scorer: str = "",
              run: RunStats | None = None) -> BenchSummary:
    """Totals of one benchmark's results."""
    scored = [r for r in results if r.status == "scored"]
    failed = [r for r in results if r.status != "scored"]
    correct = sum(1 for r in scored if r.correct)
    summary = BenchSummary(bench=bench, scorer=scorer, items=len(results), scored=len(scored), correct=correct,
                           infra_failed=len(failed), this_run=run or RunStats())
    if scored:
        summary.accuracy = correct / len(scored)
        summary.accuracy_ci95 = wilson_interval(correct, len(scored))
        summary.mean_value = sum(r.value or 0.0 for r in scored) / len(scored)
        f1s = [r.score["f1"] for r in scored if isinstance(r.score.get("f1"), (int, float))]
        summary.mean_f1 = sum(f1s) / len(f1s) if f1s else None
    if results:
        summary.accuracy_all = correct / len(results)
        summary.mean_turns = sum(r.turns for r in results) / len(results)
        summary.item_seconds_total = sum(r.seconds for r in results)
        summary.mean_item_seconds = summary.item_seconds_total / len(results)
    judged = [r for r in scored if r.judge and r.judge.get("correct") is not None]
    if judged:
        summary.judge_scored = len(judged)
        summary.judge_accuracy = sum(1 for r in judged if r.judge and r.judge["correct"]) / len(judged)
    summary.failure_reasons = dict(Counter(r.error.kind if r.error else "unknown" for r in failed))
    summary.failed_items = {r.id: f"{r.error.kind}: {r.error.message}" if r.error else "unknown" for r in failed}
    tools: Counter[str] = Counter()
    for r in results:
        tools.update(r.tools)
        summary.invalid_tool_turns += r.invalid_tool_turns
        summary.prompt_tokens += r.tokens.get("prompt_tokens", 0)
        summary.completion_tokens += r.tokens.get("completion_tokens", 0)
        summary.llm_calls += r.tokens.get("calls", 0)
    summary.tool_calls = dict(sorted(tools.items()))
    return summary


def write_json(path: Path, payload: Any) -> None:
    """Write JSON atomically (temp file + rename), so a kill never leaves half a summary or config."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, ensure_ascii=False, default=str) + "\n")
    os.replace(tmp, path)
