"""The python tool's code writer: a copied worked example is refused like the executor's (`copied_example`),
and the code that ran is shown, in the console and recorded for the viewer, with the inner model call."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from agentflow.engines.base import Completion, Message, SamplingParams
from agentflow.engines.scripted import ScriptedEngine
from agentflow.tools.base import ToolContext, create_tool
from agentflow.tools.python_tool import CODE_WRITER_EXAMPLES, CopiedExampleError, copied_code_example

EXAMPLE_TASK, EXAMPLE_REPLY = CODE_WRITER_EXAMPLES[-1]                 # "Add 120, 35 and 7"


def _ctx(reply: str, question: str = "") -> ToolContext:
    engine = ScriptedEngine([reply])

    async def llm(messages: list[Message]) -> Completion:
        return await engine.generate(messages, SamplingParams())

    return ToolContext(llm=llm, question=question)


async def test_the_worked_example_copied_for_another_task_is_refused_not_run() -> None:
    """Regression (issue 19): for the sub-goal "python" the code writer returned `print(120 + 35 + 7)` and
    the tool reported 162 as the result."""
    tool = create_tool("python", {})
    with pytest.raises(CopiedExampleError) as refused:
        await tool.run(tool.parse_input({"task": "python"}), _ctx(EXAMPLE_REPLY, "What is 17 * 23?"))
    assert refused.value.kind == "copied_example"
    assert EXAMPLE_TASK in str(refused.value) and "print(120 + 35 + 7)" in str(refused.value)


async def test_the_examples_code_for_the_examples_own_numbers_runs() -> None:
    tool = create_tool("python", {})
    result = await tool.run(tool.parse_input({"task": "add 120, 35 and 7"}), _ctx(EXAMPLE_REPLY))
    assert result.output == "162" and result.data["code"] == "print(120 + 35 + 7)"
    assert copied_code_example("print(1 + 1)", "anything") is None


async def test_a_flow_records_the_copy_as_a_turn_failure_with_the_inner_call(make_flow) -> None:
    from tests.conftest import role_engine
    from tests.test_flow import STOP, plan

    engine = role_engine(planner=[plan("python", sub_goal="python")], executor=['{"task": "python"}'],
                         verifier=[STOP], tools=[EXAMPLE_REPLY], generator=["<answer>391</answer>"])
    flow = make_flow(engine, tools=[create_tool("python", {})])
    trajectory = await flow.asolve("What is 17 * 23?")
    turn = trajectory.turns[0]
    assert [f.kind for f in turn.failures] == ["copied_example"]
    assert turn.tool_call.error.kind == "copied_example" and turn.tool_call.output in ("", None)
    assert len(turn.tool_call.llm_calls) == 1
    assert turn.tool_call.llm_calls[0]["completion"]["text"] == EXAMPLE_REPLY


async def test_the_console_shows_the_code_the_tool_wrote_and_ran(make_flow, monkeypatch) -> None:
    from agentflow import cli
    from tests.conftest import role_engine
    from tests.test_flow import STOP, plan

    engine = role_engine(planner=[plan("python", sub_goal="multiply 17 by 23")],
                         executor=['{"task": "multiply 17 by 23"}'], verifier=[STOP],
                         tools=["```python\nprint(17 * 23)\n```"], generator=["<answer>391</answer>"])
    flow = make_flow(engine, tools=[create_tool("python", {})])
    out = Console(file=io.StringIO(), width=120)
    monkeypatch.setattr(cli, "console", out)
    trajectory = await flow.asolve("What is 17 * 23?", on_event=cli.StepPrinter())
    text = out.file.getvalue()
    assert trajectory.turns[0].tool_call.data["code"] == "print(17 * 23)"
    assert "code written by the tool's model (1 call(s)):\n    print(17 * 23)" in text
    assert text.index("print(17 * 23)") < text.index("result: 391")
    assert json.dumps(trajectory.turns[0].tool_call.arguments) == '{"task": "multiply 17 by 23"}'
