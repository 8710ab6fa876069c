"""MCP tools inside the flow, on a scripted engine: chosen by the planner, constrained and validated like built-in
tools, results and failures recorded, servers shared and closed with the flow, rollouts unchanged."""

from __future__ import annotations

import json
import os

import pytest

from agentflow.config import FlowConfig
from agentflow.engines.base import Completion, Engine, SamplingParams
from agentflow.errors import ConfigError
from agentflow.flow import Flow
from agentflow.train.data import Question
from agentflow.train.rollout import run_rollouts
from tests.conftest import role_engine, role_of
from tests.tools.mcp.conftest import fastmcp_config, raw_config

STOP = '{"analysis": "enough", "conclusion": "STOP"}'
TOOLS = ["add", "die", "sleep", "pid"]


def plan(tool: str, sub_goal: str = "compute it") -> str:
    return json.dumps({"context": "", "sub_goal": sub_goal, "tool_name": tool})


def answer_from_memory(messages: list[dict]) -> str:
    """A generator that answers 42 only when the tool's result reached its prompt."""
    return "<answer>42</answer>" if '"total": 42' in messages[-1]["content"] else "<answer>unknown</answer>"


def mcp_flow_config(**limits: float) -> FlowConfig:
    return FlowConfig.from_dict({"tools": {}, "query_analysis": False, "limits": {"max_turns": 1, **limits},
                                 "mcp_servers": {"calc": fastmcp_config(include=TOOLS).model_dump()}})


@pytest.fixture
async def make_mcp_flow():
    flows: list[Flow] = []

    def make(engine: Engine, **limits: float) -> Flow:
        flows.append(Flow.from_config(mcp_flow_config(**limits), engines={"default": engine}))
        return flows[-1]

    yield make
    for flow in flows:
        await flow.aclose()


async def test_the_planner_picks_an_mcp_tool_and_its_result_reaches_the_answer(make_mcp_flow):
    engine = role_engine(planner=[plan("calc.add", "add 20 and 22")], executor=['{"a": 20, "b": 22}'],
                         verifier=[STOP], generator=[answer_from_memory])
    flow = make_mcp_flow(engine)
    traj = await flow.asolve("What is 20 + 22?")
    assert traj.failures == [] and traj.answer == "42"
    assert sorted(traj.tools) == ["calc.add", "calc.die", "calc.pid", "calc.sleep"]
    call = traj.turns[0].tool_call
    assert call.tool == "calc.add" and call.arguments == {"a": 20, "b": 22}
    assert call.data["structured"] == {"total": 42} and call.data["server"] == "calc"
    schemas = {role_of(m): s for m, _, s in engine.calls}
    assert "calc.add" in schemas["planner"]["properties"]["tool_name"]["enum"]
    assert schemas["executor"] == flow.tools["calc.add"].card()["input_schema"]
    executor_prompt = traj.turns[0].executor.messages[0]["content"]  # the card is in the system message
    assert "Tool: calc.add - Add two integers." in executor_prompt and '"a": {' in executor_prompt


async def test_an_executor_reply_outside_the_schema_is_a_recorded_input_failure(make_mcp_flow):
    engine = role_engine(planner=[plan("calc.add")], executor=['{"a": "twenty"}'], verifier=[STOP],
                         generator=["<answer>?</answer>"])
    traj = await make_mcp_flow(engine).asolve("What is 20 + 22?")
    [failure] = traj.failures
    assert failure.stage == "tool" and failure.kind == "tool_input" and not failure.infrastructure
    assert "a: 'twenty' is not of type 'integer'" in failure.message
    assert "'b' is a required property" in traj.generator.messages[-1]["content"]


async def test_a_server_dying_mid_question_is_recorded_and_the_next_question_gets_a_new_one(make_mcp_flow):
    planner = [plan("calc.die"), plan("calc.pid")]
    engine = role_engine(planner=planner, executor=["{}"], verifier=[STOP], generator=["<answer>x</answer>"])
    flow = make_mcp_flow(engine)
    pid = int((await flow.tools["calc.pid"].run({}, _ctx())).output)
    traj = await flow.asolve("Crash it.")
    [failure] = traj.failures
    assert failure.kind == "mcp_server" and "during the call to 'die'" in failure.message
    assert traj.answer == "x" and traj.stop_reason == "verifier_stop"
    second = await flow.asolve("Which process?")
    assert second.failures == [] and int(second.turns[0].tool_call.output) != pid


async def test_a_hung_call_is_cut_off_by_the_tool_timeout(make_mcp_flow):
    engine = role_engine(planner=[plan("calc.sleep")], executor=['{"seconds": 60}'], verifier=[STOP],
                         generator=["<answer>late</answer>"])
    traj = await make_mcp_flow(engine, tool_timeout_s=0.5).asolve("Wait.")
    [failure] = traj.failures
    assert failure.kind == "tool_timeout" and traj.answer == "late" and traj.seconds < 10


async def test_flows_sharing_tools_share_servers_and_aclose_stops_them():
    config = mcp_flow_config()
    engine = role_engine()
    first = Flow.from_config(config, engines={"default": engine})
    second = Flow.from_config(config, engines={"default": engine}, tools=first.tools)
    pid = int((await second.tools["calc.pid"].run({}, _ctx())).output)
    assert second.tools["calc.pid"] is first.tools["calc.pid"] and first.tools["calc.pid"].server.starts == 1
    await first.aclose()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_server_that_cannot_start_stops_flow_construction_with_its_name():
    config = FlowConfig.from_dict({"tools": {}, "mcp_servers": {"db": raw_config("exit-at-start").model_dump()}})
    with pytest.raises(ConfigError, match="MCP server 'db'.*database file is locked"):
        Flow.from_config(config, engines={"default": role_engine()})


class TokenPlanner(Engine):
    """A policy stand-in recording token ids and log-probs, as the trainable engine does."""

    model_name = "tokens"

    async def generate(self, messages, sampling: SamplingParams, *, json_schema=None) -> Completion:
        if role_of(messages) == "planner":
            text = plan("calc.add")
        elif role_of(messages) == "executor":
            text = '{"a": 40, "b": 2}'
        elif role_of(messages) == "verifier":
            text = STOP
        else:
            text = answer_from_memory(messages)
        ids = list(range(len(text.split())))
        return Completion(text=text, prompt_token_ids=[1, 2, 3], token_ids=ids, logprobs=[-0.5] * len(ids))


async def test_rollouts_for_training_run_unchanged_on_mcp_tools(make_mcp_flow):
    flow = make_mcp_flow(TokenPlanner())
    question = Question("q1", "What is 40 + 2?", "42", "exact_match", {})
    batch = await run_rollouts(flow, [question], group_size=2, concurrency=2)
    assert [r.score.correct for r in batch.rollouts] == [True, True]
    assert all(r.trajectory.turns[0].tool == "calc.add" for r in batch.rollouts)
    assert batch.excluded == [] and flow.tools["calc.add"].server.starts == 1


def _ctx():
    from agentflow.tools.base import ToolContext

    return ToolContext(timeout_s=20)
