"""A training run directory (`agentflow train --out DIR`) as the viewer sees it.

Read: DIR/metrics.jsonl (followed while the trainer writes), DIR/rollouts/step-NNNNNN.jsonl (one line per
trajectory: id "qid#i", question, gold, planner texts, tools, answer, reward, infrastructure; newer trainers add
`group`, `advantages` per planner turn, `failure` and the whole `trajectory`), DIR/eval/step-N.jsonl (held-out
results) and DIR/config.json. Every newer field is optional.
"""

from __future__ import annotations

import json
import logging
import re
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from agentflow.view.eval_run import clip, gold_text, read_json_file, without_token_arrays
from agentflow.view.jsonl_tail import JsonlTail

log = logging.getLogger(__name__)

_STEP_FILE = re.compile(r"step-(\d+)\.jsonl$")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file; unreadable lines (a line being written) are skipped."""
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            log.warning("%s:%d: skipping an unreadable line", path, number)
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def group_of(record: dict[str, Any]) -> str:
    """The question a rollout belongs to: `group` when recorded, else the id before '#'."""
    group = record.get("group")
    return str(group) if group is not None else str(record.get("id", "")).rsplit("#", 1)[0]


def rollout_row(record: dict[str, Any]) -> dict[str, Any]:
    rollout_id = str(record.get("id", ""))
    advantages = record.get("advantages")
    return {
        "id": rollout_id, "index": rollout_id.rsplit("#", 1)[-1] if "#" in rollout_id else "",
        "reward": record.get("reward"), "answer": clip(str(record.get("answer") or ""), 300),
        "tools": [t if t is None else str(t) for t in record.get("tools") or []],
        "planner": [clip(str(text), 600) for text in record.get("planner") or []],
        "advantages": advantages if isinstance(advantages, list) else None,
        "failure": record.get("failure"), "infrastructure": record.get("infrastructure"),
        "has_trajectory": isinstance(record.get("trajectory"), dict),
    }


def groups_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rollouts grouped by question, in first-seen order, with the group's reward spread."""
    groups: dict[str, dict[str, Any]] = {}
    for record in records:
        key = group_of(record)
        group = groups.setdefault(key, {"group": key, "question": str(record.get("question", "")),
                                        "gold": gold_text(record.get("gold")), "rollouts": []})
        group["rollouts"].append(rollout_row(record))
    for group in groups.values():
        rewards = [r["reward"] for r in group["rollouts"]
                   if isinstance(r["reward"], int | float) and not r["infrastructure"]]
        group["reward_mean"] = statistics.fmean(rewards) if rewards else None
        group["reward_std"] = statistics.pstdev(rewards) if len(rewards) > 1 else 0.0 if rewards else None
        group["signal"] = len(set(rewards)) > 1
    return list(groups.values())


class TrainRunView:
    kind = "train"

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._tail = JsonlTail(directory / "metrics.jsonl")
        self._lock = threading.Lock()
        self.generation = 0
        self.records: list[dict[str, Any]] = []
        self._eval_cache: dict[Path, tuple[tuple[int, int], dict[str, Any]]] = {}

    def refresh(self) -> None:
        with self._lock:
            new = self._tail.read_new()
            if self._tail.reset:
                self.generation += 1
                self.records = []
            self.records += [record for _, record in new if "step" in record]

    def _step_files(self, folder: str) -> dict[int, Path]:
        directory = self.directory / folder
        if not directory.is_dir():
            return {}
        found = {}
        for path in directory.iterdir():
            match = _STEP_FILE.search(path.name)
            if match:
                found[int(match.group(1))] = path
        return dict(sorted(found.items()))

    def _eval_summary(self, step: int, path: Path) -> dict[str, Any]:
        stat = path.stat()
        key = (stat.st_mtime_ns, stat.st_size)
        cached = self._eval_cache.get(path)
        if cached and cached[0] == key:
            return cached[1]
        rows = read_jsonl(path)
        correct = sum(1 for r in rows if r.get("correct"))
        summary = {"label": path.stem, "step": step, "questions": len(rows), "correct": correct,
                   "accuracy": correct / len(rows) if rows else None,
                   "infrastructure": sum(1 for r in rows if r.get("infrastructure"))}
        self._eval_cache[path] = (key, summary)
        return summary

    def overview(self, *, after: int = 0, generation: int | None = None) -> dict[str, Any]:
        """Config, the metric records from line `after` on, the steps with rollouts and the held-out evaluations."""
        self.refresh()
        with self._lock:
            if generation != self.generation or after > len(self.records):
                after = 0
            records, count, gen = self.records[after:], len(self.records), self.generation
        config, _ = read_json_file(self.directory / "config.json")
        evals = [self._eval_summary(step, path) for step, path in self._step_files("eval").items()]
        try:
            idle = max(0.0, time.time() - self._tail.path.stat().st_mtime)
        except FileNotFoundError:
            idle = None
        return {"kind": self.kind, "path": str(self.directory), "name": self.directory.name,
                "config": config if isinstance(config, dict) else {}, "generation": gen, "lines": count,
                "from": after, "metrics": records, "steps": list(self._step_files("rollouts")), "evals": evals,
                "idle_seconds": idle}

    def _rollout_records(self, step: int) -> list[dict[str, Any]] | None:
        path = self._step_files("rollouts").get(step)
        return None if path is None else read_jsonl(path)

    def step(self, step: int) -> dict[str, Any] | None:
        """The rollout groups of one step: G trajectories per question, rewards, advantages per planner turn."""
        records = self._rollout_records(step)
        if records is None:
            return None
        self.refresh()
        with self._lock:
            metrics = {k: v for r in self.records if r.get("step") == step for k, v in r.items()}
        return {"kind": "train_step", "run": self.directory.name, "step": step, "metrics": metrics,
                "steps": list(self._step_files("rollouts")), "groups": groups_of(records)}

    def rollout(self, step: int, rollout_id: str) -> dict[str, Any] | None:
        """One rollout line with its whole trajectory (when the trainer recorded it)."""
        records = self._rollout_records(step) or []
        record = next((r for r in records if str(r.get("id")) == rollout_id), None)
        if record is None:
            return None
        trajectory = record.get("trajectory")
        return {"kind": "train_rollout", "run": self.directory.name, "step": step, "row": rollout_row(record),
                "question": str(record.get("question", "")), "gold": gold_text(record.get("gold")),
                "trajectory": without_token_arrays(trajectory) if isinstance(trajectory, dict) else None,
                "trajectory_problem": None if isinstance(trajectory, dict) else
                "this trainer did not record whole trajectories in its rollout files"}

    def held_out(self, label: str) -> dict[str, Any] | None:
        """The held-out results written at one evaluation (DIR/eval/<label>.jsonl)."""
        path = next((p for p in self._step_files("eval").values() if p.stem == label), None)
        if path is None:
            return None
        rows = [{"id": str(r.get("id", "")), "question": clip(str(r.get("question", "")), 400),
                 "gold": clip(gold_text(r.get("gold")), 200), "answer": clip(str(r.get("answer") or ""), 300),
                 "correct": r.get("correct"), "tools": r.get("tools") or [],
                 "infrastructure": r.get("infrastructure")} for r in read_jsonl(path)]
        return {"kind": "train_eval", "run": self.directory.name, "label": label, "rows": rows}
