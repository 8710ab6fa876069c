"""An eval run directory as the viewer reads it: the same numbers as `agentflow eval`, live updates, items."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentflow.eval.results import ResultsLog, summarize
from agentflow.view.eval_run import ROW_COLUMNS, EvalRunView, gold_text
from tests.view.builders import SCRIPT, eval_run, right_on_france


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    return eval_run(tmp_path / "run", right_on_france)


def test_summaries_are_the_eval_commands_numbers(run: Path) -> None:
    data = EvalRunView(run).overview()
    results = list(ResultsLog(run / "results.jsonl").read().values())
    expected = summarize("quiz", results, scorer="exact_match")
    (bench,) = data["benchmarks"]
    assert bench["accuracy"] == expected.accuracy == pytest.approx(1 / 3)
    assert bench["accuracy_ci95"] == list(expected.accuracy_ci95)
    assert (bench["scored"], bench["correct"], bench["scorer"]) == (3, 1, "exact_match")
    assert data["state"] == "finished" and data["lines"] == 3
    assert tuple(data["columns"]) == ROW_COLUMNS
    row = next(dict(zip(ROW_COLUMNS, r, strict=True)) for r in data["rows"] if r[0] == "quiz:1:2")
    assert row["prediction"] == f"{SCRIPT} no idea" and row["tools"] == {"echo": 1} and row["correct"] is False


def test_rows_after_a_line_and_a_new_generation_after_a_rewrite(run: Path) -> None:
    view = EvalRunView(run)
    first = view.overview()
    assert view.overview(after=3, generation=first["generation"])["rows"] == []
    line = json.loads((run / "results.jsonl").read_text().splitlines()[0])
    line.update({"status": "infra_error", "correct": None, "error": {"kind": "engine_timeout", "message": "slow"}})
    with (run / "results.jsonl").open("a") as handle:   # a retried item: the later line wins
        handle.write(json.dumps(line) + "\n")
    update = view.overview(after=3, generation=first["generation"])
    assert [r[0] for r in update["rows"]] == [line["id"]] and update["from"] == 3
    assert update["failure_kinds"] == {"engine_timeout": 1}
    assert update["benchmarks"][0]["infra_failed"] == 1 and update["benchmarks"][0]["scored"] == 2
    (run / "results.jsonl").write_text((run / "results.jsonl").read_text().splitlines()[1] + "\n")
    rewritten = view.overview(after=4, generation=first["generation"])
    assert rewritten["generation"] != first["generation"] and rewritten["from"] == 0
    assert len(rewritten["rows"]) == 1


def test_a_run_that_has_not_finished_an_item(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"fingerprint": "f", "invocations": [{"started_at": "2030"}]}))
    data = EvalRunView(tmp_path).overview()
    assert data["state"] == "in progress" and data["rows"] == [] and data["benchmarks"] == []


def test_item_with_its_trajectory_and_a_path_that_leaves_the_run(run: Path) -> None:
    view = EvalRunView(run)
    item = view.item("quiz:1:2")
    assert item["trajectory"]["question"] == f"Which tag is this: {SCRIPT}?"
    assert item["item"]["gold"] == ["script"] and item["trajectory_problem"] is None
    assert view.item("nope") is None
    line = json.loads((run / "results.jsonl").read_text().splitlines()[0])
    line["trajectory"] = "../../etc/passwd"
    with (run / "results.jsonl").open("a") as handle:
        handle.write(json.dumps(line) + "\n")
    escaped = view.item(line["id"])
    assert escaped["trajectory"] is None and "leaves the run directory" in escaped["trajectory_problem"]
    (run / "trajectories" / "quiz_1_2.json").write_text("{not json")
    assert "cannot be read" in view.item("quiz:1:2")["trajectory_problem"]


@pytest.mark.parametrize("gold,text", [("x", "x"), (["a", "b"], "a | b"), (42, "42"), ({"k": 1}, '{"k": 1}')])
def test_gold_as_text(gold: object, text: str) -> None:
    assert gold_text(gold) == text
