"""`agentflow eval compare`: accuracy differences on common items, flipped items, McNemar p-value."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from agentflow.errors import ConfigError
from agentflow.eval.compare import compare_runs, mcnemar_exact, render_comparison
from agentflow.eval.results import ItemError, ItemResult, ResultsLog


def write_run(directory: Path, verdicts: dict[str, bool | None]) -> Path:
    directory.mkdir(parents=True)
    log = ResultsLog(directory / "results.jsonl")
    for item_id, correct in verdicts.items():
        bench, index, _ = item_id.split(":")
        failed = correct is None
        log.append(ItemResult(id=item_id, bench=bench, index=int(index),
                              status="infra_error" if failed else "scored", correct=correct,
                              error=ItemError(kind="engine_timeout") if failed else None))
    return directory


def test_differences_and_flips(tmp_path: Path) -> None:
    a = write_run(tmp_path / "a", {"qa:0:0": True, "qa:1:1": False, "qa:2:2": True, "qa:3:3": False,
                                    "qa:4:4": True, "m:0:0": True})
    b = write_run(tmp_path / "b", {"qa:0:0": True, "qa:1:1": True, "qa:2:2": False, "qa:3:3": True,
                                    "qa:4:4": None, "m:0:0": True, "m:1:1": False})
    by_bench = {c.bench: c for c in compare_runs(a, b)}
    qa = by_bench["qa"]
    assert qa.common == 4                                   # qa:4:4 failed in B: not compared
    assert (qa.a_correct, qa.b_correct) == (2, 3)
    assert qa.difference == pytest.approx(0.25)
    assert qa.gained == ["qa:1:1", "qa:3:3"] and qa.lost == ["qa:2:2"]
    assert qa.only_a == 1 and qa.only_b == 0
    assert qa.mcnemar_p == pytest.approx(1.0)               # 2 vs 1 flips: no evidence
    assert by_bench["m"].only_b == 1 and by_bench["m"].difference == 0
    console = Console(file=io.StringIO(), width=150)
    render_comparison(console, list(by_bench.values()), "a", "b")
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "+25.0" in text and "qa:1:1, qa:3:3" in text and "broke (right in A, wrong in B): qa:2:2" in text


@pytest.mark.parametrize(("gained", "lost", "p"), [
    (5, 0, 0.0625),      # 2 * (1/2)^5
    (0, 0, 1.0),
    (6, 1, 0.125),       # 2 * (1 + 7) / 128
    (10, 10, 1.0),
])
def test_mcnemar_exact(gained: int, lost: int, p: float) -> None:
    assert mcnemar_exact(gained, lost) == pytest.approx(p)


def test_missing_results_are_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no results.jsonl"):
        compare_runs(tmp_path, tmp_path)
