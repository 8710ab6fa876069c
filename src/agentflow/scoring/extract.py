"""Pull the final answer out of a reply: the content of its last `<answer>...</answer>` block."""

from __future__ import annotations

import re

_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_OPEN_TAG = re.compile(r"<answer>", re.IGNORECASE)


def extract_answer(text: str) -> str:
    """The last `<answer>` block's content; an unclosed last `<answer>` runs to the end; else the whole text.

    The last block wins because models often restate the format ("<answer> and </answer> tags") before answering.
    """
    text = text or ""
    blocks = _ANSWER_BLOCK.findall(text)
    opens = list(_OPEN_TAG.finditer(text))
    if opens:
        tail = text[opens[-1].end():]
        if "</answer>" not in tail.lower():
            # A reply cut off by max_tokens (or a model that never closes the tag): take what follows the tag.
            return tail.strip()
    if blocks:
        return blocks[-1].strip()
    return text.strip()
