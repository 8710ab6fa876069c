"""Typed, per-question memory shared by the four modules.

One `FlowMemory` per question (never shared between questions). It keeps the full record of every step and
renders a bounded view into prompts: newest steps first within a token budget, tool results and model-written
text (sub-goal, tool name) truncated with a marker, so no reply or tool output, however long, is copied whole
into later prompts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field


def approx_tokens(text: str) -> int:
    """Cheap token estimate (~4 characters per token for English BPE vocabularies)."""
    return (len(text) + 3) // 4


def truncate(text: str, limit: int) -> str:
    """Cut `text` to `limit` characters, saying how much was dropped."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]} ... [truncated {len(text) - limit} chars]"


class MemoryEntry(BaseModel):
    """What one turn added to memory."""

    turn: int
    sub_goal: str
    tool: str | None
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: str = ""
    error: str | None = None
    verdict: str | None = None

    def render(self, result_chars: int, text_chars: int, *, tool_names: bool = True) -> str:
        tool = f"tool={truncate(self.tool or 'none', text_chars)}; " if tool_names else ""
        lines = [f"Step {self.turn}: {tool}sub-goal: {truncate(self.sub_goal, text_chars)}"]
        if self.arguments:
            lines.append(f"  input: {truncate(json.dumps(self.arguments, ensure_ascii=False), result_chars // 2)}")
        lines.append(f"  {self.outcome(result_chars)}")
        return "\n".join(lines)

    def outcome(self, result_chars: int) -> str:
        """What the step gave, bounded: `error: …` or `result: …`."""
        if self.error:
            return f"error: {truncate(self.error, result_chars)}"
        return f"result: {truncate(self.result, result_chars) or '(empty)'}"


class FlowMemory(BaseModel):
    """The evolving memory of one question."""

    question: str
    query_analysis: str = ""
    entries: list[MemoryEntry] = Field(default_factory=list)

    def add(self, entry: MemoryEntry) -> None:
        self.entries.append(entry)

    def latest(self, result_chars: int) -> str:
        """The newest step's outcome without its `result: ` label (an error keeps `error: `); "" before any."""
        if not self.entries:
            return ""
        return self.entries[-1].outcome(result_chars).removeprefix("result: ")

    def render(self, *, token_budget: int, result_chars: int, text_chars: int,
               count_tokens: Callable[[str], int] = approx_tokens, tool_names: bool = True) -> str:
        """Render the newest entries that fit in `token_budget`; older ones are summarised as omitted.

        The newest entry is always shown; `result_chars` and `text_chars` bound its size. `tool_names=False`
        leaves out which tool each step used (sub-goals, inputs and results stay)."""
        if not self.entries:
            return "(no steps yet)"
        kept: list[str] = []
        used = 0
        for entry in reversed(self.entries):
            text = entry.render(result_chars, text_chars, tool_names=tool_names)
            cost = count_tokens(text)
            if kept and used + cost > token_budget:
                break
            kept.append(text)
            used += cost
        omitted = len(self.entries) - len(kept)
        head = [f"[{omitted} earlier step(s) omitted]"] if omitted else []
        return "\n".join(head + list(reversed(kept)))
