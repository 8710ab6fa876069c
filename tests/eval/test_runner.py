"""The eval runner with fake agents: results and summary files, failures, retries, resume, concurrency."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from agentflow.config import FlowConfig, LimitsConfig, bundled_flow_config
from agentflow.engines.scripted import ScriptedEngine
from agentflow.errors import ConfigError
from agentflow.eval.judge import LLMJudge, VerdictCache
from agentflow.eval.results import ResultsLog
from agentflow.eval.runner import EvalRun, EvalSettings, render_summaries, run_eval
from tests.eval.fake_agents import FakeAgent


def write_bench(path: Path, n: int, *, markers: dict[int, str] | None = None) -> Path:
    """A QA benchmark file whose even items are about France (answer Paris) and odd items are not."""
    markers = markers or {}
    rows = []
    for i in range(n):
        topic = "France" if i % 2 == 0 else "Peru"
        rows.append({"pid": str(i), "query": f"Q{i}: capital of {topic}? {markers.get(i, '')}".strip(),
                     "answer": ["Paris"] if topic == "France" else ["Lima"]})
    path.write_text(json.dumps(rows))
    return path


def paris_agent(**kwargs: object) -> FakeAgent:
    return FakeAgent(lambda q: "<answer>Paris</answer>", **kwargs)  # type: ignore[arg-type]


def run(tmp_path: Path, bench: Path, agent: FakeAgent, **settings: object):
    console = Console(file=io.StringIO(), width=120)
    report = run_eval(EvalSettings(benches=[str(bench)], out=tmp_path / "out", **settings),  # type: ignore[arg-type]
                      console=console, solver=agent)
    return report, console


def lines(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]


def test_results_summary_config_and_trajectories(tmp_path: Path) -> None:
    bench = write_bench(tmp_path / "capitals.json", 6)
    report, _ = run(tmp_path, bench, paris_agent())
    records = lines(tmp_path)
    assert sorted(r["id"] for r in records) == [f"capitals:{i}:{i}" for i in range(6)]
    first = next(r for r in records if r["id"] == "capitals:0:0")
    assert first["prediction"] == "<answer>Paris</answer>" and first["gold"] == ["Paris"]
    assert first["correct"] is True and first["status"] == "scored" and first["score"]["exact_match"]
    assert first["turns"] == 1 and first["tools"] == {"python": 1}
    assert first["tokens"] == {"calls": 3, "prompt_tokens": 30, "completion_tokens": 6}
    traj = json.loads((tmp_path / "out" / first["trajectory"]).read_text())
    assert traj["question"].startswith("Q0") and first["trajectory"] == "trajectories/capitals_0_0.json"

    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["benchmarks"]["capitals"]
    assert (summary["scored"], summary["correct"], summary["infra_failed"]) == (6, 3, 0)
    assert summary["accuracy"] == pytest.approx(0.5) and summary["accuracy_all"] == pytest.approx(0.5)
    assert summary["this_run"]["items"] == 6 and summary["this_run"]["items_per_minute"] > 0
    assert report.summaries["capitals"].correct == 3 and report.ran == 6
    assert report.this_run.items == 6
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["this_run"]["items"] == 6

    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["fingerprint"] == report.fingerprint
    assert config["identity"]["flow"] == bundled_flow_config().model_dump(mode="json")  # no config given
    assert config["benchmarks"]["capitals"]["scorer"] == "exact_match"


def test_infrastructure_failures_are_reported_apart_never_scored(tmp_path: Path) -> None:
    bench = write_bench(tmp_path / "capitals.json", 6, markers={1: "ENGINE_DOWN", 2: "CRASH"})
    report, console = run(tmp_path, bench, paris_agent())
    by_id = {r["id"]: r for r in lines(tmp_path)}
    assert by_id["capitals:1:1"]["status"] == "infra_error" and by_id["capitals:1:1"]["correct"] is None
    assert by_id["capitals:1:1"]["error"] == {"kind": "engine_unavailable", "stage": "planner",
                                              "message": "connection refused"}
    assert by_id["capitals:1:1"]["trajectory"]                       # the failed run is kept for inspection
    assert by_id["capitals:2:2"]["error"]["kind"] == "RuntimeError"
    s = report.summaries["capitals"]
    # Items 0 and 4 are right (Paris), 3 and 5 wrong; 1 and 2 failed: not wrong, not dropped.
    assert (s.scored, s.correct, s.infra_failed) == (4, 2, 2)
    assert s.accuracy == pytest.approx(2 / 4) and s.accuracy_all == pytest.approx(2 / 6)
    assert s.failure_reasons == {"engine_unavailable": 1, "RuntimeError": 1}
    render_summaries(console, report.summaries)
    text = console.file.getvalue()  # type: ignore[attr-defined]
    assert "2 items failed" in text and "capitals:1:1: engine_unavailable: connection refused" in text


def test_question_timeout_is_scored_as_the_agents_answer(tmp_path: Path) -> None:
    """Regression: a question's own time-out was reported as infrastructure and left out of accuracy. Queue
    waits no longer count against the limit, so a time-out is the agent's and its answer is scored."""
    bench = write_bench(tmp_path / "capitals.json", 2, markers={0: "TIMEOUT"})
    report, _ = run(tmp_path, bench, paris_agent())
    by_id = {r["id"]: r for r in lines(tmp_path)}
    assert by_id["capitals:0:0"]["status"] == "scored" and by_id["capitals:0:0"]["correct"] is not None
    assert report.summaries["capitals"].failure_reasons == {}


def test_rerun_skips_finished_items_and_retry_failed_replaces_failures(tmp_path: Path) -> None:
    bench = write_bench(tmp_path / "capitals.json", 4, markers={1: "ENGINE_DOWN"})
    run(tmp_path, bench, paris_agent())
    again = paris_agent()
    report, _ = run(tmp_path, bench, again)
    assert again.asked == [] and report.ran == 0                      # nothing new, failures not retried
    assert report.summaries["capitals"].infra_failed == 1

    healed = paris_agent(fail_marker="")                             # the engine is back
    report, _ = run(tmp_path, bench, healed, retry_failed=True)
    assert [q.split(":")[0] for q in healed.asked] == ["Q1"]
    records = lines(tmp_path)
    assert len(records) == 5                                          # append-only: the failure line stays...
    final = ResultsLog(tmp_path / "out" / "results.jsonl").read()
    assert len(final) == 4 and final["capitals:1:1"].status == "scored"  # ...but the later line wins
    s = report.summaries["capitals"]
    assert (s.scored, s.infra_failed, s.correct) == (4, 0, 2)


def test_larger_limit_runs_only_the_new_items(tmp_path: Path) -> None:
    bench = write_bench(tmp_path / "capitals.json", 6)
    run(tmp_path, bench, paris_agent(), limit=2)
    more = paris_agent()
    report, _ = run(tmp_path, bench, more, limit=5)
    assert [q.split(":")[0] for q in more.asked] == ["Q2", "Q3", "Q4"]
    assert report.summaries["capitals"].scored == 5
    assert len(lines(tmp_path)) == 5


def test_changed_config_in_the_same_directory_is_refused(tmp_path: Path) -> None:
    bench = write_bench(tmp_path / "capitals.json", 2)
    run(tmp_path, bench, paris_agent())
    changed = bundled_flow_config().model_copy(update={"limits": LimitsConfig(max_turns=5)})
    settings = EvalSettings(benches=[str(bench)], out=tmp_path / "out")
    with pytest.raises(ConfigError, match=r"(?s)different configuration.*flow.limits.max_turns: 1 -> 5"):
        run_eval(settings, console=Console(file=io.StringIO()), solver=paris_agent(), flow_config=changed)
    assert len(lines(tmp_path)) == 2


def test_every_difference_is_listed_tools_servers_engines_and_nested_keys(tmp_path: Path) -> None:
    """Regression (issue 19): removing a tool enabled as `python: {}` listed no difference at all."""
    bench = write_bench(tmp_path / "capitals.json", 2)
    base = bundled_flow_config().model_dump(mode="json")
    run_eval(EvalSettings(benches=[str(bench)], out=tmp_path / "out"), console=Console(file=io.StringIO()),
             solver=paris_agent(), flow_config=FlowConfig.from_dict(base))
    changed = json.loads(json.dumps(base))
    del changed["tools"]["python"]
    changed["tools"]["wikipedia_search"] = {"top_k": 5}
    changed["mcp_servers"] = {"clock": {"command": "mcp-server-time"}}
    changed["engines"]["policy"] = {"kind": "transformers", "adapter": "runs/demo/final/adapter"}
    changed["roles"]["planner"]["engine"] = "policy"
    changed["roles"]["generator"]["sampling"]["max_tokens"] = 99
    settings = EvalSettings(benches=[str(bench)], out=tmp_path / "out")
    with pytest.raises(ConfigError) as refused:
        run_eval(settings, console=Console(file=io.StringIO()), solver=paris_agent(),
                 flow_config=FlowConfig.from_dict(changed))
    listed = str(refused.value).split("Differences:")[1]
    assert "flow.tools: removed python" in listed
    assert "flow.tools.wikipedia_search.top_k: '<absent>' -> 5" in listed
    assert "flow.mcp_servers: added clock" in listed
    assert "flow.engines: added policy" in listed                     # the adapter's engine
    assert "flow.roles.planner.engine: 'default' -> 'policy'" in listed
    assert "flow.roles.generator.sampling.max_tokens: 64 -> 99" in listed
    assert len(lines(tmp_path)) == 2


def test_a_directory_without_results_blocks_nothing(tmp_path: Path) -> None:
    """A run that stopped before its first item (a tool that is not set up) left config.json and
    summary.json; another configuration may use the directory."""
    from tests.eval.fake_agents import broken_setup_agent

    bench = write_bench(tmp_path / "capitals.json", 2)
    with pytest.raises(ConfigError, match="index missing"):
        run(tmp_path, bench, broken_setup_agent(None))
    assert (tmp_path / "out" / "config.json").is_file() and (tmp_path / "out" / "summary.json").is_file()
    write_bench(bench, 3)                                              # other data, too
    report = run_eval(EvalSettings(benches=[str(bench)], out=tmp_path / "out"), console=Console(file=io.StringIO()),
                      solver=paris_agent(), flow_config=FlowConfig.from_dict({"limits": {"max_turns": 2}}))
    assert report.summaries["capitals"].scored == 3
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["fingerprint"] == report.fingerprint and len(config["invocations"]) == 1


def test_changed_benchmark_data_in_the_same_directory_is_refused(tmp_path: Path) -> None:
    bench = write_bench(tmp_path / "capitals.json", 2)
    run(tmp_path, bench, paris_agent())
    write_bench(bench, 3)
    with pytest.raises(ConfigError, match="other data or another scorer"):
        run(tmp_path, bench, paris_agent())


def test_default_directory_is_named_after_the_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    bench = write_bench(tmp_path / "capitals.json", 1)
    settings = EvalSettings(benches=[str(bench)])
    first = run_eval(settings, console=Console(file=io.StringIO()), solver=paris_agent())
    other = run_eval(settings, console=Console(file=io.StringIO()), solver=paris_agent(),
                     flow_config=FlowConfig.from_dict({"limits": {"max_turns": 2}}))
    assert first.out == Path("runs/eval") / first.fingerprint[:12]
    assert first.out != other.out and (tmp_path / first.out / "results.jsonl").is_file()


def test_concurrency_is_bounded_and_used(tmp_path: Path) -> None:
    bench = write_bench(tmp_path / "capitals.json", 12)
    agent = paris_agent(delay_s=0.05)
    run(tmp_path, bench, agent, concurrency=3)
    assert agent.peak == 3
    serial = paris_agent(delay_s=0.01)
    run(tmp_path / "serial", bench, serial, concurrency=1)
    assert serial.peak == 1


def test_several_benchmarks_share_one_directory(tmp_path: Path) -> None:
    a = write_bench(tmp_path / "alpha.json", 3)
    b = write_bench(tmp_path / "beta.json", 2)
    console = Console(file=io.StringIO())
    run_eval(EvalSettings(benches=[str(a)], out=tmp_path / "out"), console=console, solver=paris_agent())
    report = run_eval(EvalSettings(benches=[str(b)], out=tmp_path / "out"), console=console, solver=paris_agent())
    assert list(report.summaries) == ["beta"]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["benchmarks"]
    assert set(summary) == {"alpha", "beta"} and summary["alpha"]["scored"] == 3


def test_agent_that_hangs_is_cut_by_the_watchdog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agentflow.eval.runner.WATCHDOG_GRACE_S", 0.0)
    bench = write_bench(tmp_path / "capitals.json", 1)
    config = FlowConfig.from_dict({"limits": {"max_seconds": 0.1}})
    report = run_eval(EvalSettings(benches=[str(bench)], out=tmp_path / "out"), console=Console(file=io.StringIO()),
                      solver=paris_agent(delay_s=5), flow_config=config)
    assert report.summaries["capitals"].failure_reasons == {"eval_watchdog": 1}


def test_the_watchdog_allows_the_wall_time_that_sharing_the_engines_takes(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Four items at once: an item whose wall time passes `max_seconds` (its engines served the others too)
    is scored, not called hung; one that takes more than four times as long still is."""
    monkeypatch.setattr("agentflow.eval.runner.WATCHDOG_GRACE_S", 0.0)
    bench = write_bench(tmp_path / "capitals.json", 1)
    config = FlowConfig.from_dict({"limits": {"max_seconds": 0.2}})
    settings = EvalSettings(benches=[str(bench)], out=tmp_path / "out", concurrency=4)
    report = run_eval(settings, console=Console(file=io.StringIO()), solver=paris_agent(delay_s=0.4),
                      flow_config=config)
    assert report.summaries["capitals"].failure_reasons == {} and report.summaries["capitals"].scored == 1
    settings = EvalSettings(benches=[str(bench)], out=tmp_path / "out2", concurrency=4)
    report = run_eval(settings, console=Console(file=io.StringIO()), solver=paris_agent(delay_s=2),
                      flow_config=config)
    assert report.summaries["capitals"].failure_reasons == {"eval_watchdog": 1}


def test_scorer_crash_is_not_a_wrong_answer(tmp_path: Path) -> None:
    bench = tmp_path / "sums.json"
    bench.write_text(json.dumps([{"question": "1+1?", "answer": "two"}]))   # gold math-verify cannot parse
    report, _ = run(tmp_path, bench, paris_agent(), scorer="math")
    assert report.summaries["sums"].failure_reasons == {"scorer_error": 1}


def test_tool_set_up_error_stops_the_run_before_any_item(tmp_path: Path) -> None:
    from tests.eval.fake_agents import broken_setup_agent

    bench = write_bench(tmp_path / "capitals.json", 3)
    with pytest.raises(ConfigError, match="index missing"):
        run(tmp_path, bench, broken_setup_agent(None))
    assert not (tmp_path / "out" / "results.jsonl").exists()


def test_judge_verdict_is_recorded_beside_the_rule_score(tmp_path: Path) -> None:
    bench = write_bench(tmp_path / "capitals.json", 2)
    engine = ScriptedEngine(["CORRECT"], model_name="judge-model-2024-01-01")
    judge = LLMJudge(engine, cache=VerdictCache(tmp_path / "judge.sqlite"))
    console = Console(file=io.StringIO())
    report = run_eval(EvalSettings(benches=[str(bench)], out=tmp_path / "out"), console=console,
                      solver=paris_agent(), judge=judge)
    by_id = {r["id"]: r for r in lines(tmp_path)}
    assert by_id["capitals:1:1"]["correct"] is False                  # the rule-based verdict stands
    assert by_id["capitals:1:1"]["judge"]["correct"] is True          # the judge's is beside it
    assert by_id["capitals:1:1"]["judge"]["model"] == "judge-model-2024-01-01"
    s = report.summaries["capitals"]
    assert s.accuracy == pytest.approx(0.5) and s.judge_accuracy == pytest.approx(1.0)
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["identity"]["judge"]["model"] == "judge-model-2024-01-01"


async def test_runs_a_real_flow_on_a_scripted_engine(tmp_path: Path, make_flow) -> None:
    from tests.conftest import role_engine
    from tests.test_flow import STOP, plan

    engine = role_engine(planner=[plan("echo")], executor=['{"query": "Paris"}'], verifier=[STOP],
                         generator=["It is Paris. <answer>Paris</answer>"])
    flow = make_flow(engine)
    bench = write_bench(tmp_path / "capitals.json", 2)
    run_ = EvalRun(EvalSettings(benches=[str(bench)], out=tmp_path / "out", concurrency=2),
                   console=Console(file=io.StringIO()), solver=flow, flow_config=flow.config)
    report = await run_.run()
    records = {r["id"]: r for r in lines(tmp_path)}
    assert records["capitals:0:0"]["prediction"] == "Paris" and records["capitals:0:0"]["correct"] is True
    assert records["capitals:1:1"]["correct"] is False
    assert records["capitals:0:0"]["tools"] == {"echo": 1}
    assert records["capitals:0:0"]["tokens"]["calls"] >= 4
    assert report.summaries["capitals"].scored == 2


def test_a_second_writer_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    bench = write_bench(tmp_path / "capitals.json", 4)

    async def both() -> None:
        first = EvalRun(EvalSettings(benches=[str(bench)], out=tmp_path / "out"),
                        console=Console(file=io.StringIO()), solver=paris_agent(delay_s=0.2))
        second = EvalRun(EvalSettings(benches=[str(bench)], out=tmp_path / "out"),
                         console=Console(file=io.StringIO()), solver=paris_agent())
        task = asyncio.create_task(first.run())
        await asyncio.sleep(0.05)
        with pytest.raises(ConfigError, match="another `agentflow eval`"):
            await second.run()
        await task

    asyncio.run(both())
    assert len(lines(tmp_path)) == 4


def test_a_lone_surrogate_in_an_answer_is_recorded_not_a_crash(tmp_path: Path) -> None:
    bench = write_bench(tmp_path / "capitals.json", 3, markers={1: "EMOJI"})
    agent = FakeAgent(lambda q: "Paris \ud83d" if "EMOJI" in q else "Paris")  # half an emoji, cut by max_tokens
    report, _ = run(tmp_path, bench, agent)
    by_id = {r["id"]: r for r in lines(tmp_path)}
    assert len(by_id) == 3 and by_id["capitals:1:1"]["prediction"] == "Paris \ufffd"
    written = json.loads((tmp_path / "out" / by_id["capitals:1:1"]["trajectory"]).read_text(encoding="utf-8"))
    assert written["answer"] == "Paris \ufffd"


def test_an_item_failing_outside_the_agent_is_recorded_and_the_run_goes_on(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from agentflow.trajectory import Trajectory

    write = Trajectory.write

    def failing_write(self: Trajectory, path: Path) -> None:
        if "NOWRITE" in self.question:
            raise OSError("No space left on device")
        write(self, path)

    monkeypatch.setattr(Trajectory, "write", failing_write)
    bench = write_bench(tmp_path / "capitals.json", 4, markers={2: "NOWRITE"})
    report, _ = run(tmp_path, bench, paris_agent())
    by_id = {r["id"]: r for r in lines(tmp_path)}
    assert by_id["capitals:2:2"]["status"] == "infra_error"
    assert by_id["capitals:2:2"]["error"] == {"kind": "internal_error", "stage": "eval",
                                              "message": "OSError: No space left on device"}
    assert report.summaries["capitals"].scored == 3
