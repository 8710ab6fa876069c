"""The executor: turns the planner's sub-goal into arguments for the chosen tool.

The arguments are JSON constrained to the tool's input schema where the engine supports it, then validated
against that schema. When the reply cannot be used and the tool takes a single required text field, the
sub-goal itself fills that field (recorded as a fallback), so one malformed reply does not waste the turn.
A reply that the token limit cut inside its JSON keeps what it wrote up to the cut (recorded).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import from_json

from agentflow.engines.base import Message
from agentflow.memory import truncate
from agentflow.textsafe import first_json_object, word_set
from agentflow.tools.base import Tool, ToolExample

EXECUTOR_SYSTEM = (
    "You call tools. Given a tool's card and a sub-goal, write the tool's input as JSON matching its input "
    "schema. Reply with the JSON object only."
)


def executor_messages(*, question: str, context: str, sub_goal: str, tool: Tool, text_chars: int,
                      steps: str = "") -> list[Message]:
    """The executor's prompt: the tool's card once (system), its worked examples as prior exchanges, then the
    call to write, its question last.

    The card and examples are the same for every call of a tool, so an engine with prompt caching (llama.cpp's
    slots, vLLM's prefix cache) computes them once. The question comes last because a small model copies from
    what it read last: with the question first the bundled 135M model repeated an example's query in most
    look-ups. The planner's context and sub-goal are cut to `text_chars` (`limits.text_chars`). `steps`: the
    rendered memory of earlier turns, when the flow shows it to the executor (`executor_memory`); otherwise the
    planner's `context` is all it knows of them, as in the paper."""
    card = tool.card()
    schema = json.dumps(card["input_schema"].get("properties", {}), ensure_ascii=False)
    system = "\n\n".join(part for part in (
        EXECUTOR_SYSTEM,
        f"Tool: {card['name']} - {card['description']}",
        f"Input fields: {schema}",
        f"Best practices: {card['best_practices']}" if card["best_practices"] else "",
    ) if part)

    def task(question: str, context: str, sub_goal: str, steps: str = "") -> str:
        parts = [
            f"Steps so far:\n{steps}" if steps else "",
            f"Context: {context}" if context else "",
            f"Sub-goal: {sub_goal}",
            f"Question: {question}",
            f"Write the JSON input for {card['name']}.",
        ]
        return "\n\n".join(p for p in parts if p)

    messages: list[Message] = [{"role": "system", "content": system}]
    for example in tool.worked_examples():
        messages += [{"role": "user", "content": task(example.question, "", example.sub_goal, example.steps)},
                     {"role": "assistant", "content": json.dumps(example.input, ensure_ascii=False)}]
    messages.append({"role": "user", "content": task(question, truncate(context, text_chars),
                                                      truncate(sub_goal, text_chars), steps)})
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


def copied_example(tool: Tool, question: str, arguments: dict[str, Any] | None) -> ToolExample | None:
    """The worked example whose input the executor repeated word for word, when that input carries something
    of the example's own question that this question lacks (its subject, its numbers).

    Small models copy the last example they saw; such a call answers the example, not the question. An input
    that is the same for every question (a generic program) is no leak."""
    if not arguments:
        return None
    asked = word_set(question)
    for example in tool.worked_examples():
        if example.input != arguments:
            continue
        specific = (word_set(json.dumps(example.input, ensure_ascii=False)) & word_set(example.question)) - asked
        if specific:
            return example
    return None


def parse_arguments(text: str) -> dict[str, Any] | None:
    """The first JSON object in the reply, or None (see `first_json_object` for what is not taken)."""
    return first_json_object(text)


def parse_cut_arguments(text: str) -> dict[str, Any] | None:
    """The object of a reply that its token limit cut inside the JSON, read up to the cut, or None.

    A small model often writes a right call and then runs on inside its last string (`print(2009 * 544)  #
    2009 * 544 is 1224...` until the limit), so the object never closes. Read up to the cut, the last string
    ends where the reply ended: a comment cut short still runs, a query cut short still searches, and code cut
    inside an expression fails when the tool runs it, recorded. For replies that ended at the limit only: a
    reply that ended on its own with broken JSON is not repaired."""
    if "{" not in text:
        return None
    try:
        partial = from_json(text[text.index("{"):], allow_partial="trailing-strings")
        # through the same checks as a closed object: huge integers, NaN, depth
        return first_json_object(json.dumps(partial, ensure_ascii=False)) if isinstance(partial, dict) else None
    except (ValueError, RecursionError, TypeError):  # TypeError: a lone surrogate (engines clean their text)
        return None
