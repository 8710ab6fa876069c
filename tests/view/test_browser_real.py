"""Click through runs made by the real flow with the bundled model, in a real Chromium:
eval run -> item -> trajectory -> comparison -> flipped item -> training run -> rollout groups."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from agentflow.config import FlowConfig
from agentflow.eval.compare import compare_runs
from agentflow.eval.runner import EvalSettings, run_eval
from tests.view.browser import Watched, launch, require_chromium, serving

pytestmark = pytest.mark.slow

# One planner turn, short replies, one llama.cpp thread: every module and the tools still run.
FAST = {
    "engines": {"default": {"kind": "llamacpp", "n_threads": 1, "n_parallel": 2}},
    "roles": {role: {"sampling": {"max_tokens": tokens}} for role, tokens in
              (("planner", 64), ("executor", 96), ("verifier", 32), ("generator", 48), ("tools", 96))},
    "limits": {"max_turns": 1, "max_seconds": 600},
    "query_analysis": False,
}
QUESTIONS = [{"pid": "1", "question": "What is 123 * 45?", "answer": "5535"},
             {"pid": "2", "question": "Who painted the Mona Lisa?", "answer": "Leonardo da Vinci"}]


def train_one_step(out: Path, data: Path) -> Path:
    """One Flow-GRPO step: the bundled planner on transformers (LoRA), the other roles on llama.cpp."""
    from agentflow.train.config import TrainConfig
    from agentflow.train.trainer import Trainer

    config = TrainConfig.from_dict({
        "flow": {"engines": {"policy": {"kind": "transformers", "device": "cpu"},
                             "helper": {"kind": "llamacpp", "n_threads": 1}},
                 "roles": {"planner": {"engine": "policy", "sampling": {"temperature": 1.0, "max_tokens": 24}},
                           **{role: {"engine": "helper", "sampling": {"max_tokens": 48}}
                              for role in ("executor", "verifier", "generator", "tools")}},
                 "tools": {"python": {}, "wikipedia_search": {}}, "limits": {"max_turns": 1},
                 "query_analysis": False},
        "data": {"train_path": str(data), "eval_path": str(data)}, "planner_prefix": '{"tool_name": "',
        "lora": {"rank": 4, "alpha": 8}, "batch_size": 1, "group_size": 2, "max_steps": 1, "eval_every": 1,
        "eval_at_start": False, "eval_size": 1, "export_gguf": False, "torch_threads": 1,
        "output_dir": str(out)})
    Trainer(config).run()
    return out


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("xllamacpp")
    require_chromium()                                       # before minutes of model time
    root = tmp_path_factory.mktemp("real")
    bench = root / "quiz.jsonl"
    bench.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    quiet = Console(file=io.StringIO())
    run_eval(EvalSettings(benches=[str(bench)], out=root / "base", concurrency=2), console=quiet,
             flow_config=FlowConfig.from_dict(FAST))
    other = {**FAST, "roles": {**FAST["roles"], "generator": {"sampling": {"max_tokens": 24}}}}
    run_eval(EvalSettings(benches=[str(bench)], out=root / "short", concurrency=2), console=quiet,
             flow_config=FlowConfig.from_dict(other))
    if not any(c.gained or c.lost for c in compare_runs(root / "base", root / "short")):
        # The tiny model may answer alike in both runs; flip one verdict (a later line wins) so that the
        # flipped-item view is exercised whatever it answers. The trajectories stay the real ones.
        line = json.loads((root / "short" / "results.jsonl").read_text().splitlines()[0])
        line["correct"] = not line["correct"]
        with (root / "short" / "results.jsonl").open("a") as handle:
            handle.write(json.dumps(line) + "\n")
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"t{i}", "question": q["question"], "answer": q["answer"],
                                        "reward": "exact_match"}) + "\n" for i, q in enumerate(QUESTIONS)))
    train = train_one_step(root / "train", data)
    trajectory = next((root / "base" / "trajectories").glob("*.json"))
    return {"base": root / "base", "short": root / "short", "train": train, "trajectory": trajectory}


@pytest.fixture(scope="module")
def browser(real_runs: dict[str, Path]) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()


def test_click_through_real_runs(browser: Any, real_runs: dict[str, Path]) -> None:
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    tab = Watched(context.new_page())
    paths = [real_runs["base"], real_runs["short"], real_runs["train"], real_runs["trajectory"]]
    with serving(paths) as url:
        page = tab.open(url)
        assert page.locator("table.grid tbody tr").count() == 4        # the sources

        tab.click('table.grid a:text-is("base")')                      # eval run
        assert page.locator("table.summary tbody tr").count() == 1
        assert page.locator("table.items tbody tr").count() == 2
        assert "llamacpp" in page.locator(".settings").inner_text()

        tab.click("table.items a", has_text="123 * 45")                # item -> its trajectory
        main = page.locator("main").inner_text()
        assert "What is 123 * 45?" in main and "5535" in main          # question and gold
        assert page.locator(".turn").count() == 1
        planner = page.locator(".step.planner .call-meta").first.inner_text()
        assert "llamacpp" in planner and "SmolLM2" in planner and "T 0" in planner and "tok" in planner
        assert page.locator(".step.generator").count() == 1

        page.goto(url + "#/")
        tab.ready()
        tab.click("ul.links a")                                        # comparison base -> short
        assert page.locator("table.summary tbody tr").count() == 1
        assert page.locator("table.flips tbody tr").count() >= 1
        tab.click("table.flips a")                                     # a flipped item, side by side
        assert page.locator(".side .trajectory").count() == 2

        page.goto(url + "#/")
        tab.ready()
        tab.click('table.grid a:text-is("train")')                     # training run
        titles = page.locator("figure.chart figcaption").all_inner_texts()
        assert "Reward and accuracy" in titles and "Seconds per phase" in titles
        assert page.locator("table.grid", has_text="held-out accuracy").locator("tbody tr").count() == 1
        tab.click("a", has_text="rollout groups")
        group = page.locator("article.group")
        assert group.count() == 1 and group.locator("table.rollouts tbody tr").count() == 2

        page.goto(url + "#/trajectory/3")                              # a trajectory file
        tab.ready()
        assert page.locator(".turn").count() == 1
    assert not tab.errors, tab.errors
    context.close()
