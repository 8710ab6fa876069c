"""The routes (the JSON twin of every page), what each PATH is taken for, and the comparison."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentflow.errors import ConfigError
from agentflow.eval.compare import compare_runs
from agentflow.view.api import NotFound, ViewApp, segment
from tests.view.builders import eval_run, right_on_france, right_on_hamlet, train_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    a = eval_run(root / "a", right_on_france)
    b = eval_run(root / "b", right_on_hamlet)
    trained = train_run(root / "train", new_format=True)
    return {"a": a, "b": b, "train": trained, "trajectory": a / "trajectories" / "quiz_0_1.json"}


def test_each_kind_of_path_and_the_page_to_open_first(runs: dict[str, Path], tmp_path: Path) -> None:
    assert ViewApp([runs["a"]]).home() == "/run/0"
    assert ViewApp([runs["train"]]).home() == "/train/0"
    assert ViewApp([runs["trajectory"]]).home() == "/trajectory/0"
    assert ViewApp([runs["a"], runs["b"]]).home() == "/compare/0/1"
    app = ViewApp([runs["a"], runs["b"], runs["train"]])
    index = app.get("/")
    assert index["home"] == "/" and [s["kind"] for s in index["sources"]] == ["eval", "eval", "train"]
    assert index["comparisons"] == [[0, 1]]
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("x")
    for bad in (tmp_path / "missing", tmp_path / "empty", tmp_path / "notes.txt"):
        with pytest.raises(ConfigError):
            ViewApp([bad])
    (tmp_path / "other.json").write_text('{"a": 1}')
    assert "not a trajectory" in ViewApp([tmp_path / "other.json"]).get("/trajectory/0")["trajectory_problem"]


def test_compare_is_the_eval_compare_numbers(runs: dict[str, Path]) -> None:
    data = ViewApp([runs["a"], runs["b"]]).get("/compare/0/1")
    (expected,) = compare_runs(runs["a"], runs["b"])
    (bench,) = data["benchmarks"]
    assert bench["a_accuracy"] == expected.a_accuracy and bench["mcnemar_p"] == expected.mcnemar_p
    assert (bench["fixed"], bench["broke"]) == (len(expected.gained), len(expected.lost)) == (1, 1)
    assert {(f["id"], f["direction"]) for f in data["flipped"]} == {("quiz:2:3", "fixed"), ("quiz:0:1", "broke")}
    both = ViewApp([runs["a"], runs["b"]]).get("/compare/0/1/item/" + segment("quiz:2:3"))
    assert both["a"]["item"]["correct"] is False and both["b"]["item"]["correct"] is True
    assert both["a"]["trajectory"]["question"] == "Who wrote Hamlet?"


def test_unknown_routes_are_not_found(runs: dict[str, Path]) -> None:
    app = ViewApp([runs["a"], runs["train"]])
    for route in ("/run/1", "/run/5", "/train/0", "/run/0/item/nope", "/compare/0/1", "/train/1/step/9",
                  "/train/1/step/x", "/trajectory/0", "/nothing"):
        with pytest.raises(NotFound):
            app.get(route)


def test_routes_list_every_page_and_each_answers(runs: dict[str, Path]) -> None:
    app = ViewApp([runs["a"], runs["b"], runs["train"]])
    routes = list(app.routes())
    assert "/run/0/item/quiz%3A1%3A2" in routes and "/compare/0/1/item/quiz%3A2%3A3" in routes
    assert "/train/2/step/1/rollout/q1%231" in routes and "/train/2/eval/step-2" in routes
    for route in routes:
        json.dumps(app.get(route))


@pytest.mark.parametrize("value", ["quiz:1:2", "q1#0", "a b/c?d&e=f", "ünï ✓", "</script>", "!~*'()-_."])
def test_segments_are_encoded_like_the_pages_encodeURIComponent(value: str) -> None:
    # encodeURIComponent leaves A-Z a-z 0-9 - _ . ! ~ * ' ( ) and encodes everything else as UTF-8 %XX
    expected = "".join(c if c.isascii() and (c.isalnum() or c in "-_.!~*'()") else
                       "".join(f"%{b:02X}" for b in c.encode()) for c in value)
    assert segment(value) == expected
