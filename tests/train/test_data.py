"""Question loading, the resumable sampler, and the shipped tasks."""

import itertools
import json
import re
from pathlib import Path

import pytest

import agentflow
from agentflow.errors import ConfigError
from agentflow.scoring import get_scorer
from agentflow.train.config import DataSettings
from agentflow.train.data import BatchSampler, Question, held_out_questions, load_questions, training_questions
from agentflow.train.tasks import task_path
from agentflow.train.tasks.tool_use import NATIONALITIES


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_load_jsonl_and_json_with_defaults(tmp_path):
    records = [{"id": "a", "question": "Q1", "answer": "1", "reward": "exact_match", "kind": "x"},
               {"question": "Q2", "answer": 2}]
    items = load_questions(write_jsonl(tmp_path / "q.jsonl", records), DataSettings())
    assert [q.id for q in items] == ["a", "q-2"]
    assert items[0].meta == {"kind": "x"} and items[1].reward == "exact_match"
    (tmp_path / "q.json").write_text(json.dumps(records))
    assert [q.question for q in load_questions(tmp_path / "q.json", DataSettings())] == ["Q1", "Q2"]


def test_bad_files_are_named(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_questions(tmp_path / "none.jsonl", DataSettings())
    with pytest.raises(ConfigError, match="lacks field"):
        load_questions(write_jsonl(tmp_path / "a.jsonl", [{"question": "q"}]), DataSettings())
    with pytest.raises(ConfigError, match="appears twice"):
        load_questions(write_jsonl(tmp_path / "b.jsonl", [{"id": 1, "question": "q", "answer": 1}] * 2),
                       DataSettings())
    (tmp_path / "c.jsonl").write_text('{"question": \n')
    with pytest.raises(ConfigError, match="c.jsonl:1"):
        load_questions(tmp_path / "c.jsonl", DataSettings())


def _items(n):
    return [Question(id=str(i), question=f"q{i}", answer=i, reward="exact_match") for i in range(n)]


def test_excluded_ids_leave_the_training_questions_only_and_unknown_ones_are_named(tmp_path):
    records = [{"id": f"q{i}", "question": f"Q{i}", "answer": str(i)} for i in range(4)]
    train = write_jsonl(tmp_path / "train.jsonl", records)
    settings = DataSettings(train_path=str(train), eval_path=str(train), exclude_train_ids=["q1", "q3"])
    assert [q.id for q in training_questions(settings)] == ["q0", "q2"]
    assert len(held_out_questions(settings)) == 4   # held-out questions are never dropped
    assert len(training_questions(DataSettings(train_path=str(train)))) == 4
    with pytest.raises(ConfigError, match="1 id.*'q9'"):
        training_questions(DataSettings(train_path=str(train), exclude_train_ids=["q0", "q9"]))
    with pytest.raises(ConfigError, match="every training question"):
        training_questions(DataSettings(train_path=str(train), exclude_train_ids=[f"q{i}" for i in range(4)]))


def test_sampler_covers_each_epoch_once_and_reshuffles():
    sampler = BatchSampler(_items(6), batch_size=3, seed=1)
    epoch1 = [q.id for _ in range(2) for q in sampler.next_batch()]
    epoch2 = [q.id for _ in range(2) for q in sampler.next_batch()]
    assert sorted(epoch1) == sorted(epoch2) == [str(i) for i in range(6)]
    assert epoch1 != epoch2


def test_sampler_resumes_from_a_position_with_the_same_batches():
    full = BatchSampler(_items(7), batch_size=3, seed=5)
    batches = [[q.id for q in full.next_batch()] for _ in range(5)]
    resumed = BatchSampler(_items(7), batch_size=3, seed=5, position=6)
    assert [[q.id for q in resumed.next_batch()] for _ in range(3)] == batches[2:]


def _kinds(counts):
    return [Question(id=f"{kind}{i}", question=f"{kind} {i}", answer=i, reward="exact_match", meta={"kind": kind})
            for kind, n in counts.items() for i in range(n)]


def test_stratified_batches_hold_each_kind_in_its_share_and_resume():
    items = _kinds({"compute": 30, "lookup": 30, "both": 30})
    sampler = BatchSampler(items, batch_size=6, seed=3, stratify_field="kind")
    batches = [[q.meta["kind"] for q in sampler.next_batch()] for _ in range(20)]  # 15 per epoch: two epochs
    assert all(sorted(b) == ["both"] * 2 + ["compute"] * 2 + ["lookup"] * 2 for b in batches)
    sampler = BatchSampler(items, batch_size=6, seed=3, stratify_field="kind")
    epoch = [q.id for _ in range(15) for q in sampler.next_batch()]
    assert sorted(epoch) == sorted(q.id for q in items)  # every question once per epoch, in a shuffled order
    assert [i for i in epoch if i.startswith("compute")] != [f"compute{i}" for i in range(30)]
    resumed = BatchSampler(items, batch_size=6, seed=3, position=24, stratify_field="kind")
    again = BatchSampler(items, batch_size=6, seed=3, stratify_field="kind")
    for _ in range(4):
        again.next_batch()
    assert [q.id for q in resumed.next_batch()] == [q.id for q in again.next_batch()]
    # unequal strata are spread in proportion: 10 of a rare kind among 50 land about one per batch of 6
    rare = BatchSampler(_kinds({"common": 40, "rare": 10}), batch_size=5, seed=0, stratify_field="kind")
    assert [sum(q.meta["kind"] == "rare" for q in rare.next_batch()) for _ in range(10)] == [1] * 10


def test_one_stratum_draws_the_unstratified_order_and_a_missing_field_is_named():
    plain = BatchSampler(_items(9), batch_size=3, seed=4)
    one = BatchSampler([Question(id=q.id, question=q.question, answer=q.answer, reward=q.reward,
                                 meta={"kind": "x"}) for q in _items(9)], batch_size=3, seed=4, stratify_field="kind")
    assert [[q.id for q in plain.next_batch()] for _ in range(6)] == [[q.id for q in one.next_batch()]
                                                                      for _ in range(6)]
    with pytest.raises(ConfigError, match="no field 'kind'"):
        BatchSampler(_items(4), batch_size=2, seed=0, stratify_field="kind")


def test_tool_use_splits_share_no_question_and_are_scorable():
    train = load_questions(task_path("train", "tool_use"), DataSettings())
    heldout = load_questions(task_path("heldout", "tool_use"), DataSettings())
    assert len(heldout) >= 100
    assert not {q.question for q in train} & {q.question for q in heldout}
    assert not {q.meta.get("source_title") for q in train} & {q.meta.get("source_title") for q in heldout} - {None}
    for q in train + heldout:
        get_scorer(q.reward)  # registered
        if q.meta["kind"] == "arithmetic":
            assert str(eval(q.question.removeprefix("What is ").rstrip("?"))) == q.answer  # noqa: S307
        else:
            assert q.answer in NATIONALITIES and q.meta["tool"] == "wikipedia_search"


def test_lookup_compute_needs_two_tools_and_shares_no_element_with_training():
    train = load_questions(task_path("train"), DataSettings())
    heldout = load_questions(task_path("heldout"), DataSettings())
    assert len(heldout) >= 200 and len(train) >= 250
    assert not {q.meta["element"] for q in train} & {q.meta["element"] for q in heldout}
    assert {q.meta["kind"] for q in heldout} == {"times"}
    for q in train + heldout:
        assert q.meta["tools"] == ["wikipedia_search", "python"] and q.reward == "cover_em"
        z, k = q.meta["atomic_number"], int((re.findall(r"\d+", q.question) or [0])[0])
        expected = {"times": z * k, "plus": z + k, "minus": k - z, "square": z * z}[q.meta["kind"]]
        name = q.meta["element"].split(" (")[0].lower()
        assert q.answer == str(expected) and f"atomic number of {name}" in q.question


def test_mixed_needs_a_plan_per_kind_and_shares_no_element_or_phrasing_with_training():
    from agentflow.train.tasks.mixed import PLANS

    train = load_questions(task_path("train", "mixed"), DataSettings())
    heldout = load_questions(task_path("heldout", "mixed"), DataSettings())
    assert len(heldout) >= 300
    for split in (train, heldout):
        kinds = {kind: sum(q.meta["kind"] == kind for q in split) for kind in PLANS}
        assert min(kinds.values()) >= 0.3 * len(split)  # about a third each
    assert len({tuple(plan) for plan in PLANS.values()}) == 3  # no tool sequence is right for two kinds
    assert not {q.meta.get("element") for q in train} & {q.meta.get("element") for q in heldout} - {None}
    assert not {q.meta["template"] for q in train} & {q.meta["template"] for q in heldout}
    assert not {q.question for q in train} & {q.question for q in heldout}
    for q in train + heldout:
        assert q.meta["tools"] == PLANS[q.meta["kind"]] and q.reward == "cover_em"
        numbers = [int(n) for n in re.findall(r"\d+", q.question)]
        if q.meta["kind"] == "compute":
            expected = sum(numbers) if len(numbers) == 3 else numbers[0] * numbers[1]
        else:
            name = q.meta["element"].split(" (")[0].lower()
            assert name in q.question.lower()
            expected = q.meta["atomic_number"] * (numbers[0] if q.meta["kind"] == "lookup_compute" else 1)
            assert len(numbers) == (q.meta["kind"] == "lookup_compute")
        assert q.answer == str(expected)


@pytest.mark.parametrize("task", ["mixed", "mixed_kb"])
def test_the_mixed_flows_worked_examples_show_no_held_out_phrasing_or_entity(task):
    """The executor's examples are in every prompt, held-out questions' included: training phrasings only."""
    import importlib

    from agentflow.config import FlowConfig

    templates = importlib.import_module(f"agentflow.train.tasks.{task}").TEMPLATES
    config = FlowConfig.from_yaml(Path(agentflow.__file__).parent / "configs" / f"flow_{task}.yaml")
    examples = [e["question"] for tool in config.tools.values() for e in tool.get("examples", [])]
    assert len(examples) >= 4
    heldout = load_questions(task_path("heldout", task), DataSettings())
    names = {word for q in heldout for field in ("element", "entity") if q.meta.get(field)
             for word in re.findall(r"[a-z]+", q.meta[field].split(" (")[0].lower())}
    names -= {"the", "express"} | {word for template in (t for kind in templates.values() for split in kind.values()
                                                         for t in split) for word in re.findall(r"[a-z]+", template)}
    for template in (t for kind in templates.values() for t in kind["heldout"]):
        parts = re.split(r"\{(\w+)\}", template)  # literal, field, literal, ...
        pattern = "".join(re.escape(part) if i % 2 == 0 else (r"\d+" if part in "abck" else ".+")
                          for i, part in enumerate(parts))
        assert not any(re.fullmatch(pattern, question) for question in examples), template
    assert not any(word in names for question in examples for word in re.findall(r"[a-z]+", question.lower()))


def test_cover_em_accepts_the_gold_inside_a_sentence_only_as_whole_tokens():
    score = get_scorer("cover_em")
    assert score("Georgy Zhukov was a Soviet military leader.", "Soviet").correct
    assert not score("Sovietic", "Soviet").correct
    assert not score("6873 * 683", "4694259").correct


@pytest.mark.parametrize("task", ["lookup_compute", "mixed", "mixed_kb", "tool_use"])
def test_shipped_tasks_regenerate_identically(task):
    """The generators are deterministic: rebuilding from the corpus gives the committed files."""
    wiki = pytest.importorskip("agentflow.wiki_index")
    from agentflow.bundled import wiki_summaries_path
    from agentflow.train.tasks import COLLECTIONS, GENERATORS

    try:
        summaries = json.loads(wiki_summaries_path().read_text(encoding="utf-8"))
    except Exception as err:  # the corpus package is a data dependency; skip cleanly without it
        pytest.skip(f"offline Wikipedia summaries not installed: {err}")
    index = wiki.get_index(None)
    splits = GENERATORS[task](summaries, search=lambda q: [h.title for h in index.search(q, 3)])
    for split, records in splits.items():
        shipped = [json.loads(line) for line in task_path(split, task).read_text().splitlines()]
        assert shipped == records
    for name, documents in (COLLECTIONS[task](summaries) if task in COLLECTIONS else {}).items():
        assert json.loads((task_path("train", task).parent / "collections" / f"{name}.json").read_text()) == documents


@pytest.mark.parametrize(("n", "batch_size", "seed"), [(280, 6, 6), (7, 3, 5), (10, 4, 0), (5, 5, 2)])
def test_no_batch_holds_a_question_twice_across_epoch_boundaries(n, batch_size, seed):
    """Regression: a batch spanning the end of an epoch could draw one question twice, and the step died in
    the advantage estimator (lookup_compute, batch 6, seed 6, step 47)."""
    sampler = BatchSampler(_items(n), batch_size=batch_size, seed=seed)
    per_epoch = n // batch_size
    for _ in range(3 * per_epoch + 1):
        ids = [q.id for q in sampler.next_batch()]
        assert len(ids) == batch_size == len(set(ids))
    again = BatchSampler(_items(n), batch_size=batch_size, seed=seed)
    epoch = [q.id for _ in range(per_epoch) for q in again.next_batch()]
    assert len(epoch) == len(set(epoch)) == per_epoch * batch_size  # each drawn at most once per epoch


def test_mixed_kb_no_constant_holds_more_than_four_kinds_plans():
    """The task's point, by construction: three turns hold the tools of at most four of its seven kinds, and a
    kind whose tool is not called has its facts nowhere else (names are not words of the Wikipedia corpus)."""
    from agentflow.train.tasks.mixed_kb import PLANS

    tools = sorted({tool for plan in PLANS.values() for tool in plan})

    def holds(sequence, plan):
        it = iter(sequence)
        return all(tool in it for tool in plan)  # `plan` is a subsequence of `sequence`

    covered = [sum(holds(seq, plan) for plan in PLANS.values())
               for n in range(4) for seq in itertools.product(tools, repeat=n)]
    assert len(tools) == 6 and len(PLANS) == 7 and max(covered) == 4


def test_mixed_kb_splits_share_no_entity_or_phrasing_and_every_fact_is_in_its_collection():
    from agentflow.bundled import resolve_data_path
    from agentflow.train.tasks.mixed_kb import COLLECTION_OF, PLANS, TEMPLATES

    train = load_questions(task_path("train", "mixed_kb"), DataSettings())
    heldout = load_questions(task_path("heldout", "mixed_kb"), DataSettings())
    assert len(heldout) == 315 and {q.meta["kind"] for q in heldout} == set(PLANS)
    for split in (train, heldout):
        counts = {kind: sum(q.meta["kind"] == kind for q in split) for kind in PLANS}
        assert len(set(counts.values())) == 1  # every kind equally often
    for field in ("entity", "element", "template"):
        assert not {q.meta.get(field) for q in train} & {q.meta.get(field) for q in heldout} - {None}
    assert not {t for kind in TEMPLATES.values() for t in kind["train"]} & {
        t for kind in TEMPLATES.values() for t in kind["heldout"]}
    for kind, tool in COLLECTION_OF.items():
        documents = json.loads(resolve_data_path(
            f"bundled:tasks/mixed_kb/collections/{tool}.json").read_text(encoding="utf-8"))
        by_title = {d["title"]: d["extract"] for d in documents}
        asked = [q for q in train + heldout if q.meta["kind"] == kind]
        assert len(by_title) == len(documents) > len({q.meta["entity"] for q in asked})  # some never asked
        for q in asked:
            assert q.meta["tools"] == [tool] and q.meta["entity"] in q.question
            assert re.search(rf"\b{q.answer}\b", by_title[q.meta["entity"]])
            assert len(q.meta["sub_goals"][0]) <= 40  # fits the flow's plan_chars


def test_mixed_kb_a_held_out_question_finds_its_document_first_in_its_collection(tmp_path, monkeypatch):
    """The look-ups can succeed: the real index over each shipped collection ranks the asked entity first."""
    pytest.importorskip("bm25s")
    from agentflow.bundled import resolve_data_path
    from agentflow.train.tasks.mixed_kb import COLLECTION_OF
    from agentflow.wiki_index import WikiIndex

    monkeypatch.setenv("AGENTFLOW_CACHE", str(tmp_path))
    heldout = load_questions(task_path("heldout", "mixed_kb"), DataSettings())
    for kind, tool in COLLECTION_OF.items():
        index = WikiIndex.load_or_build(resolve_data_path(f"bundled:tasks/mixed_kb/collections/{tool}.json"))
        for q in (q for q in heldout if q.meta["kind"] == kind):
            assert index.search(q.question, 1)[0].title == q.meta["entity"], q.question
