"""The generator: writes the final answer from memory; the answer is taken from <answer>…</answer>."""

from __future__ import annotations

import re

from agentflow.engines.base import Message

GENERATOR_SYSTEM = (
    "You write the final answer to the question from the steps taken. Be concise. "
    "Put the final answer inside <answer></answer> tags."
)

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_OPEN_ANSWER = re.compile(r"<answer>(.*)$", re.IGNORECASE | re.DOTALL)


def generator_messages(*, question: str, analysis: str, memory: str) -> list[Message]:
    parts = [f"Question: {question}"]
    if analysis:
        parts.append(f"Analysis: {analysis}")
    parts += [f"Steps taken:\n{memory}", "Answer the question. Put the final answer inside <answer></answer>."]
    return [{"role": "system", "content": GENERATOR_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]


def extract_answer(text: str) -> str:
    """The last <answer>…</answer> span; an unclosed <answer> takes the rest; else the whole reply, stripped."""
    closed = _ANSWER.findall(text)
    if closed:
        return closed[-1].strip()
    unclosed = _OPEN_ANSWER.search(text)
    if unclosed:
        return unclosed.group(1).strip()
    return text.strip()
