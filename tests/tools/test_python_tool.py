"""The `python` tool: input rules, code and task modes, failures and timeouts as the planner sees them."""

from __future__ import annotations

import asyncio

import pytest

from agentflow.engines.base import Completion, Message, SamplingParams
from agentflow.engines.scripted import ScriptedEngine
from agentflow.errors import ConfigError, ToolError, ToolInputError, ToolTimeoutError
from agentflow.tools.base import LLMCall, ToolContext, ToolResult, create_tool
from agentflow.tools.python_tool import (
    CODE_WRITER_EXAMPLES,
    CODE_WRITER_SYSTEM,
    PythonTool,
    echo_last_expression,
    extract_code,
)
from tests.tools.sandbox.hostile import needs_cgroups


def _llm(engine: ScriptedEngine) -> LLMCall:
    async def call(messages: list[Message]) -> Completion:
        return await engine.generate(messages, SamplingParams())

    return call


async def _run(arguments: dict, ctx: ToolContext | None = None, **settings: object) -> ToolResult:
    tool = create_tool("python", settings)
    return await tool.run(tool.parse_input(arguments), ctx or ToolContext())


async def test_code_mode_prints_42() -> None:
    result = await _run({"code": "print(6*7)"})
    assert result.output == "42"
    assert result.data["exit_code"] == 0 and result.data["ok"] is True
    assert result.data["code"] == "print(6*7)"
    assert result.llm_calls == []


@pytest.mark.parametrize("isolation", ["kernel", "process"])
async def test_code_reads_the_question_and_the_earlier_steps(isolation: str) -> None:
    code = "import re\nprint(int(re.search(r'number (\\d+)', steps[-1]).group(1)) * int(question.split()[-1]))"
    ctx = ToolContext(question="times 3", steps=["zinc", "Zinc has atomic number 30."])
    result = await _run({"code": code}, ctx, isolation=isolation)
    assert result.output == "90"
    assert (await _run({"code": "print(question, steps)"})).output == " []"  # outside a flow: empty


@pytest.mark.parametrize("arguments", [{}, {"code": "print(1)", "task": "add"}, {"code": "  "}, {"cmd": "x"}])
def test_input_needs_exactly_one_of_code_or_task(arguments: dict) -> None:
    with pytest.raises(ToolInputError):
        create_tool("python").parse_input(arguments)


@pytest.mark.parametrize(("stderr", "line"), [
    ("Traceback (most recent call last):\n  File \"<code>\", line 1, in <module>\nNameError: name 'x' is not "
     "defined\n\n", "NameError: name 'x' is not defined"),
    ("warning: something\n", ""),  # no traceback: nothing is named
    ("", ""),
    ("Traceback (most recent call last):\nValueError: " + "v" * 500, "ValueError: " + "v" * 187 + "…"),
])
def test_exception_line(stderr: str, line: str) -> None:
    from agentflow.tools.python_tool import MAX_CAUSE_CHARS, exception_line

    assert exception_line(stderr) == line and len(line) <= MAX_CAUSE_CHARS


async def test_exception_shows_the_traceback() -> None:
    result = await _run({"code": "print('partial')\n{}['missing']"})
    # the exception first, in the part of a result that memory keeps (limits.result_chars)
    assert result.output.startswith("partial\nError: the code failed (exit code 1): KeyError: 'missing'\n")
    assert "Traceback (most recent call last):" in result.output
    assert result.data["ok"] is False


async def test_syntax_error_is_output_not_exception() -> None:
    result = await _run({"code": "print(("})
    assert "SyntaxError" in result.output


@needs_cgroups
async def test_memory_error_is_named() -> None:
    result = await _run({"code": "x = bytearray(4 * 1024 ** 3)"}, memory_mb=128)
    assert "ran out of memory (limit 128 MB)" in result.output


async def test_no_output_hint() -> None:
    result = await _run({"code": "x = 6 * 7"})
    assert "printed nothing" in result.output


async def test_wall_clock_timeout_raises_tool_timeout() -> None:
    with pytest.raises(ToolTimeoutError, match="longer than 1.0s"):
        await _run({"code": "print('started', flush=True)\nwhile True:\n    pass"}, timeout_s=1.0)


async def test_context_budget_caps_the_timeout() -> None:
    with pytest.raises(ToolTimeoutError):
        await _run({"code": "import time\ntime.sleep(30)"}, ToolContext(timeout_s=0.8), timeout_s=60.0)


async def test_output_is_truncated_with_a_marker() -> None:
    result = await _run({"code": "print('y' * 50_000)"}, max_output_chars=1000)
    assert result.truncated
    assert "[truncated" in result.output and len(result.output) < 1200


async def test_task_mode_asks_the_llm_and_runs_its_fenced_code() -> None:
    engine = ScriptedEngine(["Here you go:\n```python\nprint(sum(range(1, 101)))\n```\nDone."])
    result = await _run({"task": "add the numbers from 1 to 100"}, ToolContext(llm=_llm(engine)))
    assert result.output == "5050"
    assert result.data["code"] == "print(sum(range(1, 101)))"
    messages = engine.calls[0][0]
    assert messages[0]["content"] == CODE_WRITER_SYSTEM
    assert len(messages) == 2 + 2 * len(CODE_WRITER_EXAMPLES)  # system, worked examples, the task
    assert [m["role"] for m in messages[1:-1]] == ["user", "assistant"] * len(CODE_WRITER_EXAMPLES)
    assert messages[-1] == {"role": "user", "content": "Task: add the numbers from 1 to 100"}
    assert result.llm_calls[0]["messages"] == messages
    assert result.llm_calls[0]["completion"]["text"].startswith("Here you go")


@pytest.mark.parametrize(("code", "printed"), [
    ("6873 * 683", "4694259"),
    ("x = 6\nx * 7", "42"),
    ("a = 2; a ** 10", "1024"),
    ("s = 'é'; s * 3", "'ééé'"),
    ("'text'", "'text'"),
    ("print('once')", "once"),
    ("None", ""),
    ("def f():\n    return 3\n\nf() + (\n    4)", "7"),
])
async def test_a_final_bare_expression_is_printed_like_in_a_notebook(code: str, printed: str) -> None:
    result = await _run({"code": code})
    assert result.data["stdout"].strip() == printed
    assert result.data["code"] == code  # the record keeps the code as written


def test_echo_leaves_statements_and_broken_code_alone() -> None:
    for code in ["x = 1", "print(1)", "for i in range(2):\n    i", "print(1", ""]:
        assert echo_last_expression(code) == code


async def test_task_mode_without_llm_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="needs an LLM"):
        await _run({"task": "compute something"})


async def test_task_mode_empty_reply_is_a_tool_error() -> None:
    engine = ScriptedEngine(["```python\n```"])
    with pytest.raises(ToolError, match="no code"):
        await _run({"task": "x"}, ToolContext(llm=_llm(engine)))


@pytest.mark.parametrize(("reply", "code"), [
    ("```python\nprint(1)\n```", "print(1)"),
    ("```py\nprint(2)\n```", "print(2)"),
    ("text\n```\nprint(3)\n```\nmore ```python\nprint(4)\n```", "print(3)"),
    ("```python\nprint(5)\n", "print(5)"),
    ("print(6)", "print(6)"),
])
def test_extract_code(reply: str, code: str) -> None:
    assert extract_code(reply) == code


async def test_cancellation_propagates_and_kills_the_child() -> None:
    tool = create_tool("python", {"timeout_s": 60})
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(tool.run(tool.parse_input({"code": "while True: pass"}), ToolContext(timeout_s=60)),
                               timeout=0.5)


def test_card_is_short_and_reflects_settings() -> None:
    tool = create_tool("python", {"timeout_s": 5, "memory_mb": 256})
    card = tool.card()
    assert isinstance(tool, PythonTool)
    assert card["description"].count(". ") <= 1
    assert "5 s" in card["limitations"] and "256 MB" in card["limitations"]


def test_executor_writes_code_directly():
    from agentflow.tools.python_tool import PythonTool

    schema = PythonTool().executor_schema()
    assert schema["required"] == ["code"] and set(schema["properties"]) == {"code"}


@pytest.mark.parametrize("example", PythonTool.examples, ids=lambda e: e.sub_goal)
async def test_worked_examples_run(example) -> None:
    result = await _run(example.input)
    assert result.data["ok"] is True and result.output.strip(), result.output


@pytest.mark.parametrize(("task", "reply"), CODE_WRITER_EXAMPLES)
async def test_code_writer_examples_run(task: str, reply: str) -> None:
    result = await _run({"code": extract_code(reply)})
    assert result.output == {"Compute 15 * 42": "630", "Add 120, 35 and 7": "162"}[task]


@pytest.mark.parametrize(("code", "expected"), [
    ("import numpy as np\nprint(np.linalg.solve([[2, 1], [1, 3]], [3, 5]).round(6).tolist())", "[0.8, 1.4]"),
    ("import sympy\nx = sympy.symbols('x')\nprint(sympy.integrate(x ** 2, (x, 0, 3)))", "9"),
    ("import json, os, tempfile\nos.makedirs('data/sub')\njson.dump({'a': 1}, open('data/sub/f.json', 'w'))\n"
     "with tempfile.TemporaryDirectory() as d:\n    open(os.path.join(d, 't'), 'w').write('t')\n"
     "print(json.load(open('data/sub/f.json'))['a'] + len(os.listdir('data')))", "2"),
    ("import fractions, itertools, math, statistics, decimal, datetime, collections\n"
     "print(math.comb(10, 3), statistics.median([3, 1, 2]), datetime.date(2024, 3, 1).isoformat())",
     "120 2 2024-03-01"),
])
async def test_ordinary_code_runs_under_the_kernel_sandbox(code: str, expected: str) -> None:
    if "sympy" in code:
        pytest.importorskip("sympy")
    result = await _run({"code": code}, timeout_s=60.0)
    assert result.output == expected, result.output
    assert result.data["isolation"][0] == "level:kernel"


def test_isolation_setting_is_validated() -> None:
    with pytest.raises(ConfigError):
        create_tool("python", {"isolation": "none"})
