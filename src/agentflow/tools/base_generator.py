"""The `base_generator` tool: a plain answer from the tools-role LLM, with no external source."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from agentflow.engines.base import Message
from agentflow.errors import ConfigError, ToolError
from agentflow.tools.base import Tool, ToolContext, ToolExample, ToolResult, register_tool

BASE_GENERATOR_SYSTEM = "Answer the question directly and concisely. If you are not sure, say so."


class BaseGeneratorInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(..., min_length=1, description="The question or instruction to answer.")


@register_tool
class BaseGeneratorTool(Tool):
    name = "base_generator"
    description = ("Answers a question with the language model's own knowledge, without looking anything up. "
                   "Use it for reasoning, explanations and common knowledge.")
    input_model = BaseGeneratorInput
    output_description = "The model's answer as text."
    limitations = "No sources and no computation: the answer may be wrong or out of date."
    best_practices = "Ask one clear, self-contained question."
    examples = (ToolExample(question="Why does a spoon look bent in a glass of water?",
                            sub_goal="Explain the optical effect", input={"query": "Why does light bend when it "
                                                                         "passes from water into air?"}),)
    uses_llm = True

    async def run(self, args: BaseGeneratorInput, ctx: ToolContext) -> ToolResult:
        if ctx.llm is None:
            raise ConfigError("base_generator needs an LLM, and none is bound; run it inside a flow "
                              "(roles.tools names its engine)")
        messages: list[Message] = [{"role": "system", "content": BASE_GENERATOR_SYSTEM},
                                   {"role": "user", "content": args.query}]
        completion = await ctx.llm(messages)
        text = completion.text.strip()
        if not text:
            raise ToolError("the LLM returned an empty answer")
        return ToolResult(output=text, data={"finish_reason": completion.finish_reason},
                          llm_calls=[{"role": "tools", "messages": messages, "completion": completion.model_dump()}])
