"""Control flow of the four-module loop, on a scripted engine."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from agentflow.clock import waiting_for_capacity
from agentflow.config import FlowConfig
from agentflow.engines.base import Engine
from agentflow.errors import ConfigError, EngineContextOverflowError, EngineServerError, EngineUnavailableError
from agentflow.flow import Flow
from agentflow.planner import PLANNER_SYSTEM_TOOL_LAST
from agentflow.tools.base import ToolSettings
from agentflow.trajectory import Trajectory
from tests.conftest import AskTool, EchoTool, role_engine, role_of


def plan(tool: str, sub_goal: str = "look it up") -> str:
    return json.dumps({"context": "c", "sub_goal": sub_goal, "tool_name": tool})


STOP = '{"analysis": "enough", "conclusion": "STOP"}'
CONTINUE = '{"analysis": "need more", "conclusion": "CONTINUE"}'


async def test_one_turn_then_stop_records_everything(make_flow):
    engine = role_engine(analysis=["needs a lookup"], planner=[plan("echo")],
                         executor=['{"query": "Seurat"}'], verifier=[STOP],
                         generator=["He was born in 1859. <answer>1859</answer>"])
    events: list[tuple[str, dict]] = []
    traj = await make_flow(engine).asolve("  When was Seurat born?  ", on_event=lambda k, p: events.append((k, p)))
    assert traj.question == "When was Seurat born?"
    assert traj.answer == "1859"
    assert traj.stop_reason == "verifier_stop"
    assert [t.tool for t in traj.turns] == ["echo"]
    turn = traj.turns[0]
    assert turn.verdict == "STOP" and turn.tool_valid
    assert turn.tool_call.arguments == {"query": "Seurat"} and turn.tool_call.output == "echo: Seurat"
    assert traj.query_analysis == "needs a lookup"
    assert [k for k, _ in events] == ["analysis", "plan", "tool", "verdict", "answer"]
    assert traj.failures == []
    # the planner saw the memory of nothing yet; the generator saw the tool result
    assert "(no steps yet)" in turn.planner.messages[1]["content"]
    assert "echo: Seurat" in traj.generator.messages[1]["content"]
    assert traj.usage.calls == 5
    # constrained decoding asked for: the planner's schema restricts tool_name to enabled tools
    planner_schema = [s for m, _, s in engine.calls if role_of(m) == "planner"][0]
    assert planner_schema["properties"]["tool_name"]["enum"] == ["echo", "ask"]
    data = json.loads(traj.model_dump_json())
    assert {"question", "answer", "turns"} <= data.keys() and {"tool", "verdict"} <= data["turns"][0].keys()


async def test_memory_carries_results_between_turns_until_max_turns(make_flow):
    engine = role_engine(planner=[plan("echo", "first"), plan("echo", "second")],
                         executor=['{"query": "one"}', '{"query": "two"}'], verifier=[CONTINUE],
                         generator=["<answer>two</answer>"])
    traj = await make_flow(engine, max_turns=2).asolve("q")
    assert traj.stop_reason == "max_turns" and len(traj.turns) == 2
    second_prompt = traj.turns[1].planner.messages[1]["content"]
    assert "echo: one" in second_prompt and "Step 2 of 2" in second_prompt


async def test_invalid_tool_is_a_recorded_turn_not_a_crash(make_flow):
    engine = role_engine(planner=[plan("Google_Search_Tool")], verifier=[STOP], generator=["<answer>x</answer>"])
    traj = await make_flow(engine).asolve("q")
    turn = traj.turns[0]
    assert turn.tool == "Google_Search_Tool" and not turn.tool_valid and turn.tool_call is None
    assert [f.kind for f in traj.failures] == ["invalid_tool"]
    assert "choose one of: echo, ask" in traj.generator.messages[1]["content"]
    assert traj.answer == "x"


@pytest.mark.parametrize("reply", ["", "I think we should search", '{"context": "c", "sub_goal": "s", "tool_na'])
async def test_empty_free_form_or_truncated_planner_reply(make_flow, reply):
    engine = role_engine(planner=[reply], verifier=[STOP], generator=["<answer>a</answer>"])
    traj = await make_flow(engine).asolve("q")
    assert traj.turns[0].tool_valid is False
    assert traj.answer == "a"


async def test_free_form_planner_reply_naming_one_tool_is_used(make_flow):
    engine = role_engine(planner=["Sub-goal: find the year\nTool: echo"], executor=['{"query": "y"}'],
                         verifier=[STOP], generator=["<answer>a</answer>"])
    traj = await make_flow(engine).asolve("q")
    assert traj.turns[0].tool == "echo" and traj.turns[0].sub_goal == "find the year"
    assert traj.turns[0].tool_call.output == "echo: y"


async def test_direct_tool_input_skips_the_executor_model():
    engine = role_engine(planner=[plan("echo", "Seurat birth year")], executor=['{"query": "not used"}'],
                         verifier=[STOP], generator=["<answer>a</answer>"])
    config = FlowConfig.from_dict({"tools": {"echo": {}}, "direct_tool_input": True})
    flow = Flow.from_config(config, engines={"default": engine}, tools={"echo": EchoTool()})
    traj = await flow.asolve("q")
    turn = traj.turns[0]
    assert turn.executor is None and turn.tool_call.arguments == {"query": "Seurat birth year"}
    assert turn.tool_call.output == "echo: Seurat birth year" and traj.failures == []
    assert "executor" not in [role_of(messages) for messages, *_ in engine.calls]


async def test_a_fixed_tool_input_skips_the_executor_and_names_the_question_and_sub_goal():
    engine = role_engine(planner=[plan("echo", "the year")], executor=['{"query": "not used"}'],
                         verifier=[STOP], generator=["<answer>a</answer>"])
    config = FlowConfig.from_dict({"tools": {"echo": {"input": {"query": "{question} / {sub_goal} / {kept}"}}}})
    echo = EchoTool(ToolSettings(**config.tools["echo"]))
    flow = Flow.from_config(config, engines={"default": engine}, tools={"echo": echo})
    traj = await flow.asolve("When was Seurat born?")
    turn = traj.turns[0]
    assert turn.executor is None and turn.tool_call.arguments == {"query": "When was Seurat born? / the year / {kept}"}
    # the input is configuration, not a choice: later prompts show the result only
    assert "result: echo: When was Seurat born?" in traj.generator.messages[1]["content"]
    assert "input:" not in traj.generator.messages[1]["content"]
    assert "executor" not in [role_of(messages) for messages, *_ in engine.calls]


async def test_verify_false_runs_max_turns_without_asking_the_verifier():
    engine = role_engine(planner=[plan("echo", "one"), plan("echo", "two")], executor=['{"query": "x"}'],
                         verifier=[STOP], generator=["<answer>a</answer>"])
    config = FlowConfig.from_dict({"tools": {"echo": {}}, "verify": False, "limits": {"max_turns": 2}})
    flow = Flow.from_config(config, engines={"default": engine}, tools={"echo": EchoTool()})
    traj = await flow.asolve("q")
    assert traj.stop_reason == "max_turns" and len(traj.turns) == 2
    assert "verifier" not in [role_of(messages) for messages, *_ in engine.calls]


@pytest.mark.parametrize("shown", [True, False])
async def test_executor_memory_shows_the_executor_the_earlier_results(shown: bool):
    engine = role_engine(planner=[plan("echo", "one"), plan("echo", "two")],
                         executor=['{"query": "first result"}', '{"query": "second"}'], verifier=[CONTINUE],
                         generator=["<answer>a</answer>"])
    config = FlowConfig.from_dict({"tools": {"echo": {}}, "executor_memory": shown, "limits": {"max_turns": 2}})
    flow = Flow.from_config(config, engines={"default": engine}, tools={"echo": EchoTool()})
    traj = await flow.asolve("q")
    second = traj.turns[1].executor.messages[-1]["content"]
    assert ("echo: first result" in second) is shown and "echo: first result" not in \
        traj.turns[0].executor.messages[-1]["content"]


async def test_a_copied_worked_example_is_not_used():
    example = {"question": "When was Chopin born?", "sub_goal": "find it", "input": {"query": "Chopin birth"}}
    engine = role_engine(planner=[plan("echo", "Seurat birth")], executor=['{"query": "Chopin birth"}'],
                         verifier=[STOP], generator=["<answer>a</answer>"])
    config = FlowConfig.from_dict({"tools": {"echo": {"examples": [example]}}})
    echo = EchoTool(ToolSettings(**config.tools["echo"]))
    flow = Flow.from_config(config, engines={"default": engine}, tools={"echo": echo})
    traj = await flow.asolve("When was Seurat born?")
    executor = traj.turns[0].executor.messages
    assert executor[1]["content"].endswith("Write the JSON input for echo.") and \
        executor[2]["content"] == '{"query": "Chopin birth"}'  # the configured example, as a prior exchange
    assert [f.kind for f in traj.failures] == ["copied_example", "executor_fallback"]
    assert traj.turns[0].tool_call.arguments == {"query": "Seurat birth"}


async def test_unusable_executor_reply_falls_back_to_the_sub_goal(make_flow):
    engine = role_engine(planner=[plan("echo", "Seurat birth year")], executor=["no json here"],
                         verifier=[STOP], generator=["<answer>a</answer>"])
    traj = await make_flow(engine).asolve("q")
    assert traj.turns[0].tool_call.arguments == {"query": "Seurat birth year"}
    assert [f.kind for f in traj.failures] == ["executor_fallback"]


class EndsAtLimit(Engine):
    """The scripted engine, its executor replies reported as ended by the token limit (finish_reason length)."""

    supports_json_schema = True

    def __init__(self, inner: Engine, *, cut: bool) -> None:
        self.inner, self.cut, self.model_name = inner, cut, "scripted"

    async def generate(self, messages, sampling, *, json_schema=None):
        completion = await self.inner.generate(messages, sampling, json_schema=json_schema)
        return completion.model_copy(update={"finish_reason": "length"}) \
            if self.cut and role_of(messages) == "executor" else completion


@pytest.mark.parametrize("cut", [True, False])
async def test_an_executor_reply_cut_by_its_token_limit_keeps_what_it_wrote(make_flow, cut: bool):
    """A small model writes the right call and runs on inside the string until the limit: read up to the cut.
    The same broken JSON from a reply that ended on its own is not repaired: the sub-goal fills in."""
    engine = role_engine(planner=[plan("echo", "Seurat birth year")],
                         executor=['{"query": "Seurat born 1859 1859 1859 1859 18'],
                         verifier=[STOP], generator=["<answer>a</answer>"])
    traj = await make_flow(EndsAtLimit(engine, cut=cut)).asolve("q")
    if cut:
        assert traj.turns[0].tool_call.arguments == {"query": "Seurat born 1859 1859 1859 1859 18"}
        assert [f.kind for f in traj.failures] == ["executor_cut"]
    else:
        assert traj.turns[0].tool_call.arguments == {"query": "Seurat birth year"}
        assert [f.kind for f in traj.failures] == ["executor_fallback"]


@pytest.mark.parametrize(("query", "kind"), [("fail", "tool"), ("crash", "tool"), ("hang", "tool_timeout")])
async def test_failing_tool_is_recorded_and_the_flow_goes_on(make_flow, query, kind):
    engine = role_engine(planner=[plan("echo"), plan("echo")], executor=[json.dumps({"query": query}),
                         '{"query": "ok"}'], verifier=[CONTINUE, STOP], generator=["<answer>a</answer>"])
    traj = await make_flow(engine, tool_timeout_s=0.2).asolve("q")
    assert traj.turns[0].tool_call.error.kind == kind
    assert traj.turns[1].tool_call.output == "echo: ok"
    assert traj.answer == "a" and traj.infrastructure_failure is None


async def test_unparseable_verdict_continues_until_the_budget(make_flow):
    engine = role_engine(planner=[plan("echo")], executor=['{"query": "x"}'], verifier=["hmm, maybe"],
                         generator=["<answer>a</answer>"])
    traj = await make_flow(engine, max_turns=3).asolve("q")
    assert [t.verdict for t in traj.turns] == ["CONTINUE"] * 3
    assert all(not t.verdict_parsed for t in traj.turns)
    assert traj.stop_reason == "max_turns"


async def test_engine_failure_is_an_infrastructure_failure_with_finished_work_kept(make_flow):
    engine = role_engine(planner=[plan("echo"), EngineServerError("HTTP 500")], executor=['{"query": "x"}'],
                         verifier=[CONTINUE])
    traj = await make_flow(engine).asolve("q")
    assert traj.stop_reason == "error" and traj.answer == ""
    failure = traj.infrastructure_failure
    assert failure is not None and failure.kind == "engine_server_error" and failure.stage == "planner"
    assert traj.turns[0].tool_call.output == "echo: x"  # the finished turn is kept


async def test_engine_failure_inside_a_tool_is_infrastructure(make_flow):
    engine = role_engine(planner=[plan("ask")], executor=['{"query": "hi"}'],
                         tools=[EngineUnavailableError("connection refused")])
    traj = await make_flow(engine).asolve("q")
    assert traj.infrastructure_failure.kind == "engine_unavailable"


async def test_question_timeout_cuts_a_hung_engine_and_still_answers(make_flow):
    async def never(messages):  # pragma: no cover - cancelled
        await asyncio.sleep(60)

    engine = role_engine(planner=[plan("echo")], executor=['{"query": "x"}'], generator=["<answer>late</answer>"])
    flow = make_flow(engine, max_seconds=0.4)
    engine.delay_s = 0.0
    original = engine.generate

    async def slow_verifier(messages, sampling, *, json_schema=None):
        if role_of(messages) == "verifier":
            await asyncio.sleep(60)
        return await original(messages, sampling, json_schema=json_schema)

    engine.generate = slow_verifier  # type: ignore[method-assign]
    traj = await asyncio.wait_for(flow.asolve("q"), timeout=5)
    assert traj.stop_reason == "timeout"
    assert traj.answer == "late" and traj.seconds < 1.0
    assert traj.turns[0].tool_call.output == "echo: x"
    # Regression: a time-out was excluded as infrastructure, so a policy that ran out the clock was never
    # penalised. Waits for a shared engine do not count against the limit (next test), so what remains is
    # the flow's own time: scored like any other answer.
    (failure,) = [f for f in traj.failures if f.kind == "question_timeout"]
    assert not failure.infrastructure and traj.infrastructure_failure is None


async def test_time_waiting_for_a_shared_engine_does_not_count_against_the_limit(make_flow):
    """Six questions share an engine that serves one request at a time: the last waits ~3 s for capacity,
    more than its 1 s budget, yet none is cut off; the queue time is recorded."""

    class OneAtATime(Engine):
        supports_json_schema = True

        def __init__(self, inner: Engine) -> None:
            self.inner, self.gate = inner, asyncio.Semaphore(1)

        async def generate(self, messages, sampling, *, json_schema=None):
            with waiting_for_capacity():
                await self.gate.acquire()
            try:
                await asyncio.sleep(0.1)
                return await self.inner.generate(messages, sampling, json_schema=json_schema)
            finally:
                self.gate.release()

    inner = role_engine(planner=[plan("echo")], executor=['{"query": "x"}'], verifier=[STOP],
                        generator=["<answer>a</answer>"])
    flow = make_flow(OneAtATime(inner), max_seconds=1.0)
    trajectories = await asyncio.gather(*(flow.asolve(f"q{i}") for i in range(6)))
    assert [t.stop_reason for t in trajectories] == ["verifier_stop"] * 6
    assert max(t.seconds for t in trajectories) > 1.5
    assert max(t.queue_seconds for t in trajectories) > 1.0


async def test_context_overflow_is_the_policys_failure_not_infrastructure(make_flow):
    engine = role_engine(planner=[plan("echo")], executor=['{"query": "x"}'],
                         verifier=[EngineContextOverflowError("prompt (9000 tokens) exceeds the context")])
    traj = await make_flow(engine).asolve("q")
    assert traj.stop_reason == "error" and traj.infrastructure_failure is None
    assert [f.kind for f in traj.failures] == ["context_overflow"]


async def test_empty_question_is_refused(make_flow):
    with pytest.raises(ValueError, match="empty"):
        await make_flow(role_engine()).asolve("   ")


async def test_concurrent_questions_do_not_share_memory(make_flow):
    def executor(messages):
        return json.dumps({"query": re.search(r"Question: (.*)", messages[-1]["content"]).group(1)})

    engine = role_engine(planner=[plan("echo")], executor=[executor], verifier=[STOP],
                         generator=[lambda m: "<answer>" + re.search(r"Question: .*", m[1]["content"]).group(0)
                                    + "</answer>"])
    flow = make_flow(engine)
    trajs: list[Trajectory] = await asyncio.gather(*(flow.asolve(f"question {i}") for i in range(20)))
    for i, traj in enumerate(trajs):
        assert traj.answer == f"Question: question {i}"
        assert traj.turns[0].tool_call.output == f"echo: question {i}"


async def test_role_settings_are_the_ones_sent_and_recorded(make_flow):
    engine = role_engine(planner=[plan("echo")], executor=['{"query": "x"}'], verifier=[STOP])
    flow = make_flow(engine)
    flow.config.roles.planner.sampling.temperature = 0.7
    flow.config.roles.planner.sampling.max_tokens = 77
    traj = await flow.asolve("q")
    sent = [s for m, s, _ in engine.calls if role_of(m) == "planner"][0]
    assert (sent.temperature, sent.max_tokens) == (0.7, 77)
    assert traj.turns[0].planner.sampling.temperature == 0.7
    assert traj.roles["planner"]["sampling"]["max_tokens"] == 77


async def test_tool_check_failure_is_a_clear_config_error(make_flow):
    from tests.conftest import EchoTool

    class Unconfigured(EchoTool):
        name = "unconfigured"

        async def check(self) -> None:
            raise ConfigError("unconfigured: set FOO_API_KEY")

    with pytest.raises(ConfigError, match="FOO_API_KEY"):
        await make_flow(role_engine(), tools=[Unconfigured()]).asolve("q")


def _menu_order(messages: list[dict[str, str]]) -> list[str]:
    tools_part = messages[1]["content"].split("Tools:\n")[1].split("\n\n")[0]
    return [line[2:].split(":")[0] for line in tools_part.splitlines()]


async def test_shuffle_tools_orders_the_menu_by_question_variant_and_turn():
    names = [f"tool_{i}" for i in range(4)]
    tools = {name: type(f"Echo{i}", (EchoTool,), {"name": name})() for i, name in enumerate(names)}

    async def menus(shuffle: bool, variants: range, question: str = "q") -> list[list[str]]:
        engine = role_engine(planner=[plan("tool_0")], verifier=[STOP], generator=["<answer>a</answer>"])
        config = FlowConfig.from_dict({"tools": {n: {} for n in names}, "shuffle_tools": shuffle,
                                       "query_analysis": False})
        flow = Flow.from_config(config, engines={"default": engine}, tools=tools)
        trajectories = [await flow.asolve(question, variant=v) for v in variants]
        assert [t.variant for t in trajectories] == list(variants)
        # the turn keeps the order its planner was shown (what `menu_position` metrics read)
        assert all(t.turns[0].menu == _menu_order(t.turns[0].planner.messages) for t in trajectories)
        return [_menu_order(t.turns[0].planner.messages) for t in trajectories]

    assert await menus(False, range(5)) == [names] * 5
    shuffled = await menus(True, range(12))
    assert all(sorted(order) == names for order in shuffled)
    assert len({tuple(order) for order in shuffled}) >= 4  # variants see different orders
    assert len({order[0] for order in shuffled}) >= 3  # and different tools first
    assert await menus(True, range(12)) == shuffled  # fixed by (question, variant, turn): evaluations repeat
    assert await menus(True, range(12), question="another q") != shuffled


async def test_a_failed_programs_exception_reaches_later_prompts_within_result_chars():
    from agentflow.tools.base import create_tool

    engine = role_engine(planner=[plan("python")], executor=['{"code": "x = 1\\nprint(cera * 4)"}'],
                         verifier=[STOP], generator=["<answer>a</answer>"])
    config = FlowConfig.from_dict({"tools": {"python": {}}, "query_analysis": False,
                                   "limits": {"result_chars": 100}})
    flow = Flow.from_config(config, engines={"default": engine}, tools={"python": create_tool("python")})
    traj = await flow.asolve("What is the atomic number of cerium times 4?")
    assert traj.turns[0].tool_call.output.startswith("Error: the code failed (exit code 1): NameError")
    prompt = traj.generator.messages[-1]["content"]
    assert "Steps taken:" in prompt and prompt.count("NameError: name 'cera' is not defined") == 2  # memory, latest


# -- hostile replies (issue 11): each of these left a trajectory that could not be saved, or flooded prompts --

def saved_and_reloaded(traj: Trajectory, tmp_path) -> Trajectory:
    traj.write(tmp_path / "t.json")
    return Trajectory.model_validate_json((tmp_path / "t.json").read_text(encoding="utf-8"))


async def test_lone_surrogates_in_replies_leave_a_trajectory_that_saves(make_flow, tmp_path):
    # half an emoji as raw text, and as the JSON escape a model cut off by max_tokens writes
    engine = role_engine(analysis=["needs \ud83d"], planner=['{"tool_name": "echo", "sub_goal": "find \\ud83d"}'],
                         executor=['{"query": "x \ud83d"}'], verifier=[STOP], generator=["<answer>\ude00</answer>"])
    traj = await make_flow(engine).asolve("q \udcff")  # argv's undecodable bytes arrive as lone surrogates
    reloaded = saved_and_reloaded(traj, tmp_path)
    assert reloaded == traj
    assert (traj.question, traj.turns[0].sub_goal, traj.answer) == ("q \ufffd", "find \ufffd", "\ufffd")
    assert traj.turns[0].tool_call.output == "echo: x \ufffd"


async def test_arguments_nested_past_the_serialisers_depth_are_not_taken(make_flow, tmp_path):
    nested = '{"query": ' + "[" * 300 + '"x"' + "]" * 300 + "}"  # parsed, then not writable
    # no sub-goal to fall back on: the arguments as parsed used to stay in the record
    engine = role_engine(planner=[plan("echo", "")], executor=[nested], verifier=[STOP],
                         generator=["<answer>a</answer>"])
    traj = await make_flow(engine).asolve("q")
    assert saved_and_reloaded(traj, tmp_path) == traj
    assert traj.turns[0].tool_call.arguments == {}
    assert [f.kind for f in traj.failures] == ["tool_input"]


async def test_a_huge_reply_is_kept_whole_but_bounded_in_every_later_prompt(make_flow, tmp_path):
    huge = "x" * 100_000
    engine = role_engine(analysis=[huge], planner=[plan("echo", huge), plan("nonexistent_" + huge)],
                         executor=[json.dumps({"query": huge})], verifier=[CONTINUE],
                         generator=["<answer>a</answer>"])
    traj = await make_flow(engine, max_turns=3).asolve("q")
    assert len(traj.query_analysis) == 100_000 and len(traj.turns[0].sub_goal) == 100_000
    assert len(traj.turns[0].tool_call.output) > 100_000
    prompts = [m["content"] for call in [traj.generator] + [c for t in traj.turns for c in (t.planner, t.verifier)]
               for m in call.messages]
    assert max(map(len, prompts)) < 12_000
    assert saved_and_reloaded(traj, tmp_path) == traj


@pytest.mark.parametrize("named", [True, False])
async def test_planner_memory_can_leave_out_the_tool_names(named: bool):
    engine = role_engine(planner=[plan("echo", "one"), plan("echo", "two")], executor=['{"query": "found"}'],
                         verifier=[CONTINUE], generator=["<answer>a</answer>"])
    config = FlowConfig.from_dict({"tools": {"echo": {}}, "planner_memory_tools": named, "limits": {"max_turns": 2}})
    flow = Flow.from_config(config, engines={"default": engine}, tools={"echo": EchoTool()})
    traj = await flow.asolve("q")
    second = traj.turns[1].planner.messages[1]["content"]
    assert "result: echo: found" in second and ("tool=echo" in second) is named
    assert "tool=echo" in traj.generator.messages[1]["content"]  # the other roles still see it


async def test_a_tool_last_planner_is_asked_for_its_tool_after_its_sub_goal():
    engine = role_engine(planner=['{"context": "c", "sub_goal": "find it", "tool_name": "echo"}'],
                         executor=['{"query": "found"}'], verifier=[STOP], generator=["<answer>a</answer>"])
    config = FlowConfig.from_dict({"tools": {"echo": {}}, "planner_tool_last": True})
    traj = await Flow.from_config(config, engines={"default": engine}, tools={"echo": EchoTool()}).asolve("q")
    call = traj.turns[0].planner
    assert list(call.response_schema["properties"]) == ["context", "sub_goal", "tool_name"]
    assert call.messages[0]["content"] == PLANNER_SYSTEM_TOOL_LAST
    assert (traj.turns[0].tool, traj.turns[0].sub_goal, traj.answer) == ("echo", "find it", "a")


async def test_a_looping_answer_and_sub_goal_are_cut_after_their_first_copy(make_flow):
    engine = role_engine(planner=[plan("echo", "look it up. " * 10)], executor=['{"query": "x"}'], verifier=[STOP],
                         generator=["<answer>" + "Seurat was born in 1859. " * 9 + "Seurat was"])
    traj = await make_flow(engine).asolve("When was Seurat born?")
    assert traj.answer == "Seurat was born in 1859." and traj.turns[0].sub_goal == "look it up."
    assert traj.generator.text.count("1859") == 9  # the model's reply itself is recorded as it came


def stopping_flow(engine, **settings) -> Flow:
    tools = [EchoTool(), AskTool()]
    config = FlowConfig.from_dict({"tools": {t.name: {} for t in tools}, "planner_stop": True,
                                   "limits": {"max_turns": 3, "plan_chars": 60}, **settings})
    return Flow.from_config(config, engines={"default": engine}, tools={t.name: t for t in tools})


async def test_the_planners_stop_action_ends_the_loop_after_the_tools_it_needed():
    engine = role_engine(analysis=["a"], planner=[plan("echo"), plan("answer", "done")],
                         executor=['{"query": "Seurat"}'], verifier=[CONTINUE], generator=["<answer>1859</answer>"])
    traj = await stopping_flow(engine).asolve("When was Seurat born?")
    assert traj.stop_reason == "planner_stop" and traj.answer == "1859"
    assert [t.tool for t in traj.turns] == ["echo", "answer"] and traj.turns[1].tool_valid
    stop = traj.turns[1]
    assert stop.tool_call is None and stop.executor is None and stop.verifier is None and stop.verdict is None
    assert len(traj.planner_calls()) == 2  # the stop is a planner decision: a training row like any other
    schema = [s for m, _, s in engine.calls if role_of(m) == "planner"][0]
    assert schema["properties"]["tool_name"]["enum"] == ["echo", "ask", "answer"]
    assert schema["properties"]["sub_goal"]["maxLength"] == 60  # limits.plan_chars
    menu = traj.turns[0].planner.messages[1]["content"]
    assert "- answer: stop using tools" in menu
    generator_prompt = traj.generator.messages[1]["content"]
    assert "echo: Seurat" in generator_prompt and "done" not in generator_prompt  # memory: the tool's step only


async def test_stopping_at_turn_one_answers_with_no_tool_and_without_the_switch_answer_is_no_action():
    engine = role_engine(analysis=["a"], planner=[plan("answer")], verifier=[CONTINUE],
                         generator=["<answer>x</answer>"])
    traj = await stopping_flow(engine, verify=False).asolve("q")
    assert [t.tool for t in traj.turns] == ["answer"] and traj.stop_reason == "planner_stop"
    assert traj.failures == []
    plain = role_engine(analysis=["a"], planner=[plan("answer")], verifier=[STOP], generator=["<answer>x</answer>"])
    traj = await Flow.from_config(FlowConfig.from_dict({"tools": {"echo": {}}, "limits": {"max_turns": 1}}),
                                  engines={"default": plain}, tools={"echo": EchoTool()}).asolve("q")
    assert not traj.turns[0].tool_valid and [f.kind for f in traj.failures] == ["invalid_tool"]


def test_a_tool_named_like_the_stop_action_is_refused():
    with pytest.raises(ConfigError, match="planner_stop offers the action 'answer'"):
        FlowConfig.from_dict({"tools": {"answer": {}}, "planner_stop": True})
