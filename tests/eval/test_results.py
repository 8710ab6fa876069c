"""The results file (torn lines, later line wins), the Wilson interval and per-benchmark totals."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentflow.eval.results import ItemError, ItemResult, ResultsLog, summarize, wilson_interval


def result(item_id: str, *, correct: bool | None = True, status: str = "scored", **fields: object) -> ItemResult:
    bench, index, _ = item_id.split(":")
    error = ItemError(kind="engine_unavailable", message="refused") if status != "scored" else None
    return ItemResult(id=item_id, bench=bench, index=int(index), status=status,  # type: ignore[arg-type]
                      correct=correct if status == "scored" else None, error=error, **fields)


def test_append_then_read_round_trip(tmp_path: Path) -> None:
    log = ResultsLog(tmp_path / "results.jsonl")
    log.append(result("b:0:0", prediction="x", tools={"python": 2}))
    log.append(result("b:1:1", correct=False))
    read = log.read()
    assert list(read) == ["b:0:0", "b:1:1"]
    assert read["b:0:0"].tools == {"python": 2} and read["b:1:1"].correct is False


def test_later_line_wins(tmp_path: Path) -> None:
    log = ResultsLog(tmp_path / "results.jsonl")
    log.append(result("b:0:0", status="infra_error"))
    log.append(result("b:0:0", correct=True))
    assert log.read()["b:0:0"].status == "scored"
    assert len(log.read()) == 1


def test_torn_last_line_is_ignored_then_cut(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    log = ResultsLog(path)
    log.append(result("b:0:0"))
    whole = path.read_bytes()
    line = result("b:1:1").model_dump_json().encode()
    path.write_bytes(whole + line[: len(line) // 2])      # what kill -9 in the middle of a write leaves
    assert list(log.read()) == ["b:0:0"]
    assert log.repair() == len(line) // 2
    assert path.read_bytes() == whole
    log.append(result("b:1:1"))                             # appends land on a clean line boundary
    assert list(log.read()) == ["b:0:0", "b:1:1"]
    assert log.repair() == 0


def test_torn_only_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_bytes(b'{"id": "b:0:')
    log = ResultsLog(path)
    assert log.read() == {}
    log.repair()
    assert path.read_bytes() == b""


def test_unreadable_middle_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text(result("b:0:0").model_dump_json() + "\n{garbage}\n" + result("b:1:1").model_dump_json() + "\n")
    assert list(ResultsLog(path).read()) == ["b:0:0", "b:1:1"]


@pytest.mark.parametrize(("successes", "trials", "low", "high"), [
    (0, 10, 0.0, 0.27753),        # hand-computed: z^2/(n+z^2) = 3.8415/13.8415
    (10, 10, 0.72247, 1.0),
    (5, 10, 0.23659, 0.76341),
    (1, 5, 0.03622, 0.62449),
])
def test_wilson_interval(successes: int, trials: int, low: float, high: float) -> None:
    assert wilson_interval(successes, trials) == pytest.approx((low, high), abs=1e-4)


def test_wilson_interval_without_trials() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_summary_keeps_failures_apart_and_in_the_all_denominator() -> None:
    results = [
        result("b:0:0", correct=True, turns=2, tools={"python": 1}, score={"f1": 1.0},
               tokens={"calls": 3, "prompt_tokens": 100, "completion_tokens": 10}, seconds=2.0),
        result("b:1:1", correct=False, turns=1, tools={"python": 1, "wikipedia_search": 1}, score={"f1": 0.5},
               tokens={"calls": 2, "prompt_tokens": 50, "completion_tokens": 5}, seconds=1.0),
        result("b:2:2", correct=True, turns=3, score={"f1": 1.0}, seconds=3.0),
        result("b:3:3", status="infra_error", turns=0, seconds=0.5),
    ]
    s = summarize("b", results, scorer="exact_match")
    assert (s.items, s.scored, s.correct, s.infra_failed) == (4, 3, 2, 1)
    assert s.accuracy == pytest.approx(2 / 3)
    assert s.accuracy_all == pytest.approx(2 / 4)
    assert s.accuracy_ci95 == pytest.approx(wilson_interval(2, 3))
    assert s.mean_f1 == pytest.approx(2.5 / 3)
    assert s.failure_reasons == {"engine_unavailable": 1}
    assert s.failed_items == {"b:3:3": "engine_unavailable: refused"}
    assert s.tool_calls == {"python": 2, "wikipedia_search": 1}
    assert (s.prompt_tokens, s.completion_tokens, s.llm_calls) == (150, 15, 5)
    assert s.mean_turns == pytest.approx(6 / 4)
    assert s.item_seconds_total == pytest.approx(6.5)


def test_summary_of_only_failures_has_no_accuracy() -> None:
    s = summarize("b", [result("b:0:0", status="infra_error")])
    assert s.accuracy is None and s.accuracy_all == 0.0 and s.infra_failed == 1
