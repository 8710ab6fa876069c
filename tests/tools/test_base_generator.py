"""`base_generator`: a plain LLM answer, with the call recorded, and clear errors without an LLM."""

from __future__ import annotations

import pytest

from agentflow.engines.base import Completion, Message, SamplingParams
from agentflow.engines.scripted import ScriptedEngine
from agentflow.errors import ConfigError, EngineTimeoutError, ToolError
from agentflow.tools.base import LLMCall, ToolContext, create_tool
from agentflow.tools.base_generator import BASE_GENERATOR_SYSTEM


def _llm(engine: ScriptedEngine) -> LLMCall:
    async def call(messages: list[Message]) -> Completion:
        return await engine.generate(messages, SamplingParams())

    return call


async def test_answers_with_the_llm_and_records_the_call() -> None:
    engine = ScriptedEngine(["  Georges Seurat was born in 1859.  "])
    tool = create_tool("base_generator")
    result = await tool.run(tool.parse_input({"query": "When was Seurat born?"}), ToolContext(llm=_llm(engine)))
    assert result.output == "Georges Seurat was born in 1859."
    [(messages, _, _)] = engine.calls
    assert messages == [{"role": "system", "content": BASE_GENERATOR_SYSTEM},
                        {"role": "user", "content": "When was Seurat born?"}]
    assert result.llm_calls[0]["messages"] == messages
    assert result.llm_calls[0]["completion"]["text"].strip() == "Georges Seurat was born in 1859."


async def test_without_llm_is_a_config_error() -> None:
    tool = create_tool("base_generator")
    with pytest.raises(ConfigError, match="needs an LLM"):
        await tool.run(tool.parse_input({"query": "x"}), ToolContext())


async def test_empty_answer_is_a_tool_error() -> None:
    tool = create_tool("base_generator")
    with pytest.raises(ToolError, match="empty"):
        await tool.run(tool.parse_input({"query": "x"}), ToolContext(llm=_llm(ScriptedEngine(["   "]))))


async def test_engine_errors_propagate_typed() -> None:
    tool = create_tool("base_generator")
    engine = ScriptedEngine([EngineTimeoutError("slow")])
    with pytest.raises(EngineTimeoutError):
        await tool.run(tool.parse_input({"query": "x"}), ToolContext(llm=_llm(engine)))
