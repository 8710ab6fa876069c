"""The pages in a real headless Chromium, on runs made by the real flow and eval runner with scripted engines whose
every reply carries HTML and scripts: filters, search, live updates, the comparison, the training pages, the
export opened from disk with the network cut, and hostile model text shown as text."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentflow.view.api import ViewApp
from agentflow.view.export import write_export
from tests.view.browser import Watched, expect, launch, require_chromium, serving
from tests.view.builders import (
    IMG,
    SCRIPT,
    eval_run,
    right_on_france,
    right_on_hamlet,
    train_run,
    trained_flow_config,
    trajectory_dict,
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {"a": eval_run(root / "a", right_on_france), "b": eval_run(root / "b", right_on_hamlet),
            "trained": eval_run(root / "trained", right_on_hamlet, flow_config=trained_flow_config()),
            "new": train_run(root / "train_new", new_format=True),
            "old": train_run(root / "train_old", new_format=False), "root": root}


@pytest.fixture(scope="module")
def browser(runs: dict[str, Path]) -> Iterator[Any]:
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()


@pytest.fixture()
def tab(browser: Any) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    watched = Watched(context.new_page())
    yield watched
    context.close()
    assert not watched.errors, watched.errors


def nothing_ran(page: Any) -> None:
    """No model text became markup: no injected script ran, no injected element exists."""
    assert page.evaluate("window.__pwned") is None
    assert page.locator("main img, main script, main [onerror]").count() == 0
    injected = "[...document.querySelectorAll('main b, main i')].map((e) => e.textContent)"
    assert not {"ctx", "ok", "arrives"} & set(page.evaluate(injected))


def test_a_pending_search_does_not_rewrite_the_next_pages_address(tab: Watched, runs: dict[str, Path]) -> None:
    """The search box redraws 120 ms after the last key; a link followed within that time keeps its address
    (the left page's redraw once put '#/run/0?q=...' back over the item's, and the item never counted as drawn)."""
    with serving([runs["a"]]) as url:
        page = tab.open(url)
        page.clock.install()  # the redraw's timer waits for run_for: the click always comes first, even on a
        page.fill("input[type=search]", "tag")  # loaded machine (real time let it fire before the click)
        page.locator("table.items a", has_text="Which tag is this").first.click()
        page.clock.run_for(500)
        assert "/run/0/item/quiz%3A1%3A2" in page.url
        tab.ready()


def test_a_pending_search_keeps_off_an_address_whose_hashchange_has_not_run_yet(tab: Watched,
                                                                               runs: dict[str, Path]) -> None:
    """The race behind the test above, made certain: the address changes without a hashchange (the browser
    dispatches it later), then the search's redraw fires. The left page must see that the address is no longer
    its own."""
    with serving([runs["a"]]) as url:
        page = tab.open(url)
        page.clock.install()
        page.fill("input[type=search]", "tag")
        page.evaluate("history.pushState(null, '', '#/run/0/item/quiz%3A1%3A2')")  # no hashchange event
        page.clock.run_for(500)
        assert page.url.endswith("#/run/0/item/quiz%3A1%3A2")


def test_eval_run_filters_search_and_item(tab: Watched, runs: dict[str, Path]) -> None:
    with serving([runs["a"]]) as url:
        page = tab.open(url)
        assert page.url.endswith("#/run/0")
        summary = page.locator("table.summary tbody tr")
        assert summary.count() == 1 and "33.3%" in summary.inner_text() and "1 / 3" in summary.inner_text()
        rows = page.locator("table.items tbody tr")
        assert rows.count() == 3
        page.fill("input[type=search]", "hamlet")
        expect(rows).to_have_count(1)
        assert "Who wrote Hamlet?" in rows.inner_text()
        page.fill("input[type=search]", "")
        page.select_option("select[name=outcome]", "correct")
        expect(rows).to_have_count(1)
        assert "capital of France" in rows.inner_text()
        assert "outcome=correct" in page.url                     # the filter is in the address
        page.select_option("select[name=outcome]", "wrong")
        expect(rows).to_have_count(2)
        page.select_option("select[name=outcome]", "")
        tab.click("table.items a", has_text="Which tag is this")
        assert "/run/0/item/quiz%3A1%3A2" in page.url
        text = page.locator("main").inner_text()
        assert f"Which tag is this: {SCRIPT}?" in text             # the question, as text
        assert f"look it up {SCRIPT}" in text                      # the planner's sub-goal
        assert f"hello {IMG} [/x]" in text                         # the executor's call and the tool's result
        assert "enough <i>ok</i>" in text                          # the verifier's analysis
        assert "STOP" in text and "ScriptedEngine" in text and "T 0" in text and "max 128" in text
        assert page.locator(".outcome-box.wrong").count() == 1 and "script" in page.locator(".outcome-box").inner_text()
        nothing_ran(page)
        page.locator("details.call summary").first.click()         # the prompt as sent, folded
        assert page.locator("details.call[open] .message").count() >= 2
        page.go_back()
        tab.ready()
        assert page.locator("table.items tbody tr").count() == 3


def test_eval_run_follows_new_results_without_reload(tab: Watched, runs: dict[str, Path], tmp_path: Path) -> None:
    # a copy of a finished run (runs are made before the browser starts: Playwright's loop blocks asyncio.run)
    run = Path(shutil.copytree(runs["a"], tmp_path / "live"))
    (run / "summary.json").unlink()                              # as if the run were still going
    with serving([run]) as url:
        page = tab.open(url)
        assert page.locator("#live").is_visible()
        page.evaluate("window.__sameDocument = true")
        lines = (run / "results.jsonl").read_text().splitlines()
        extra = json.loads(lines[0])
        extra.update({"id": "quiz:9:9", "index": 9, "question": "A new question <b>arrives</b>?",
                      "status": "infra_error", "correct": None,
                      "error": {"kind": "engine_timeout", "stage": "planner", "message": "slow"}})
        scored = json.loads(lines[0])
        scored.update({"id": "quiz:8:8", "index": 8, "question": "Another new one?", "correct": True})
        with (run / "results.jsonl").open("a") as handle:
            handle.write(json.dumps(extra) + "\n" + json.dumps(scored) + "\n")
        expect(page.locator("table.items tbody tr")).to_have_count(4, timeout=10000)  # the failure is apart
        assert page.evaluate("window.__sameDocument") is True
        failures = page.locator("#failures")
        assert "engine_timeout" in failures.inner_text() and "quiz:9:9" in failures.inner_text()
        assert "quiz:9:9" not in page.locator("table.items").inner_text()
        assert "2 / 4" in page.locator("table.summary").inner_text()  # accuracy counts scored items only
        nothing_ran(page)


def test_comparison_and_a_flipped_item_side_by_side(tab: Watched, runs: dict[str, Path]) -> None:
    with serving([runs["a"], runs["b"]]) as url:
        page = tab.open(url)
        assert page.url.endswith("#/compare/0/1")
        summary = page.locator("table.summary tbody tr").inner_text()
        assert "33.3%" in summary and "+0.0" in summary
        assert page.locator("table.flips tbody tr").count() == 2
        tab.click("table.flips a", has_text="Who wrote Hamlet?")
        sides = page.locator(".side")
        assert sides.count() == 2 and page.locator(".side .trajectory").count() == 2
        assert "✗" in sides.nth(0).locator("h2").inner_text() and "✓" in sides.nth(1).locator("h2").inner_text()
        assert SCRIPT in sides.nth(0).locator(".outcome-box").inner_text()
        assert "Shakespeare" in sides.nth(1).locator(".outcome-box").inner_text()
        nothing_ran(page)


def test_training_run_curves_groups_and_advantages(tab: Watched, runs: dict[str, Path]) -> None:
    with serving([runs["new"]]) as url:
        page = tab.open(url)
        titles = page.locator("figure.chart figcaption").all_inner_texts()
        for title in ("Reward and accuracy", "KL divergence", "Entropy", "Clip fraction", "Tool choice at turn 1",
                      "Tool choice at turn 2", "Seconds per phase", "Groups without signal, excluded trajectories",
                      "Menu position of the pick at turn 1"):
            assert title in titles
        position = page.locator("figure.chart", has=page.locator("figcaption", has_text="Menu position of the pick"))
        assert position.locator("path.series").count() == 2 and "listed 1" in position.inner_text()
        assert page.locator("figure.chart", has_text="Reward and accuracy").locator("path.series").count() == 3
        page.locator("figure.chart svg.plot").first.hover()         # values under the pointer
        assert "step" in page.locator(".tip:visible").inner_text()
        with (runs["new"] / "metrics.jsonl").open("a") as handle:   # the trainer logs another step
            handle.write(json.dumps({"step": 3, "reward_mean": 0.9, "kl_ref": 0.05}) + "\n")
        expect(page.locator(".stat b").first).to_have_text("3", timeout=10000)
        tab.click("a", has_text="rollout groups")                    # newest step first: step 2
        assert page.url.endswith("/train/0/step/2")
        groups = page.locator("article.group")
        assert groups.count() == 2
        first = groups.first.inner_text()
        assert "+0.71" in first and "−0.71" in first and "learning signal" in first
        assert f"Say {SCRIPT}" in groups.nth(1).inner_text() and IMG in groups.nth(1).inner_text()
        tab.click("article.group a", has_text="trajectory")
        assert "/rollout/q0%230" in page.url and page.locator(".turn").count() == 1
        nothing_ran(page)


def test_training_run_in_the_present_format(tab: Watched, runs: dict[str, Path]) -> None:
    with serving([runs["old"]]) as url:
        page = tab.open(url + "#/train/0/step/1")
        assert "advantages not recorded" in page.locator("article.group").first.inner_text()
        assert page.locator("article.group a", has_text="trajectory").count() == 0
        tab.click("a", has_text="next")
        assert page.url.endswith("/step/2")


def test_export_opens_from_disk_with_the_network_cut(browser: Any, runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    write_export(ViewApp([runs["a"], runs["b"], runs["new"]]), out)
    context = browser.new_context()
    requests: list[str] = []

    def only_the_file(route: Any) -> None:
        requests.append(route.request.url)
        route.continue_() if route.request.url.startswith(("file:", "data:")) else route.abort()

    context.route("**/*", only_the_file)
    tab = Watched(context.new_page())
    page = tab.open(out.as_uri())
    assert [s.strip() for s in page.locator("table.grid tbody tr td:nth-child(2)").all_inner_texts()] == \
        ["a", "b", "train_new"]
    assert not page.locator("#json").is_visible() and not page.locator("#live").is_visible()
    tab.click('table.grid a:text-is("a")')
    tab.click("table.items a", has_text="Which tag is this")
    assert f"look it up {SCRIPT}" in page.locator("main").inner_text()
    page.goto(out.as_uri() + "#/compare/0/1")
    tab.ready()
    tab.click("table.flips a", has_text="capital of France")
    assert page.locator(".side .trajectory").count() == 2
    page.goto(out.as_uri() + "#/train/2")
    tab.ready()
    assert page.locator("figure.chart").count() >= 8
    tab.click("a", has_text="rollout groups")
    tab.click("article.group a", has_text="trajectory")
    assert page.locator(".turn").count() == 1
    nothing_ran(page)
    assert all(url.startswith(("file:", "data:")) for url in requests), requests
    assert not tab.errors, tab.errors
    context.close()


def test_a_page_that_does_not_exist(browser: Any, runs: dict[str, Path]) -> None:
    context = browser.new_context()
    page = context.new_page()
    with serving([runs["a"]]) as url:
        page.goto(url + "#/run/0/item/nope")
        page.wait_for_selector("body[data-ready]")
        assert "Not found" in page.locator("h1").inner_text() and "nope" in page.locator("main").inner_text()
    context.close()


def test_an_abandoned_tool_reaches_zero_as_train_plot_draws_it(tab: Watched, tmp_path: Path) -> None:
    """Regression (issue 19): a run that logged a tool's share only when it was picked drew a line that stopped
    where the planner abandoned the tool; `agentflow train plot` draws 0 there, and so must the page."""
    from agentflow.train.plot import panels_of

    run = train_run(tmp_path / "train", new_format=True, steps=3)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        for key in [k for k in record if k.startswith("tool/turn")]:
            del record[key]
        if "reward_mean" in record:                               # python at step 1, then search only
            record["tool/turn1/python" if record["step"] == 1 else "tool/turn1/wikipedia_search"] = 1.0
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert ("tool/turn1/", "tool picked at turn 1 (rollouts)") in panels_of(records)
    with serving([run]) as url:
        page = tab.open(url)
        chart = page.locator("figure.chart", has=page.locator("figcaption", has_text="Tool choice at turn 1"))
        paths = chart.locator("path.series")
        assert paths.count() == 2
        for d in paths.evaluate_all("(ps) => ps.map((p) => p.getAttribute('d'))"):
            assert d.count("M") + d.count("L") == 3, d                  # both lines span steps 1-3
        plot = chart.locator("svg.plot")
        plot.scroll_into_view_if_needed()
        box = plot.bounding_box()
        plot.hover(position={"x": box["width"] - 12, "y": box["height"] / 2})   # the last step
        tip = chart.locator(".tip").inner_text()
        assert "step 3" in tip and "python 0%" in tip and "wikipedia_search 100%" in tip


def test_labels_tell_the_truth_verifier_engines_adapter_and_config_differences(
        tab: Watched, runs: dict[str, Path], tmp_path: Path) -> None:
    """Regression (issue 19): "verdict unparsed" on every turn of a flow without verifier, an empty engine
    column, the LoRA adapter nowhere, and no configuration differences on the comparison page."""
    trajectory = trajectory_dict("What is 6*7?", "42")
    trajectory["turns"][0].update({"verdict": None, "verdict_parsed": False, "verifier": None})
    sampling = {"temperature": 0.0, "max_tokens": 48}
    trajectory["roles"] = {
        "planner": {"engine_name": "policy", "engine": "transformers", "model": "SmolLM2-135M-Instruct",
                    "adapter": "runs/demo/final/adapter", "sampling": sampling},
        "generator": {"engine_name": "default", "engine": "llamacpp", "model": "smollm2", "sampling": sampling}}
    path = tmp_path / "no_verifier.json"
    path.write_text(json.dumps(trajectory))
    with serving([path]) as url:
        page = tab.open(url)
        header = page.locator(".turn header").inner_text()
        assert "no verifier" in header and "unparsed" not in page.locator("main").inner_text()
        page.locator("details.roles summary").click()
        cells = [row.locator("td").all_inner_texts() for row in page.locator("details.roles tbody tr").all()]
        assert cells[0][:4] == ["planner", "transformers (policy)", "SmolLM2-135M-Instruct",
                                "runs/demo/final/adapter"]
        assert cells[1][:4] == ["generator", "llamacpp (default)", "smollm2", "–"]

    with serving([runs["b"], runs["trained"]]) as url:
        page = tab.open(url)
        assert page.url.endswith("#/compare/0/1")
        listed = page.locator("ul.config-diff li").all_inner_texts()
        assert "flow.engines: added policy" in listed
        assert "flow.roles.planner.engine: 'default' -> 'policy'" in listed
        assert "2 difference(s)" in page.locator("main").inner_text()
        page.goto(url + "#/run/1")
        tab.ready()
        assert "transformers · bundled SmolLM2-135M + adapter runs/demo/final/adapter" in page.locator(
            ".settings").inner_text()
    with serving([runs["a"], runs["b"]]) as url:
        page = tab.open(url)
        assert "Configuration: the same" in page.locator("main").inner_text()


def test_the_code_a_tool_wrote_and_its_inner_call_can_be_read(tab: Watched, tmp_path: Path) -> None:
    """Regression (issue 19): the page said "1 model call(s) inside the tool" as a label that could not be
    opened, and never showed the code the python tool wrote and ran."""
    trajectory = trajectory_dict("What is 17 * 23?", "391")
    reply = "```python\nprint(17 * 23)\n```"
    trajectory["turns"][0]["tool_call"] = {
        "tool": "python", "arguments": {"task": "multiply 17 by 23"}, "output": "391",
        "data": {"code": "print(17 * 23)", "stdout": "391\n", "ok": True},
        "llm_calls": [{"role": "tools", "engine": {"engine": "llamacpp", "model": "smollm2"},
                       "sampling": {"temperature": 0.0, "max_tokens": 128},
                       "messages": [{"role": "system", "content": "You write short Python 3 programs."},
                                    {"role": "user", "content": "Task: multiply 17 by 23"}],
                       "completion": {"text": reply, "prompt_tokens": 40, "completion_tokens": 9}}]}
    path = tmp_path / "python_task.json"
    path.write_text(json.dumps(trajectory))
    with serving([path]) as url:
        page = tab.open(url)
        tool = page.locator(".step.tool")
        assert "code that ran" in tool.inner_text() and "print(17 * 23)" in tool.inner_text()
        assert "model call 1 of 1 inside the tool" in tool.inner_text()
        tool.locator("details.call summary", has_text="prompt and reply inside the tool").click()
        opened = tool.locator("details.call[open]").inner_text()
        assert "Task: multiply 17 by 23" in opened and "```python" in opened


def test_a_run_with_several_trained_roles_draws_a_line_per_role(tab: Watched, tmp_path: Path) -> None:
    """With `train_roles: [planner, executor]` the trainer logs the executor's own metrics as `executor/…`: the
    entropy, clip fraction and gradient norm charts show one line per role."""
    run = train_run(tmp_path / "train", new_format=True, steps=2)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for record in records:
        if "entropy" in record:
            record.update({"executor/entropy": 2.0, "executor/grad_norm": 0.3, "executor/rows": 4.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    with serving([run]) as url:
        page = tab.open(url)
        for title, names in (("Entropy", ["entropy", "executor entropy"]),
                             ("Gradient norm", ["grad norm", "executor grad norm"])):
            chart = page.locator("figure.chart", has=page.locator("figcaption", has_text=title))
            assert chart.locator("path.series").count() == 2
            assert [s.strip() for s in chart.locator(".legend span").all_inner_texts()] == names
        nothing_ran(page)
