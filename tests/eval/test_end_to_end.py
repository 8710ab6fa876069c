"""End to end with the bundled model: two items of each shipped benchmark through the real flow and tools."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from agentflow.config import FlowConfig
from agentflow.eval.benchmarks import BENCHMARKS
from agentflow.eval.results import ResultsLog
from agentflow.eval.runner import EvalSettings, run_eval
from agentflow.scoring import get_scorer

SHIPPED = [name for name, spec in BENCHMARKS.items() if spec.file]

# Short enough for CI: one planner turn, short replies, one llama.cpp thread (two threads collapse when other
# processes share the cores). Every module (planner, executor, verifier, generator) and the tools still run.
FAST = {
    "engines": {"default": {"kind": "llamacpp", "n_threads": 1, "n_parallel": 4}},
    "roles": {role: {"sampling": {"max_tokens": tokens}} for role, tokens in
              (("planner", 64), ("executor", 96), ("verifier", 32), ("generator", 64), ("tools", 96))},
    "limits": {"max_turns": 1, "max_seconds": 600},
    "query_analysis": False,
}


@pytest.mark.slow
def test_two_items_of_each_shipped_benchmark_with_the_bundled_model(tmp_path: Path) -> None:
    pytest.importorskip("xllamacpp")
    settings = EvalSettings(benches=SHIPPED, limit=2, out=tmp_path / "out", concurrency=4)
    report = run_eval(settings, console=Console(file=io.StringIO()), flow_config=FlowConfig.from_dict(FAST))

    results = ResultsLog(tmp_path / "out" / "results.jsonl").read()
    assert sorted(results) == sorted(f"{bench}:{i}:{i}" for bench in SHIPPED for i in range(2))
    failed = {k: r.error for k, r in results.items() if r.status != "scored"}
    assert not failed, failed                       # the embedded engine has no infrastructure to fail
    for record in results.values():
        trajectory = json.loads((tmp_path / "out" / record.trajectory).read_text())
        assert trajectory["answer"] == record.prediction
        assert len(trajectory["turns"]) == 1 and trajectory["generator"]["completion"]["text"]
        # The stored verdict is the scorer's verdict on the stored prediction.
        assert get_scorer(BENCHMARKS[record.bench].scorer)(record.prediction, record.gold).correct \
            == record.correct
        assert record.tokens["calls"] >= 3 and record.tokens["completion_tokens"] > 0
    for bench in SHIPPED:
        summary = report.summaries[bench]
        assert summary.scored == 2 and summary.accuracy is not None
        assert summary.this_run.items == 2 and summary.this_run.items_per_minute
