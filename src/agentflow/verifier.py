"""The verifier: does memory now suffice to answer? STOP or CONTINUE; unparseable means CONTINUE."""

from __future__ import annotations

import re
from typing import Any, Literal

from agentflow.engines.base import Message
from agentflow.textsafe import first_json_object

VERIFIER_SYSTEM = (
    "You check whether the steps so far give enough information to answer the question. "
    'Reply with JSON only: {"analysis": "...", "conclusion": "STOP"} when they do, '
    '{"analysis": "...", "conclusion": "CONTINUE"} when more steps are needed.'
)

VERIFIER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "analysis": {"type": "string", "maxLength": 120},
        "conclusion": {"type": "string", "enum": ["STOP", "CONTINUE"]},
    },
    "required": ["analysis", "conclusion"],
    "additionalProperties": False,
}


def verifier_messages(*, question: str, analysis: str, memory: str) -> list[Message]:
    parts = [f"Question: {question}"]
    if analysis:
        parts.append(f"Analysis: {analysis}")
    parts += [f"Memory:\n{memory}", "Is the memory enough to answer the question? Reply with JSON."]
    return [{"role": "system", "content": VERIFIER_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


def parse_verdict(text: str) -> tuple[Literal["STOP", "CONTINUE"], bool]:
    """Return (verdict, parsed). An unparseable reply is CONTINUE with parsed=False."""
    obj = first_json_object(text)
    conclusion = str(obj.get("conclusion", "")).strip().upper() if obj is not None else ""
    if conclusion in ("STOP", "CONTINUE"):
        return conclusion, True  # type: ignore[return-value]
    found = re.findall(r"\b(STOP|CONTINUE)\b", text.upper())
    if found:
        return found[-1], True  # type: ignore[return-value]
    return "CONTINUE", False
