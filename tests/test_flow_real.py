"""The flow end to end on the real bundled model: embedded llama.cpp, and llama.cpp's own HTTP server."""

from __future__ import annotations

import re

import pytest

from agentflow.config import FlowConfig
from agentflow.flow import Flow
from tests.servers import start_llamacpp_server

pytestmark = pytest.mark.slow


def _config(engine: dict) -> FlowConfig:
    return FlowConfig.from_dict({"engines": {"default": engine}, "limits": {"max_turns": 2, "max_seconds": 240},
                                 "tools": {"python": {}, "wikipedia_search": {}}})


def _check(trajectory, model_prefix: str) -> None:
    assert trajectory.infrastructure_failure is None, trajectory.failures
    assert trajectory.turns and trajectory.stop_reason in ("verifier_stop", "max_turns")
    for turn in trajectory.turns:
        assert turn.tool in ("python", "wikipedia_search") and turn.tool_valid
        assert turn.tool_call is not None and turn.verdict in ("STOP", "CONTINUE")
    assert trajectory.generator is not None and trajectory.generator.completion.completion_tokens > 0
    assert trajectory.usage.prompt_tokens > 0
    assert trajectory.roles["planner"]["model"].startswith(model_prefix)


async def test_flow_on_embedded_llamacpp_runs_questions_concurrently():
    async with Flow.from_config(_config({"kind": "llamacpp", "n_parallel": 2, "n_threads": 1})) as flow:
        import asyncio

        trajectories = await asyncio.gather(flow.asolve("What is 4821 * 97?"),
                                            flow.asolve("Who wrote Pride and Prejudice?"))
    for trajectory in trajectories:
        _check(trajectory, "SmolLM2-135M")


async def test_flow_against_a_real_llamacpp_openai_compatible_server():
    server = start_llamacpp_server(n_parallel=2, threads=1)
    try:
        config = _config({"kind": "openai", "base_url": server.base_url, "model": "smollm2", "api_key_env": None,
                          "timeout_s": 60, "max_retries": 1})
        async with Flow.from_config(config) as flow:
            trajectory = await flow.asolve("What is 4821 * 97?")
        _check(trajectory, "smollm2")
        assert trajectory.turns[0].planner.json_schema  # structured output sent over HTTP
    finally:
        server.stop()


async def test_replies_cut_off_by_max_tokens_leave_a_trajectory_that_saves(tmp_path):
    """The bundled model with a few tokens per role: JSON cut mid-string, answers cut mid-emoji; still a record."""
    from agentflow.trajectory import Trajectory

    roles = {role: {"sampling": {"max_tokens": tokens, "temperature": 1.0, "seed": 7}}
             for role, tokens in {"planner": 6, "executor": 5, "verifier": 3, "generator": 4, "tools": 4}.items()}
    config = FlowConfig.from_dict({"engines": {"default": {"kind": "llamacpp", "n_threads": 1}}, "roles": roles,
                                   "limits": {"max_turns": 2, "max_seconds": 120},
                                   "tools": {"python": {}, "wikipedia_search": {}}})
    async with Flow.from_config(config) as flow:
        traj = await flow.asolve("Reply with three emoji 😀🎉🚀, then say who painted \udcffthe Mona Lisa?")
    assert traj.turns and traj.generator is not None and traj.infrastructure_failure is None
    assert "\ufffd" in traj.question  # the undecodable byte, cleaned
    traj.write(tmp_path / "t.json")
    assert Trajectory.model_validate_json((tmp_path / "t.json").read_text(encoding="utf-8")) == traj


async def test_the_bundled_executor_runs_on_past_its_call_and_the_call_is_kept():
    """The mixed task's flow (the executor the bundled model, greedy, 96 tokens): given a terse sub-goal it
    writes `print(2009 * 544)` and then a comment that runs to its token limit, so its JSON never closes. The
    program up to the cut runs; before, the sub-goal "2009" became the task and the question was lost. Later
    roles read the program without the comment (its made-up products misled the generator)."""
    import json
    from pathlib import Path

    import agentflow
    from agentflow.engines.scripted import ScriptedEngine

    config = FlowConfig.from_yaml(Path(agentflow.__file__).parent / "configs" / "flow_mixed.yaml")
    planner = ScriptedEngine([json.dumps({"tool_name": "python", "sub_goal": "2009", "context": "2009"}),
                              json.dumps({"tool_name": "answer", "sub_goal": "", "context": ""})])
    async with Flow.from_config(config, engines={"policy": planner}) as flow:
        trajectory = await flow.asolve("Multiply 2009 by 544.")
    turn = trajectory.turns[0]
    assert turn.executor.completion.finish_reason == "length"
    assert [f.kind for f in turn.failures] == ["executor_cut"]
    # the call as the executor wrote it, comment and all (the spaces before `#` differ between llama.cpp builds:
    # two with the AVX2 wheel, one with scripts/build_llamacpp.py's)
    assert re.match(r"print\(2009 \* 544\) +#", turn.tool_call.arguments["code"])
    assert turn.tool_call.output.splitlines()[0] == "1092896"
    # what ran, and what the generator reads of the step, is the program without its comment
    assert turn.tool_call.data["code"] == "print(2009 * 544)"
    assert '"code": "print(2009 * 544)"' in trajectory.generator.messages[1]["content"]



async def test_a_collection_tool_answers_a_mixed_kb_question_through_the_bundled_executor_and_generator():
    """`mixed_kb`'s flow with the planner scripted to the right plan: the bundled executor writes the query, the
    shipped collection's index finds the colleague, and the bundled generator gives the extension; the same
    question asked of another collection finds no such colleague."""
    import json
    from pathlib import Path

    import agentflow
    from agentflow.engines.scripted import ScriptedEngine
    from agentflow.tools.base import ToolContext

    config = FlowConfig.from_yaml(Path(agentflow.__file__).parent / "configs" / "flow_mixed_kb.yaml")
    question = "Rusva Bonvur has which phone extension?"  # a held-out question
    staff = json.loads((Path(agentflow.__file__).parent / "data" / "tasks" / "mixed_kb" / "collections" /
                        "staff_directory.json").read_text())
    extension = next(d["extract"] for d in staff if d["title"] == "Rusva Bonvur").split()[2].rstrip(".")
    planner = ScriptedEngine([json.dumps({"tool_name": "staff_directory", "sub_goal": question, "context": ""}),
                              json.dumps({"tool_name": "answer", "sub_goal": "", "context": ""})])
    async with Flow.from_config(config, engines={"policy": planner}) as flow:
        trajectory = await flow.asolve(question)
        shop = flow.tools["product_catalog"]
        wrong = await shop.run(shop.parse_input({"query": question}), ToolContext(timeout_s=30))
    assert trajectory.turns[0].tool_call.output.startswith(f"1. Rusva Bonvur: Phone extension {extension}.")
    assert extension in trajectory.answer
    assert wrong.output.startswith("No document matched")
