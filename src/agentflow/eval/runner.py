"""The evaluation runner: one flow, items run concurrently, every finished item appended durably, resumable.

A results directory belongs to one configuration (flow config, agent, judge), identified by a fingerprint in
`config.json`; rerunning into it with another configuration is refused. Several benchmarks may share a
directory. Rerunning the same command skips items that already have a result, so a killed run continues where
it stopped; `--retry-failed` also re-runs items that failed for infrastructure reasons.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import json
import logging
import re
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from agentflow.config import FlowConfig, bundled_flow_config
from agentflow.errors import ConfigError
from agentflow.eval.benchmarks import Benchmark, BenchmarkItem, load_benchmark
from agentflow.eval.identity import config_differences
from agentflow.eval.judge import JudgeConfig, LLMJudge
from agentflow.eval.results import (
    RESULTS_FORMAT_VERSION,
    BenchSummary,
    ItemError,
    ItemResult,
    ResultsLog,
    RunStats,
    summarize,
    write_json,
)
from agentflow.scoring import get_scorer
from agentflow.terminal import SafeConsole
from agentflow.trajectory import Trajectory

log = logging.getLogger(__name__)

DEFAULT_OUT_ROOT = Path("runs") / "eval"
WATCHDOG_GRACE_S = 60.0
"""Extra time past the flow's own per-question limit before the runner gives up on an item."""


class Solver(Protocol):
    """What the runner evaluates: `agentflow.flow.Flow`, or any agent with the same `asolve`."""

    async def asolve(self, question: str) -> Trajectory: ...


class EvalSettings(BaseModel):
    """Settings of one `agentflow eval` invocation."""

    benches: list[str] = Field(..., min_length=1, description="Benchmark names or file paths.")
    limit: int | None = Field(None, ge=1, description="Evaluate only the first N items of each benchmark.")
    out: Path | None = Field(None, description="Results directory; default runs/eval/<config fingerprint>.")
    config: Path | None = Field(None, description="Flow config YAML; default: the offline defaults.")
    concurrency: int = Field(4, ge=1, description="Items solved at the same time.")
    retry_failed: bool = Field(False, description="Also re-run items that failed for infrastructure reasons.")
    data: Path | None = Field(None, description="Data file of a benchmark that is not shipped (gaia, gpqa).")
    scorer: str | None = Field(None, description="Scorer of a benchmark file (default: inferred).")
    judge_config: Path | None = Field(None, description="YAML of an optional LLM judge, reported beside.")
    agent: str | None = Field(None, description="'module:callable' building the agent from the FlowConfig.")


class EvalReport(BaseModel):
    """What a run returns: where results are, and the per-benchmark summaries of this invocation."""

    out: Path
    fingerprint: str
    summaries: dict[str, BenchSummary]
    ran: int = Field(0, description="Items solved by this invocation.")
    this_run: RunStats = Field(default_factory=RunStats, description="Speed over all benchmarks of this run.")


def safe_name(item_id: str) -> str:
    """A file name for an item id (ids contain ':' and user-supplied pids)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", item_id)


def fingerprint(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


@contextlib.contextmanager
def _directory_lock(out: Path) -> Iterator[None]:
    """One writer per results directory: a second `agentflow eval` on the same DIR is refused, not interleaved."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, the user must not run two evals into one directory
        yield
        return
    handle = (out / ".lock").open("w")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"another `agentflow eval` is writing to {out}; wait for it or use another --out") \
                from None
        yield
    finally:
        handle.close()


def load_agent_factory(spec: str) -> Any:
    """Import 'package.module:callable'."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"--agent must look like 'package.module:callable', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"--agent {spec}: cannot import {module_name}: {err}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(f"--agent {spec}: {attr} is not a callable of {module_name}")
    return factory


def _item_record(item: BenchmarkItem, *, status: str, seconds: float, traj: Trajectory | None = None,
                 error: ItemError | None = None, trajectory: str | None = None) -> ItemResult:
    record = ItemResult(id=item.id, bench=item.bench, index=item.index, status=status,  # type: ignore[arg-type]
                        question=item.question, gold=item.gold, seconds=round(seconds, 3), error=error,
                        trajectory=trajectory,
                        finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    if traj is not None:
        record.prediction = traj.answer
        record.turns = len(traj.turns)
        record.tools = dict(Counter(t.tool_call.tool for t in traj.turns if t.tool_call is not None))
        record.invalid_tool_turns = sum(1 for t in traj.turns if not t.tool_valid)
        record.tokens = {"calls": traj.usage.calls, "prompt_tokens": traj.usage.prompt_tokens,
                         "completion_tokens": traj.usage.completion_tokens}
        record.stop_reason = traj.stop_reason
    return record


class _Live:
    """Running totals per benchmark for the progress bar and the end-of-run speed numbers."""

    def __init__(self) -> None:
        self.first_start: dict[str, float] = {}
        self.last_end: dict[str, float] = {}
        self.finished: Counter[str] = Counter()

    def started(self, bench: str) -> None:
        self.first_start.setdefault(bench, time.monotonic())

    def ended(self, bench: str) -> None:
        self.last_end[bench] = time.monotonic()
        self.finished[bench] += 1

    def stats(self, bench: str) -> RunStats:
        if bench not in self.first_start or bench not in self.last_end:
            return RunStats()
        return self._stats(self.finished[bench], self.last_end[bench] - self.first_start[bench])

    def overall(self) -> RunStats:
        if not self.last_end:
            return RunStats()
        return self._stats(sum(self.finished.values()),
                           max(self.last_end.values()) - min(self.first_start.values()))

    @staticmethod
    def _stats(items: int, wall: float) -> RunStats:
        wall = max(wall, 1e-9)
        return RunStats(items=items, wall_seconds=round(wall, 3), items_per_minute=round(items / wall * 60, 3))


def _progress_text(results: list[ItemResult]) -> str:
    scored = [r for r in results if r.status == "scored"]
    correct = sum(1 for r in scored if r.correct)
    failed = len(results) - len(scored)
    accuracy = f"{100 * correct / len(scored):.1f}%" if scored else "-"
    text = f"acc {accuracy} ({correct}/{len(scored)})"
    return text + (f" [red]failed {failed}[/]" if failed else "")


class EvalRun:
    """One invocation: loads benchmarks, checks the directory, runs what is missing, writes the summary."""

    def __init__(self, settings: EvalSettings, *, console: Console | None = None, solver: Any = None,
                 flow_config: FlowConfig | None = None, judge: LLMJudge | None = None) -> None:
        self.settings = settings
        self.console = console or SafeConsole(stderr=True)
        self._solver = solver
        self.flow_config = flow_config or (FlowConfig.from_yaml(settings.config) if settings.config
                                           else bundled_flow_config())
        if judge is None and settings.judge_config is not None:
            judge = LLMJudge.from_config(JudgeConfig.from_yaml(settings.judge_config))
        self.judge = judge
        if settings.data is not None and len(settings.benches) != 1:
            raise ConfigError("--data goes with exactly one benchmark")
        self.benchmarks: list[Benchmark] = [
            load_benchmark(bench, data=settings.data, scorer=settings.scorer, limit=settings.limit)
            for bench in settings.benches]
        names = [b.name for b in self.benchmarks]
        if len(set(names)) != len(names):
            raise ConfigError(f"a benchmark is named twice: {', '.join(names)}")
        self.identity = {
            "results_format": RESULTS_FORMAT_VERSION,
            "flow": self.flow_config.model_dump(mode="json"),
            "agent": settings.agent or "agentflow.flow:Flow",
            "judge": self.judge.describe() if self.judge else None,
        }
        self.fingerprint = fingerprint(self.identity)
        self.out = settings.out or DEFAULT_OUT_ROOT / self.fingerprint[:12]
        self.log = ResultsLog(self.out / "results.jsonl")
        self.live = _Live()
        self._owned_solver: Any = None

    # -- directory ---------------------------------------------------------------------------------

    def _check_config(self, done: dict[str, ItemResult]) -> None:
        """Refuse a directory holding results of another configuration; record this invocation in config.json.

        A directory without results (a run that stopped before its first item) blocks nothing: its config is
        replaced."""
        path = self.out / "config.json"
        previous: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        if previous and not done:
            if previous.get("fingerprint") != self.fingerprint:
                log.info("%s holds no results; its configuration is replaced", self.out)
            previous = {}
        if previous and previous.get("fingerprint") != self.fingerprint:
            changes = config_differences(previous.get("identity", {}), self.identity) or [
                "(none in the recorded settings: the fingerprint's recipe changed)"]
            shown = "\n  ".join(changes)
            raise ConfigError(
                f"{self.out} holds results of a different configuration; refusing to mix them. Use another --out "
                f"(or the default, which is named after the configuration). Differences:\n  {shown}")
        benches: dict[str, Any] = dict(previous.get("benchmarks", {}))
        for bench in self.benchmarks:
            entry = {"source": bench.source, "sha256": bench.sha256, "scorer": bench.scorer}
            old = benches.get(bench.name)
            has_results = any(r.bench == bench.name for r in done.values())
            if old and has_results and (old.get("sha256"), old.get("scorer")) != (bench.sha256, bench.scorer):
                raise ConfigError(
                    f"{self.out} holds {bench.name} results from other data or another scorer "
                    f"({old.get('source')}, {old.get('scorer')}); use another --out")
            benches[bench.name] = entry
        invocations = list(previous.get("invocations", []))
        invocations.append({"started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                            "benches": [b.name for b in self.benchmarks], "limit": self.settings.limit,
                            "concurrency": self.settings.concurrency, "retry_failed": self.settings.retry_failed})
        write_json(path, {"fingerprint": self.fingerprint, "identity": self.identity, "benchmarks": benches,
                          "invocations": invocations})

    # -- solving -----------------------------------------------------------------------------------

    async def _build_solver(self) -> Any:
        if self._solver is not None:
            return self._solver
        if self.settings.agent:
            solver = load_agent_factory(self.settings.agent)(self.flow_config)
        else:
            from agentflow.flow import Flow

            solver = Flow.from_config(self.flow_config)
        self._owned_solver = solver
        return solver

    async def _solve_item(self, solver: Any, item: BenchmarkItem, scorer_name: str) -> ItemResult:
        self.live.started(item.bench)
        start = time.monotonic()
        # The flow's limit counts the question's own time (`agentflow.clock`): with `concurrency` items sharing
        # the engines a healthy item's wall time can reach that many times it, so the watchdog (for an agent
        # that does not keep its own limit) allows as much before it calls the item hung
        watchdog = self.flow_config.limits.max_seconds * self.settings.concurrency + WATCHDOG_GRACE_S
        try:
            traj: Trajectory = await asyncio.wait_for(solver.asolve(item.question), timeout=watchdog)
        except asyncio.TimeoutError:
            return _item_record(item, status="infra_error", seconds=time.monotonic() - start, error=ItemError(
                kind="eval_watchdog", stage="flow", message=f"no trajectory after {watchdog:.0f}s"))
        except Exception as err:  # an exception out of asolve is a failure of the system, not a wrong answer
            log.warning("%s: the agent raised %s: %s", item.id, type(err).__name__, err)
            return _item_record(item, status="infra_error", seconds=time.monotonic() - start, error=ItemError(
                kind=getattr(err, "kind", type(err).__name__), stage="flow", message=str(err)[:1000]))
        seconds = time.monotonic() - start
        relative = f"trajectories/{safe_name(item.id)}.json"
        traj.write(self.out / relative)
        # A question's own time-out is scored (its answer is whatever the generator wrote in the time left):
        # waits for a shared engine do not count against the limit, so what ran out is the agent's own time.
        infra = traj.infrastructure_failure
        if infra is not None:
            return _item_record(item, status="infra_error", seconds=seconds, traj=traj, trajectory=relative,
                                error=ItemError(kind=infra.kind, stage=infra.stage, message=infra.message[:1000]))
        try:
            score = get_scorer(scorer_name)(traj.answer, item.gold)
        except Exception as err:  # a scorer crash is a bug of ours or of the data, never the agent's fault
            log.exception("%s: scorer %s failed", item.id, scorer_name)
            return _item_record(item, status="infra_error", seconds=seconds, traj=traj, trajectory=relative,
                                error=ItemError(kind="scorer_error", stage="scoring", message=str(err)[:1000]))
        record = _item_record(item, status="scored", seconds=seconds, traj=traj, trajectory=relative)
        record.correct, record.value, record.score = score.correct, score.value, score.details
        if self.judge is not None:
            verdict = await self.judge.judge(item.question, traj.answer, item.gold)
            record.judge = verdict.model_dump()
        return record

    async def run(self) -> EvalReport:
        self.out.mkdir(parents=True, exist_ok=True)
        with _directory_lock(self.out):
            self.log.repair()
            done = self.log.read()
            self._check_config(done)
            todo: list[tuple[BenchmarkItem, str]] = []
            for bench in self.benchmarks:
                for note in bench.notes:
                    self.console.print(f"[yellow]{escape(bench.name)}:[/] {escape(note)}")
                pending = [i for i in bench.items if i.id not in done
                           or (self.settings.retry_failed and done[i.id].status != "scored")]
                failed_before = sum(1 for i in bench.items if i.id in done and done[i.id].status != "scored")
                hint = ""
                if failed_before and not self.settings.retry_failed:
                    hint = f"; {failed_before} failed earlier (re-run them with --retry-failed)"
                self.console.print(f"[bold]{escape(bench.name)}[/]: {len(bench.items)} items, "
                                   f"{len(bench.items) - len(pending)} done, {len(pending)} to run{hint}")
                todo += [(item, bench.scorer) for item in pending]
            self.console.print(f"results: {self.out / 'results.jsonl'}", markup=False)
            ran = 0
            interrupted = False
            try:
                if todo:
                    ran = await self._run_items(todo, done)
            except (asyncio.CancelledError, KeyboardInterrupt):
                interrupted = True
                raise
            finally:
                summaries = self._write_summary(self.log.read(), interrupted=interrupted)
                if self.judge is not None:
                    await self.judge.aclose()
        return EvalReport(out=self.out, fingerprint=self.fingerprint, summaries=summaries, ran=ran,
                          this_run=self.live.overall())

    async def _run_items(self, todo: list[tuple[BenchmarkItem, str]], done: dict[str, ItemResult]) -> int:
        solver = await self._build_solver()
        semaphore = asyncio.Semaphore(self.settings.concurrency)
        by_bench: dict[str, dict[str, ItemResult]] = {
            b.name: {i.id: done[i.id] for i in b.items if i.id in done} for b in self.benchmarks}
        columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), TimeRemainingColumn())
        ran = 0
        try:
            check = getattr(solver, "check", None)
            if check is not None:
                await check()  # a tool that is not set up fails the run once, not every item
            with Progress(*columns, console=self.console) as progress:
                tasks = {}
                for bench in self.benchmarks:
                    results = [r for r in by_bench[bench.name].values()
                               if not (self.settings.retry_failed and r.status != "scored")]
                    tasks[bench.name] = progress.add_task(escape(bench.name), total=len(bench.items),
                                                          completed=len(results), stats=_progress_text(results))

                async def one(item: BenchmarkItem, scorer_name: str) -> None:
                    nonlocal ran
                    async with semaphore:
                        start = time.monotonic()
                        try:
                            record = await self._solve_item(solver, item, scorer_name)
                        except Exception as err:  # a bug of ours on one item (its trajectory, scorer, judge)
                            log.exception("%s: failed outside the agent; recorded, the run goes on", item.id)
                            record = _item_record(item, status="infra_error", seconds=time.monotonic() - start,
                                                  error=ItemError(kind="internal_error", stage="eval",
                                                                  message=f"{type(err).__name__}: {err}"[:1000]))
                    self.log.append(record)
                    self.live.ended(item.bench)
                    ran += 1
                    by_bench[item.bench][item.id] = record
                    progress.update(tasks[item.bench], advance=1,
                                    stats=_progress_text(list(by_bench[item.bench].values())))

                await asyncio.gather(*(one(item, scorer_name) for item, scorer_name in todo))
        finally:
            if self._owned_solver is not None and hasattr(self._owned_solver, "aclose"):
                await self._owned_solver.aclose()
        return ran

    # -- summary -----------------------------------------------------------------------------------

    def _write_summary(self, results: dict[str, ItemResult], *, interrupted: bool) -> dict[str, BenchSummary]:
        path = self.out / "summary.json"
        previous = json.loads(path.read_text()).get("benchmarks", {}) if path.exists() else {}
        config = json.loads((self.out / "config.json").read_text())
        by_bench: dict[str, list[ItemResult]] = {}
        for record in results.values():
            by_bench.setdefault(record.bench, []).append(record)
        current = {b.name: b for b in self.benchmarks}
        summaries: dict[str, BenchSummary] = {}
        for name, records in sorted(by_bench.items()):
            scorer = config.get("benchmarks", {}).get(name, {}).get("scorer", "")
            if name in current:
                run = self.live.stats(name)
            else:
                run = RunStats.model_validate(previous.get(name, {}).get("this_run", {}))
            summaries[name] = summarize(name, sorted(records, key=lambda r: r.index), scorer=scorer, run=run)
        for name, bench in current.items():
            selected = {i.id for i in bench.items}
            summary = summaries.setdefault(name, BenchSummary(bench=name, scorer=bench.scorer))
            summary.pending = len(selected - set(results))
        write_json(path, {"fingerprint": self.fingerprint, "out": str(self.out), "interrupted": interrupted,
                          "concurrency": self.settings.concurrency,
                          "this_run": self.live.overall().model_dump(),
                          "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          "benchmarks": {k: v.model_dump(mode="json") for k, v in summaries.items()}})
        return {name: summaries[name] for name in current}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def render_summaries(console: Console, summaries: dict[str, BenchSummary]) -> None:
    """The end-of-run tables (scores, then cost and speed), then the failed items with their reasons."""
    any_f1 = any(s.mean_f1 is not None for s in summaries.values())
    any_judge = any(s.judge_accuracy is not None for s in summaries.values())
    scores = Table(title="accuracy: 'acc.' over scored items, 'all' counts failed items as wrong",
                   box=box.SIMPLE_HEAD)
    headers = ["benchmark", "acc. %", "95% CI", "all %", "scored", "correct", "failed"]
    headers += ["F1 %"] * any_f1 + ["judge %"] * any_judge
    for header in headers:
        scores.add_column(header, justify="left" if header == "benchmark" else "right")
    costs = Table(title="cost and speed (speed: items run by this invocation)", box=box.SIMPLE_HEAD)
    for header in ("benchmark", "turns", "tool calls", "tokens in/out", "wall s", "items/min"):
        costs.add_column(header, justify="left" if header in ("benchmark", "tool calls") else "right")
    for name, s in summaries.items():
        ci = f"{_pct(s.accuracy_ci95[0])}-{_pct(s.accuracy_ci95[1])}" if s.accuracy_ci95 else "-"
        failed = str(s.infra_failed) + (f" +{s.pending} not run" if s.pending else "")
        row = [name, _pct(s.accuracy), ci, _pct(s.accuracy_all), str(s.scored), str(s.correct), failed]
        row += [_pct(s.mean_f1)] * any_f1 + [_pct(s.judge_accuracy)] * any_judge
        scores.add_row(*(escape(cell) for cell in row))
        tools = ", ".join(f"{k} {v}" for k, v in s.tool_calls.items()) or "-"
        if s.invalid_tool_turns:
            tools += f" (invalid {s.invalid_tool_turns})"
        speed = s.this_run
        costs.add_row(escape(name), "-" if s.mean_turns is None else f"{s.mean_turns:.2f}", escape(tools),
                      f"{s.prompt_tokens}/{s.completion_tokens}",
                      f"{speed.wall_seconds:.1f}" if speed.items else "-",
                      f"{speed.items_per_minute:.2f}" if speed.items_per_minute else "-")
    console.print(scores)
    console.print(costs)
    failures = [(item, reason) for s in summaries.values() for item, reason in s.failed_items.items()]
    if failures:
        reasons = Counter(kind for s in summaries.values() for kind, n in s.failure_reasons.items()
                          for _ in range(n))
        shown = escape(", ".join(f"{k}: {v}" for k, v in reasons.items()))
        console.print(f"[bold red]{len(failures)} items failed[/] ({shown}"
                      "); not counted in accuracy, re-run them with --retry-failed:")
        for item, reason in failures[:20]:
            console.print(f"  {item}: {reason[:200]}", highlight=False, markup=False)
        if len(failures) > 20:
            console.print(f"  ... and {len(failures) - 20} more (summary.json lists all)")


def run_eval(settings: EvalSettings, *, console: Console | None = None, solver: Any = None,
             flow_config: FlowConfig | None = None, judge: LLMJudge | None = None) -> EvalReport:
    """Synchronous entry: run an evaluation and return its report."""
    return asyncio.run(EvalRun(settings, console=console, solver=solver, flow_config=flow_config,
                               judge=judge).run())

