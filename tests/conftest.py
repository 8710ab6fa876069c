"""Shared fixtures: a scripted engine that answers each flow role from its own script, and echo tools."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import BaseModel

from agentflow.config import FlowConfig
from agentflow.engines.base import Message
from agentflow.engines.scripted import Reply, ScriptedEngine
from agentflow.errors import ToolError
from agentflow.executor import EXECUTOR_SYSTEM
from agentflow.flow import Flow
from agentflow.generator import GENERATOR_SYSTEM
from agentflow.planner import ANALYSIS_SYSTEM, PLANNER_SYSTEM, PLANNER_SYSTEM_TOOL_LAST
from agentflow.tools.base import Tool, ToolContext, ToolResult
from agentflow.verifier import VERIFIER_SYSTEM

ROLE_BY_SYSTEM = {ANALYSIS_SYSTEM: "analysis", PLANNER_SYSTEM: "planner", PLANNER_SYSTEM_TOOL_LAST: "planner",
                  EXECUTOR_SYSTEM: "executor", VERIFIER_SYSTEM: "verifier", GENERATOR_SYSTEM: "generator"}


def role_of(messages: list[Message]) -> str:
    system = messages[0]["content"]
    # the executor's system message carries the tool's card after EXECUTOR_SYSTEM
    return next((role for prompt, role in ROLE_BY_SYSTEM.items() if system.startswith(prompt)), "tools")


def role_engine(**scripts: list[Reply]) -> ScriptedEngine:
    """An engine whose reply depends on the role asking; each role's script is consumed in order."""
    positions = {role: 0 for role in scripts}

    def reply(messages: list[Message]) -> Reply:
        role = role_of(messages)
        script = scripts.get(role, ["ok"])
        index = positions.get(role, 0)
        positions[role] = index + 1
        item = script[min(index, len(script) - 1)]
        return item(messages) if callable(item) and not isinstance(item, BaseException) else item

    return ScriptedEngine(reply)


class EchoInput(BaseModel):
    query: str


class EchoTool(Tool):
    """Echoes its query; 'fail' raises a ToolError, 'crash' a plain exception, 'hang' sleeps."""

    name = "echo"
    description = "Echoes the query."
    input_model = EchoInput
    output_description = "The query."

    async def run(self, args: EchoInput, ctx: ToolContext) -> ToolResult:
        import asyncio

        if args.query == "fail":
            raise ToolError("echo failed on purpose")
        if args.query == "crash":
            raise RuntimeError("bug in tool")
        if args.query == "hang":
            await asyncio.sleep(60)
        return ToolResult(output=f"echo: {args.query}")


class AskInput(BaseModel):
    query: str


class AskTool(Tool):
    """Asks the tools-role LLM."""

    name = "ask"
    description = "Asks a language model."
    input_model = AskInput
    output_description = "The model's reply."
    uses_llm = True

    async def run(self, args: AskInput, ctx: ToolContext) -> ToolResult:
        assert ctx.llm is not None
        completion = await ctx.llm([{"role": "user", "content": args.query}])
        return ToolResult(output=completion.text)


@pytest.fixture
def make_flow() -> Callable[..., Flow]:
    def make(engine: ScriptedEngine, *, tools: list[Tool] | None = None, **limits: float) -> Flow:
        tools = tools if tools is not None else [EchoTool(), AskTool()]
        config = FlowConfig.from_dict({"tools": {t.name: {} for t in tools}, "limits": limits})
        return Flow.from_config(config, engines={"default": engine}, tools={t.name: t for t in tools})

    return make
