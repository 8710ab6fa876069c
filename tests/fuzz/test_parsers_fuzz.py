"""Every reply parser on hostile replies: never raises, returns what its type says, in time linear in the reply,
and what it returns serialises and reloads. Where a parser replaced a regular expression or a decoder loop,
it agrees with the old one on the replies the old one handled. Fast tier by default; `-m slow`: 10,000 replies.
"""

from __future__ import annotations

import json
import re
import time

import pydantic_core
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agentflow.executor import parse_arguments, parse_cut_arguments
from agentflow.generator import extract_answer
from agentflow.planner import PlannerStep, parse_planner_reply
from agentflow.textsafe import MAX_JSON_DEPTH, clean_json, clean_text, first_json_object
from agentflow.verifier import parse_verdict
from tests.fuzz.strategies import ANY_CHAR, WORDS, json_values, replies

FUZZ = settings(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow,
                                                                     HealthCheck.data_too_large,
                                                                     HealthCheck.large_base_example])
TOOLS = ["echo", "ask", "typed"]
PARSE_SECONDS = 2.0
"""Per parser call, for replies up to ~120 KB: the linear parsers take milliseconds, the old ones minutes."""


def depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    return 0


def timed(call, *args):  # noqa: ANN001, ANN202 - any parser
    start = time.perf_counter()
    result = call(*args)
    assert time.perf_counter() - start < PARSE_SECONDS, f"{call.__name__} blocked on a {len(args[0])}-char reply"
    return result


def check_parsers(text: str) -> None:
    step = timed(parse_planner_reply, text, TOOLS)
    assert step.tool_name in [*TOOLS, None]
    clean_step = parse_planner_reply(clean_text(text), TOOLS)  # what the flow parses: engines clean their text
    assert PlannerStep.model_validate_json(clean_step.model_dump_json()) == clean_step

    for parse in (parse_arguments, parse_cut_arguments):  # a cut reply is read through the same checks
        arguments = timed(parse, text)
        if arguments is not None:
            assert depth(arguments) <= MAX_JSON_DEPTH
            assert pydantic_core.from_json(pydantic_core.to_json(arguments)) == arguments

    verdict, parsed = timed(parse_verdict, text)
    assert verdict in ("STOP", "CONTINUE") and isinstance(parsed, bool)

    answer = timed(extract_answer, text)
    assert answer in text


@settings(FUZZ, max_examples=400)
@given(text=replies())
def test_parsers_take_any_reply(text: str) -> None:
    check_parsers(text)


@pytest.mark.slow
@settings(FUZZ, max_examples=10_000)
@given(text=replies())
def test_parsers_take_ten_thousand_replies(text: str) -> None:
    check_parsers(text)


# -- agreement with the code replaced, on replies small enough for it ----------------------------------------

_OLD_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_OLD_OPEN_ANSWER = re.compile(r"<answer>(.*)$", re.IGNORECASE | re.DOTALL)


def old_extract_answer(text: str) -> str:
    closed = _OLD_ANSWER.findall(text)
    if closed:
        return closed[-1].strip()
    unclosed = _OLD_OPEN_ANSWER.search(text)
    return unclosed.group(1).strip() if unclosed else text.strip()


def old_first_json_object(text: str) -> dict | None:
    decoder = json.JSONDecoder()
    for start in (m.start() for m in re.finditer(r"\{", text)):
        try:
            value, _ = decoder.raw_decode(text[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


small_replies = st.lists(st.one_of(st.sampled_from(WORDS), st.text(ANY_CHAR, max_size=8),
                                   st.sampled_from(['{"a": 1}', '{"b": "x"}', "<answer>", "</answer>", " "])),
                         max_size=12).map("".join)


@settings(FUZZ, max_examples=400)
@given(text=small_replies)
def test_answer_extraction_agrees_with_the_old_regex(text: str) -> None:
    assert extract_answer(text) == old_extract_answer(text)


objects_in_prose = st.builds(lambda before, obj, after: before + json.dumps(obj) + after, small_replies,
                             st.dictionaries(st.sampled_from(["a", "tool_name", "q"]), json_values, max_size=3),
                             small_replies)


@settings(FUZZ, max_examples=300)
@given(text=st.one_of(small_replies, objects_in_prose))
def test_json_search_agrees_with_the_old_decoder_loop_where_that_was_usable(text: str) -> None:
    try:
        old = old_first_json_object(text)
        usable = old is not None and depth(old) <= MAX_JSON_DEPTH and json.dumps(old, allow_nan=False)
    except ValueError:  # the old loop raised (huge integer) or found NaN / Infinity
        usable = False
    assume(usable)
    assert first_json_object(text) == clean_json(old)  # the same object, its lone surrogates replaced
