"""The planner: query analysis, then per turn a context, a sub-goal and a tool name.

The planner is the trainable policy. Its reply is JSON constrained to `planner_schema` where the engine
supports it; `parse_planner_reply` is the tolerant fallback for engines that do not (and for truncated or
free-form replies). A reply naming no valid tool is still a recorded turn.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from agentflow.engines.base import Message
from agentflow.textsafe import first_json_object

ANALYSIS_SYSTEM = "You analyse questions for an assistant that can use tools. Be brief."
PLANNER_SYSTEM = (
    "You are the planner of an assistant that answers questions with tools. "
    "Each step, pick ONE tool and write the sub-goal it must achieve. "
    'Reply with JSON only: {"tool_name": "...", "sub_goal": "...", "context": "..."}.'
)
PLANNER_SYSTEM_TOOL_LAST = (
    "You are the planner of an assistant that answers questions with tools. "
    "Each step, write what the next step must achieve, then pick ONE tool for it. "
    'Reply with JSON only: {"context": "...", "sub_goal": "...", "tool_name": "..."}.'
)
"""The system prompt of a planner that names its tool last (`FlowConfig.planner_tool_last`)."""
PLANNER_FIELDS = ("tool_name", "sub_goal", "context")
PLANNER_FIELDS_TOOL_LAST = ("context", "sub_goal", "tool_name")


class PlannerStep(BaseModel):
    """The parsed planner reply."""

    context: str = ""
    sub_goal: str = ""
    tool_name: str | None = None
    raw_tool: str | None = None
    well_formed: bool = False
    """True when the reply was valid JSON with a known tool; False when the fallback parser had to guess."""


def tool_menu(tool_descriptions: dict[str, str]) -> str:
    return "\n".join(f"- {name}: {desc}" for name, desc in tool_descriptions.items())


def analysis_messages(question: str, tool_descriptions: dict[str, str]) -> list[Message]:
    user = (
        f"Question: {question}\n\nTools:\n{tool_menu(tool_descriptions)}\n\n"
        "In two or three sentences: what is asked, what facts or computations are needed, and which tools help."
    )
    return [{"role": "system", "content": ANALYSIS_SYSTEM}, {"role": "user", "content": user}]


def planner_messages(*, question: str, analysis: str, tool_descriptions: dict[str, str], memory: str,
                     turn: int, max_turns: int, tool_last: bool = False) -> list[Message]:
    """The planner's prompt for one turn; `tool_last`: it asks for the context and the sub-goal before the tool
    (`FlowConfig.planner_tool_last`)."""
    menu = f"tool_name (one of: {', '.join(tool_descriptions)})"
    fields = f"context, sub_goal, {menu}" if tool_last else f"{menu}, sub_goal, context"
    parts = [f"Question: {question}"]
    if analysis:
        parts.append(f"Analysis: {analysis}")
    parts += [
        f"Tools:\n{tool_menu(tool_descriptions)}",
        f"Memory:\n{memory}",
        f"Step {turn} of {max_turns}. Reply with JSON: {fields}.",
    ]
    system = PLANNER_SYSTEM_TOOL_LAST if tool_last else PLANNER_SYSTEM
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


def planner_schema(tool_names: list[str], *, text_chars: int = 150, tool_last: bool = False) -> dict[str, Any]:
    """JSON schema of a planner reply; `tool_name` is restricted to the enabled tools, sub-goal and context to
    `text_chars` characters each (`limits.plan_chars`). Constrained decoding writes the properties in their
    order here: by default the action first (a reply cut off by max_tokens still names a valid tool and, most
    often, its sub-goal; the context is the part a cut costs least); `tool_last`: context, sub-goal, then the
    tool, the order of the paper's planner (its Context, Sub-Goal, Tool Name)."""
    properties = {
        "tool_name": {"type": "string", "enum": list(tool_names)},
        "sub_goal": {"type": "string", "maxLength": text_chars},
        "context": {"type": "string", "maxLength": text_chars},
    }
    order = PLANNER_FIELDS_TOOL_LAST if tool_last else PLANNER_FIELDS
    return {
        "type": "object",
        "properties": {key: properties[key] for key in order},
        "required": list(order),
        "additionalProperties": False,
    }


_KEY_ALIASES = {
    "context": "context",
    "subgoal": "sub_goal",
    "sub_goal": "sub_goal",
    "goal": "sub_goal",
    "toolname": "tool_name",
    "tool_name": "tool_name",
    "tool": "tool_name",
}


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def match_tool(raw: str, tool_names: list[str]) -> str | None:
    """Map a tool name as written by a model to an enabled tool, or None when it names none or several."""
    key = _norm(raw)
    if not key:
        return None
    exact = [t for t in tool_names if _norm(t) == key]
    if exact:
        return exact[0]
    contained = {t for t in tool_names if _norm(t) in key or key in _norm(t)}
    return contained.pop() if len(contained) == 1 else None


_FIELD_PATTERNS = {
    # "key": "value" in JSON (value may be cut off by max_tokens), or "Key: value" lines. The line pattern's
    # padding must not cross a newline: `\W*` did, and every line of a run of newlines rescanned the rest.
    field: [
        re.compile(rf'"{pattern}"\s*:\s*"((?:[^"\\]|\\.)*)', re.IGNORECASE),
        re.compile(rf"^[^\w\n]*{pattern}[^\w\n]*:\s*(.+)$", re.IGNORECASE | re.MULTILINE),
    ]
    for field, pattern in {
        "context": r"context",
        "sub_goal": r"sub[\s_-]?goal",
        "tool_name": r"tool(?:[\s_-]?name)?",
    }.items()
}


def parse_planner_reply(text: str, tool_names: list[str]) -> PlannerStep:
    """Parse a planner reply: JSON first, then `key: value` fields, then any single tool name in the text."""
    fields: dict[str, str] = {}
    obj = first_json_object(text)
    if obj is not None:
        for key, value in obj.items():
            canonical = _KEY_ALIASES.get(_norm(key)) or _KEY_ALIASES.get(key.lower())
            if canonical and isinstance(value, str | int | float):
                fields.setdefault(canonical, str(value).strip())
    for field, patterns in _FIELD_PATTERNS.items():
        if field in fields:
            continue
        for pattern in patterns:
            found = pattern.search(text)
            if found:
                fields[field] = found.group(1).strip().strip('"').strip()
                break
    raw_tool = fields.get("tool_name")
    tool = match_tool(raw_tool, tool_names) if raw_tool else None
    if raw_tool is None:
        mentioned = {t for t in tool_names if re.search(rf"\b{re.escape(t)}\b", text, re.IGNORECASE)}
        tool = mentioned.pop() if len(mentioned) == 1 else None
    sub_goal = fields.get("sub_goal", "")
    return PlannerStep(
        context=fields.get("context", ""),
        sub_goal=sub_goal,
        tool_name=tool,
        raw_tool=raw_tool,
        well_formed=obj is not None and tool is not None and raw_tool == tool and bool(sub_goal),
    )
