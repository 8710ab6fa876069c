"""The executor: turns the planner's sub-goal into arguments for the chosen tool.

The arguments are JSON constrained to the tool's input schema where the engine supports it, then validated
against that schema. When the reply cannot be used and the tool takes a single required text field, the
sub-goal itself fills that field (recorded as a fallback), so one malformed reply does not waste the turn.
"""

from __future__ import annotations

import json
from typing import Any

from agentflow.engines.base import Message
from agentflow.memory import truncate
from agentflow.textsafe import first_json_object
from agentflow.tools.base import Tool

EXECUTOR_SYSTEM = (
    "You call tools. Given a tool's card and a sub-goal, write the tool's input as JSON matching its input "
    "schema. Reply with the JSON object only."
)


def executor_messages(*, question: str, context: str, sub_goal: str, tool: Tool,
                      text_chars: int) -> list[Message]:
    """The executor's prompt; the tool's worked examples, if any, come first as prior exchanges.

    The planner's context and sub-goal are cut to `text_chars` (`limits.text_chars`)."""
    card = tool.card()
    schema = json.dumps(card["input_schema"].get("properties", {}), ensure_ascii=False)

    def task(question: str, context: str, sub_goal: str) -> str:
        parts = [
            f"Question: {question}",
            f"Context: {context}" if context else "",
            f"Sub-goal: {sub_goal}",
            f"Tool: {card['name']} - {card['description']}",
            f"Input fields: {schema}",
            f"Best practices: {card['best_practices']}" if card["best_practices"] else "",
            f"Write the JSON input for {card['name']} that achieves the sub-goal.",
        ]
        return "\n\n".join(p for p in parts if p)

    messages: list[Message] = [{"role": "system", "content": EXECUTOR_SYSTEM}]
    for example in tool.examples:
        messages += [{"role": "user", "content": task(example.question, "", example.sub_goal)},
                     {"role": "assistant", "content": json.dumps(example.input, ensure_ascii=False)}]
    messages.append({"role": "user", "content": task(question, truncate(context, text_chars),
                                                      truncate(sub_goal, text_chars))})
    return messages


def fallback_field(tool: Tool) -> str | None:
    """The input field the sub-goal may fill: the tool's declared one, else its only required string field."""
    if tool.fallback_field:
        return tool.fallback_field
    schema = tool.input_schema()
    required = schema.get("required", [])
    props = schema.get("properties", {})
    strings = [name for name in required if props.get(name, {}).get("type") == "string"]
    return strings[0] if len(required) == 1 and len(strings) == 1 else None


def parse_arguments(text: str) -> dict[str, Any] | None:
    """The first JSON object in the reply, or None (see `first_json_object` for what is not taken)."""
    return first_json_object(text)
