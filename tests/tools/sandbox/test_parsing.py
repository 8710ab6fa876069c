"""Finding 6: the parent's rewrite of model code (print the last expression) is total, size-capped, off the
event loop, and the program that runs is the one recorded."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentflow.errors import ToolTimeoutError
from agentflow.tools.base import ToolContext, create_tool
from agentflow.tools.python_tool import MAX_ECHO_CHARS, echo_last_expression, strip_comments

HOSTILE = {
    "unary chain (MemoryError in the parser)": "-" * 100_000 + "1",
    "long sum (RecursionError in the parser)": "x = 1\n" + "1+" * 49_000 + "1",
    "nested brackets": "[" * 100_000,
    "null byte": "x = 1\n\0",
}


@pytest.mark.parametrize("code", list(HOSTILE.values()), ids=list(HOSTILE))
def test_the_rewrite_never_raises(code: str) -> None:
    assert echo_last_expression(code) == code


def test_a_huge_line_is_not_parsed() -> None:
    code = "1+" * 10_000_000 + "1"  # 20 MB
    start = time.perf_counter()
    assert echo_last_expression(code) == code
    assert time.perf_counter() - start < 0.5
    assert echo_last_expression("1 + 1\n" + "#" * MAX_ECHO_CHARS) == "1 + 1\n" + "#" * MAX_ECHO_CHARS


async def test_parsing_does_not_stall_the_event_loop() -> None:
    stalls: list[float] = []

    async def ticker() -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.01)
            stalls.append(time.perf_counter() - before)

    tool = create_tool("python", {"timeout_s": 3.0})
    code = "x = 1\n" + "1+" * 49_000 + "1"  # under the cap, but a RecursionError for the parser
    task = asyncio.create_task(ticker())
    try:
        result = await tool.run(tool.parse_input({"code": code}), ToolContext())
    except ToolTimeoutError:
        result = None
    finally:
        task.cancel()
    assert result is None or result.data["code"] == code
    assert stalls and max(stalls) < 0.5, max(stalls)


@pytest.mark.parametrize(("code", "printed"), [
    ("v = 'shown'\n# \u2028\nv", "'shown'"),  # U+2028 in a comment: a line break for splitlines() only
    ("v = 2\f\nv", "2"),  # form feed
    ("v = 3\r\nw = 4\rv + w", "7"),  # CR LF and a lone CR: line breaks for the parser too
    ("s = 'a\x85b'\nlen(s)", "3"),  # NEL inside a string
])
async def test_the_program_that_runs_is_the_recorded_one(code: str, printed: str) -> None:
    tool = create_tool("python", {})
    args = tool.parse_input({"code": code})
    result = await tool.run(args, ToolContext())
    assert result.data["stdout"].strip() == printed, result.data["stderr"]
    assert result.data["code"] == args.code == strip_comments(code)  # the input as validated: comments dropped


@pytest.mark.parametrize(("code", "stripped"), [
    ("print(886 * 762)  # 886 * 762 = 37784888", "print(886 * 762)"),  # the bundled executor's run-on comment
    ("# head\nx = '# kept'  # gone\r\nprint(x)\n", "x = '# kept'\r\nprint(x)"),  # a string's # is no comment
    ("s = '''a # b\n# c'''\nprint(s)  # d", "s = '''a # b\n# c'''\nprint(s)"),
    ("print(1) + 2}  # x", "print(1) + 2}  # x"),  # does not tokenize: as written, and fails as written
    ("x = 1", "x = 1"),
])
def test_a_program_is_run_and_recorded_without_its_comments(code: str, stripped: str) -> None:
    assert strip_comments(code) == stripped
    assert create_tool("python", {}).parse_input({"code": code}).code == stripped
