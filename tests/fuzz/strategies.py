"""Hypothesis strategies of hostile model replies, for every parser and for whole flows.

A reply is drawn from text of any code point (lone surrogates, NUL, controls included), JSON of the shapes the
flow expects with hostile values (lone-surrogate escapes, huge integers, deep nesting, non-finite numbers),
JSON cut off at any character (as `max_tokens` cuts it), long runs of the fragments that made regular
expressions backtrack, replies of about 100 KB, and concatenations of all of these.
`max_run` bounds the length of the runs, so the same strategies can measure the old, quadratic parsers.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

ANY_CHAR = st.characters(codec=None, exclude_categories=())
"""Every code point, lone surrogates included (Hypothesis leaves those out of plain `st.text()`)."""

KEYS = ["tool_name", "sub_goal", "context", "conclusion", "analysis", "query", "Tool Name", "Sub-Goal", "tool"]
WORDS = ["echo", "ask", "typed", "STOP", "CONTINUE", "<answer>", "</answer>", "<ANSWER>", "</Answer>", "answer",
         "tool_name:", "Sub-goal:", "Context:", "Tool:", "```json", "```", "İ", "ß", "\x00", "\ud83d", "\ude00",
         "\\ud83d", "\\ude00", "\\u", "\\", '"', "'", "{", "}", "[", "]", ":", ",", "NaN", "Infinity", "-Infinity",
         "1e999", "-0", "9" * 40, "hang", "fail", "crash"]
RUN_UNITS = ["\n", " \n", " ", "\t", "\r\n", "<answer>", "<answer>x", "</answer>", "{", "[", "{\"a\":", "[{\"a\":",
             '"', "\\", "\\ud83d", "STOP ", "tool_name: ", "context\n", '"context" ', "{}", "{1}", "9", "a"]

words = st.sampled_from(WORDS)
short_text = st.text(ANY_CHAR, max_size=40)


def runs(max_run: int) -> st.SearchStrategy[str]:
    """A fragment repeated up to `max_run` times: the inputs on which backtracking parsers went quadratic."""
    return st.builds(lambda unit, n: unit * n, st.sampled_from(RUN_UNITS), st.integers(1, max_run))


def big_integers() -> st.SearchStrategy[str]:
    """JSON integers around and past Python's 4,300-digit conversion limit."""
    return st.builds(lambda sign, n: sign + "7" * n, st.sampled_from(["", "-"]), st.integers(4200, 6000))


def nested(max_depth: int) -> st.SearchStrategy[str]:
    """JSON nested `depth` deep, closed or left open; from harmless to past every recursion limit."""
    def build(opener: str, depth: int, closed: bool) -> str:
        closer = "]" if opener == "[" else "}"
        return opener * depth + "1" + (closer * depth if closed else "")
    return st.builds(build, st.sampled_from(["[", '{"a":']), st.integers(1, max_depth), st.booleans())


scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), short_text, words)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.one_of(st.sampled_from(KEYS), short_text), inner, max_size=4),
                           max_leaves=12)
"""JSON-able values, a few levels deep (deep nesting comes from `nested` as raw text)."""
wrappers = st.sampled_from([("", ""), ("```json\n", "\n```"), ("Sure! ", " Done."), ("<answer>", "")])


@st.composite
def json_replies(draw: st.DrawFn, raw_values: st.SearchStrategy[str | None]) -> str:
    """A JSON object with the keys of some role, hostile values, then maybe cut off and wrapped in prose."""
    keys = draw(st.lists(st.sampled_from(KEYS), max_size=5, unique=True))
    obj = {key: draw(json_values) for key in keys}
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()))
    raw = draw(raw_values)
    if raw is not None and text != "{}":  # a value no json.dumps writes: a huge integer, deep nesting, a run
        text = text[:-1] + f', "{draw(st.sampled_from(KEYS))}": {raw}}}'
    if draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]  # cut by max_tokens, perhaps inside an escape
    prefix, suffix = draw(wrappers)
    return prefix + text + suffix


def huge_replies() -> st.SearchStrategy[str]:
    """About 100 KB: a reply no engine should send, copied whole into later prompts before the cut."""
    return st.builds(lambda unit, n: unit * (n // len(unit)), st.sampled_from(["x", "echo ", "é", "ab\n"]),
                     st.integers(90_000, 110_000))


def replies(*, max_run: int = 20_000, max_depth: int = 3_000, huge: bool = True) -> st.SearchStrategy[str]:
    """Any reply a model might send, well-formed or hostile."""
    run, deep, big = runs(max_run), nested(max_depth), big_integers()
    structured = json_replies(st.one_of(st.none(), big, deep, run))
    single = st.one_of(st.text(ANY_CHAR, max_size=300), words, structured, run, deep, big)
    parts = st.one_of(single, *([huge_replies()] if huge else []))
    return st.one_of(parts, st.lists(st.one_of(single, words), min_size=2, max_size=4).map("".join))
