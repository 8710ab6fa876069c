"""Benchmark loading: the eight shipped sets, user-supplied GAIA/GPQA files, and benchmark files by path."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from agentflow.errors import ConfigError
from agentflow.eval.benchmarks import BENCHMARKS, infer_kind, load_benchmark
from agentflow.scoring import available_scorers, get_scorer, gold_layout

SHIPPED = {"bamboogle": 125, "2wiki": 200, "hotpotqa": 100, "musique": 200, "aime24": 30, "amc23": 40,
           "gameof24": 300, "medqa": 300}
DATA_DIR = Path(__file__).resolve().parents[2] / "src" / "agentflow" / "data" / "benchmarks"


@pytest.mark.parametrize(("name", "size"), SHIPPED.items())
def test_shipped_benchmark_loads_with_unique_ids_and_gold(name: str, size: int) -> None:
    bench = load_benchmark(name)
    assert bench.source == f"package:{BENCHMARKS[name].file}"
    assert len(bench.items) == size
    ids = [item.id for item in bench.items]
    assert len(set(ids)) == size
    assert all(item.id.startswith(f"{name}:{item.index}:") for item in bench.items)
    assert all(item.question.strip() and item.gold not in (None, "", []) for item in bench.items)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_reference_answer_scores_correct(name: str) -> None:
    # The file's own answers must pass our scorers: catches gold mapped to the wrong form or the wrong option.
    bench = load_benchmark(name)
    raw = json.loads((DATA_DIR / BENCHMARKS[name].file).read_text())
    scorer = get_scorer(bench.scorer)
    for item, record in zip(bench.items, raw, strict=True):
        references = record["answer"] if isinstance(record["answer"], list) else [record["answer"]]
        for reference in references:
            assert scorer(str(reference), item.gold).correct, (item.id, reference)


def test_medqa_repeated_pids_still_give_unique_ids_and_right_gold() -> None:
    bench = load_benchmark("medqa")
    pids = [item.pid for item in bench.items]
    assert len(set(pids)) < len(pids)          # the file repeats pids...
    repeated = Counter(pids).most_common(1)[0][0]
    first, second = [i for i in bench.items if i.pid == repeated][:2]
    assert first.id != second.id
    raw = json.loads((DATA_DIR / "medqa.json").read_text())
    for item in (first, second):
        assert item.gold["options"][item.gold["answer"]] == raw[item.index]["answer"]


def test_queries_are_the_agent_text() -> None:
    item = load_benchmark("bamboogle").items[0]
    assert item.question.endswith("</answer> tag.") and "<answer>" in item.question
    assert "Choose the correct option" in load_benchmark("medqa").items[0].question
    assert load_benchmark("gameof24").items[0].gold == [1, 1, 1, 8]


def test_limit_takes_the_first_items() -> None:
    assert [i.index for i in load_benchmark("aime24", limit=3).items] == [0, 1, 2]


@pytest.mark.parametrize("name", ["gaia", "gpqa"])
def test_missing_user_data_says_where_to_get_it(name: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="huggingface.co/datasets/") as err:
        load_benchmark(name)
    assert "--data" in str(err.value)
    with pytest.raises(ConfigError, match="no such file"):
        load_benchmark(name, data=tmp_path / "missing.json")


def test_gaia_from_the_hugging_face_metadata_layout(tmp_path: Path) -> None:
    rows = [{"task_id": "t1", "Question": "What is 2+2?", "Level": 1, "Final answer": "4", "file_name": ""},
            {"task_id": "t2", "Question": "Read the file", "Level": 1, "Final answer": "x", "file_name": "a.xlsx"},
            {"task_id": "t3", "Question": "Capital of France?", "Level": 2, "Final answer": "Paris",
             "file_name": ""}]
    path = tmp_path / "metadata.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    bench = load_benchmark("gaia", data=path)
    assert [i.id for i in bench.items] == ["gaia:0:t1", "gaia:2:t3"]
    assert bench.items[1].gold == ["Paris"] and bench.scorer == "exact_match"
    assert "skipped 1 items" in bench.notes[0]


def test_gaia_in_the_shipped_layout(tmp_path: Path) -> None:
    path = tmp_path / "gaia.json"
    path.write_text(json.dumps([{"pid": "0", "query": "Q?", "answer": "A", "image": None}]))
    assert load_benchmark("gaia", data=path).items[0].gold == ["A"]


@pytest.mark.parametrize("answer_idx", ["B", 1, "(B)"])
def test_gpqa_choices_with_answer_idx(tmp_path: Path, answer_idx: object) -> None:
    path = tmp_path / "gpqa.json"
    path.write_text(json.dumps([{"pid": "0", "query": "Which is prime?", "choices": ["4", "7", "9", "15"],
                                 "answer_idx": answer_idx, "answer": "7"}]))
    item = load_benchmark("gpqa", data=path).items[0]
    assert item.gold == {"options": {"A": "4", "B": "7", "C": "9", "D": "15"}, "answer": "B"}
    assert "B. 7" in item.question                     # choices not in the query are appended, lettered
    assert get_scorer("multiple_choice")("B", item.gold).correct


def test_gpqa_answer_text_disagreeing_with_index_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gpqa.json"
    path.write_text(json.dumps([{"query": "q", "choices": ["4", "7", "9", "15"], "answer_idx": "C",
                                 "answer": "7"}]))
    with pytest.raises(ConfigError, match="item 0"):
        load_benchmark("gpqa", data=path)


def test_gpqa_hugging_face_csv_is_shuffled_deterministically(tmp_path: Path) -> None:
    path = tmp_path / "gpqa_diamond.csv"
    lines = ["Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3"]
    lines += [f"Question number {n}?,right{n},wrong{n}a,wrong{n}b,wrong{n}c" for n in range(12)]
    path.write_text("\n".join(lines) + "\n")
    first = load_benchmark("gpqa", data=path)
    again = load_benchmark("gpqa", data=path)
    assert [i.gold for i in first.items] == [i.gold for i in again.items]
    for n, item in enumerate(first.items):
        assert item.gold["options"][item.gold["answer"]] == f"right{n}"
    assert len({i.gold["answer"] for i in first.items}) > 1   # the right answer is not always "A"


def test_benchmark_file_by_path_with_inferred_scorer(tmp_path: Path) -> None:
    qa = tmp_path / "my_qa.jsonl"
    qa.write_text('{"question": "Capital of France?", "answer": ["Paris"]}\n{"query": "2+2?", "answer": "four"}\n')
    bench = load_benchmark(str(qa))
    assert bench.name == "my_qa" and bench.scorer == "exact_match"
    assert [i.id for i in bench.items] == ["my_qa:0:0", "my_qa:1:1"]
    maths = tmp_path / "sums.json"
    maths.write_text(json.dumps([{"question": "1+1?", "answer": 2}, {"question": "half of 1?", "answer": "1/2"}]))
    assert load_benchmark(str(maths)).scorer == "math"
    assert load_benchmark(str(maths), scorer="exact_match").scorer == "exact_match"


@pytest.mark.parametrize("scorer", sorted(available_scorers()))
def test_every_registered_scorer_reads_a_users_file(tmp_path: Path, scorer: str) -> None:
    """Regression: `--scorer cover_em` (the training task's scorer) was refused with "no known gold layout"."""
    records = {
        "qa": [{"question": "Capital of France?", "answer": ["Paris"]}],
        "math": [{"question": "1+1?", "answer": "2"}],
        "gameof24": [{"question": [4, 6, 1, 1]}],
        "multiple_choice": [{"question": "Sky?", "options": ["A. blue", "B. red"], "answer": "A"}],
    }[gold_layout(scorer)]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    bench = load_benchmark(str(path), scorer=scorer)
    assert bench.scorer == scorer and len(bench.items) == 1
    answer = {"qa": "Paris", "math": "2", "gameof24": "(4 * 6) * 1 * 1", "multiple_choice": "A"}
    assert get_scorer(scorer)(answer[gold_layout(scorer)], bench.items[0].gold).correct


def test_infer_kind() -> None:
    assert infer_kind([{"question": [1, 2, 3, 4], "answer": "x"}]) == "gameof24"
    assert infer_kind([{"question": "q", "options": ["A. x", "B. y"], "answer": "x"}]) == "multiple_choice"
    assert infer_kind([{"question": "q", "answer": "Paris"}]) == "qa"


@pytest.mark.parametrize(("content", "message"), [
    ("not json", "not valid JSON"),
    ("[]", "one or more items"),
    ('[{"question": "q"}]', "no answer"),
    ('[{"question": "", "answer": "a"}]', "no question text"),
])
def test_bad_benchmark_files_are_refused_clearly(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_benchmark(str(path))


def test_unknown_benchmark_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="bamboogle"):
        load_benchmark("nope")


def test_package_data_does_not_depend_on_shared() -> None:
    # The shipped copies must be complete on their own (the package never reads ../shared at run time).
    assert sorted(p.name for p in DATA_DIR.glob("*.json")) == sorted(f"{n}.json" for n in SHIPPED)
    assert (DATA_DIR / "README.md").is_file()
    source = (Path(__file__).resolve().parents[2] / "src" / "agentflow" / "eval" / "benchmarks.py").read_text()
    assert "shared" not in source
