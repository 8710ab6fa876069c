"""Model-written text made safe to parse, to record and to show again, whatever the model wrote.

- `clean_text`: a lone surrogate (half an emoji cut off by `max_tokens`, or a `\\ud83d` escape decoded from JSON)
  becomes U+FFFD: UTF-8 cannot encode one, so a trajectory holding one could not be written.
- `first_json_object`: the first JSON object in a reply, in time linear in the reply's length and never raising;
  what it returns is clean, finite and at most `MAX_JSON_DEPTH` deep, so it always serialises and reloads.
- `model_json`: a pydantic model as JSON even when a string somewhere in it holds a lone surrogate.
- `terminal_safe`, `json_terminal_safe`: text for a terminal with every control character and bidi override made
  visible and inert (`\x1b`, `\u202e`): a tool's output, a model's reply or a file cannot move the cursor, set the
  clipboard (OSC 52), make links or reorder what the user reads.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError

MAX_JSON_DEPTH = 32
"""Deepest JSON taken from a reply: far above any tool input, far below the ~200 levels pydantic can reload."""

SCAN_FACTOR = 2
"""`first_json_object` reads at most about this many times the reply's length over all its candidates, plus
`SCAN_FLOOR` characters..."""
SCAN_FLOOR = 65_536
"""...so that a short reply is searched in full (a 63-character reply with three unclosed `{` before its object
spent a budget of twice its length, and its object was not found); at most about 4 ms of scanning here."""
MAX_CANDIDATES = 256
"""...and tries at most this many `{`: a reply asked for JSON holds it well before, prose rarely has as many."""


_WORD = re.compile(r"\S+\s*")
MAX_REPEAT_SPAN = 40
"""Longest repeated run (in words) `cut_repetition` looks for."""
MAX_REPEAT_WINDOW = 1000
"""`cut_repetition` looks at the last this many words (a reply cut by max_tokens is far shorter); a longer loop
is cut where the window starts, so its cost stays a few ms whatever the reply's length."""


def _starts_run(tail: list[str], run: list[str]) -> bool:
    """`tail` repeats the start of `run`; its last word may be cut short (max_tokens ends mid-word)."""
    return tail[:-1] == run[:-1] and (not tail or run[-1].startswith(tail[-1]))


def cut_repetition(text: str, *, min_words: int = 6) -> str:
    """`text` cut after the first copy of a run of words that repeats back to back until the end of the text.

    Small models fall into loops ("The answer is 42. The answer is 42. ...") until max_tokens; the loop adds
    nothing and buries the answer. A run of p words counts as a loop when it occurs at least
    max(3, ceil(min_words / p)) times in a row and nothing else follows: the text is cut after its first copy,
    keeping whatever came before. Text that merely repeats a phrase somewhere in the middle is left as is.
    Compares words, so it works for any model and language with spaces; it reads the last
    MAX_REPEAT_WINDOW words only.
    """
    words = _WORD.findall(text)
    offset = max(0, len(words) - MAX_REPEAT_WINDOW)  # bounded work on huge replies: look at the last words only
    keys = [w.rstrip() for w in words[offset:]]
    n = len(keys)
    keep = n  # a loop can be read from any of its rotations: keep the shortest text, up to its first full copy
    for p in range(1, min(MAX_REPEAT_SPAN, n // 3) + 1):
        copies = max(3, -(-min_words // p))
        for tail in range(p):  # the last copy may be cut short by max_tokens: a tail that starts the run again
            end = n - tail
            if end - p < 0 or not _starts_run(keys[end:], keys[end - p:end - p + tail]):
                continue
            start = end - p
            while start - p >= 0 and keys[start - p:start] == keys[start:start + p]:
                start -= p
            if (end - start) // p >= copies:
                keep = min(keep, start + p)
    return "".join(words[:offset + keep]).rstrip() if keep < n else text


def clean_text(text: str) -> str:
    """`text` with every lone surrogate replaced by U+FFFD; a surrogate pair split in two code points is joined."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def clean_json(value: Any) -> Any:
    """`value` with `clean_text` applied to every string and key in it."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(str(key)): clean_json(inner) for key, inner in value.items()}
    if isinstance(value, list):
        return [clean_json(inner) for inner in value]
    return value


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):  # 1e999: JSON cannot write it back
        raise ValueError(f"number {literal[:20]!r} is not finite")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)
_NEXT_BRACKET = re.compile(r'(?:"[^"\\]*(?:\\.[^"\\]*)*"|[^"{}\[\]]+)*([{}\[\]"]|\Z)', re.DOTALL)
"""Skips strings and other text to the next bracket; a quote there opens a string never closed. The loop cannot
backtrack: wherever it stops, the group after it matches."""
_CLOSER = {"{": "}", "[": "]"}


def _object_end(text: str, start: int) -> tuple[int | None, int]:
    """Where the `{` at `start` is closed (None: never, wrongly, or past `MAX_JSON_DEPTH`), and how far it read."""
    expected: list[str] = []
    pos = start
    while True:
        found = _NEXT_BRACKET.match(text, pos)
        char, pos = found.group(1), found.end()  # type: ignore[union-attr]  (the pattern matches everywhere)
        if char in _CLOSER:
            if len(expected) == MAX_JSON_DEPTH:
                return None, pos
            expected.append(_CLOSER[char])
        elif char in ("", '"'):
            return None, len(text)
        elif expected.pop() != char:
            return None, pos
        elif not expected:
            return pos, pos


def first_json_object(text: str) -> dict[str, Any] | None:
    """The first `{...}` in `text` that decodes to a usable JSON object, or None.

    Each `{` is a candidate. A structural scan finds where it closes and stops at `MAX_JSON_DEPTH`; only a
    closed candidate is decoded. Every candidate costs what its scan read; the total is bounded by `SCAN_FACTOR`
    times the text's length plus `SCAN_FLOOR`, and the candidates by `MAX_CANDIDATES`, so a reply built to make
    the search quadratic (many `{` that each start a long failing scan) ends in None instead of blocking. An
    integer past Python's 4,300-digit limit, NaN, Infinity or a number that overflows to infinity make a candidate
    unusable.
    """
    budget = SCAN_FACTOR * len(text) + SCAN_FLOOR
    start = text.find("{")
    for _ in range(MAX_CANDIDATES):
        if start == -1 or budget <= 0:
            break
        end, read = _object_end(text, start)
        budget -= read - start
        if end is not None:
            try:
                return clean_json(_DECODER.decode(text[start:end]))
            except ValueError:  # not JSON after all, a huge integer, NaN, 1e999
                pass
        start = text.find("{", start + 1)
    return None


def model_json(model: BaseModel, *, indent: int | None = None) -> str:
    """`model.model_dump_json()`; where a string in the model holds a lone surrogate, that string cleaned."""
    try:
        return model.model_dump_json(indent=indent)
    except PydanticSerializationError:  # a lone surrogate that came in by a path that does not clean text
        return json.dumps(clean_json(model.model_dump(mode="json")), ensure_ascii=False, indent=indent)


_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""C0 controls but newline and tab, DEL, C1 controls (U+009B is CSI by itself), and the bidi marks, embeddings,
overrides and isolates."""


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal_safe(text: str) -> str:
    """`text` with each control character (but newline and tab) and bidi control shown as `\\x1b` / `\\u202e`."""
    return _UNSAFE.sub(_visible, text)


def json_terminal_safe(text: str) -> str:
    """JSON text with the same characters written as JSON escapes (`\\u001b`): still valid JSON, and inert.

    Only for JSON, where each such character can only stand inside a string."""
    return _UNSAFE.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def word_set(text: str) -> set[str]:
    """The lower-cased words of `text` (letters and digits): what two texts share, e.g. a copied example."""
    return {w.lower() for w in re.findall(r"[^\W_]+", text)}
