"""Model-written text made safe: lone surrogates, JSON objects taken from replies, models dumped whatever they hold."""

from __future__ import annotations

import json
import time

import pytest

from agentflow.textsafe import MAX_JSON_DEPTH, clean_json, clean_text, first_json_object, model_json
from agentflow.trajectory import Trajectory


@pytest.mark.parametrize(("text", "expected"), [
    ("plain", "plain"),
    ("café 😀", "café 😀"),
    ("cut \ud83d", "cut \ufffd"),            # half an emoji at the end of a reply
    ("\ude00 start", "\ufffd start"),
    ("\ud83d\ude00", "😀"),                  # a pair split in two code points is joined, not replaced
])
def test_clean_text(text: str, expected: str) -> None:
    assert clean_text(text) == expected
    clean_text(text).encode("utf-8")


def test_clean_json_cleans_keys_and_nested_strings() -> None:
    assert clean_json({"k\ud83d": ["v\udc00", {"x": 1}], "n": None}) == {"k\ufffd": ["v\ufffd", {"x": 1}], "n": None}


@pytest.mark.parametrize(("text", "expected"), [
    ('{"tool_name": "echo"}', {"tool_name": "echo"}),
    ('Sure:\n```json\n{"a": 1}\n```', {"a": 1}),
    ('he said "use {x} then" {"a": "b"}', {"a": "b"}),   # a quote in prose does not hide the object after it
    ('{"a": "}"} {"b": 2}', {"a": "}"}),
    ('{"a": "\\"}"}', {"a": '"}'}),
    ('{"a": "\\ud83d"}', {"a": "\ufffd"}),                 # the escape of half an emoji, decoded and cleaned
    ('{"a": "\\ud83d\\ude00"}', {"a": "😀"}),
    ('{"a": [1}', None),
    ('{"a": NaN}', None),
    ('{"a": 1e999}', None),
    ('{"a": ' + "7" * 4301 + "}", None),                  # past Python's int conversion limit
    ('{"a": ' + "7" * 4300 + "}", {"a": int("7" * 4300)}),
    ("no object", None),
    # unclosed `{` before the object: each scans to the end; a short reply is still searched in full (the fuzz
    # test found this one when the budget was twice the reply's length)
    ('{{{00{"a": null, "tool_name": null, "q": null}echoechotyped00000000', {"a": None, "tool_name": None, "q": None}),
])
def test_first_json_object(text: str, expected: object) -> None:
    assert first_json_object(text) == expected


def test_depth_limit_is_exact() -> None:
    def nest(depth: int) -> str:  # `depth` containers in all, the outer object included
        return '{"a":' + "[" * (depth - 1) + "1" + "]" * (depth - 1) + "}"

    assert first_json_object(nest(MAX_JSON_DEPTH)) is not None
    assert first_json_object(nest(MAX_JSON_DEPTH + 1)) is None


@pytest.mark.parametrize("unit", ["{", '{"a":', '{"a": [1, {"b": "', '{"\\"', '{"a":"\\ud83d', "{1}", "{["])
def test_many_failing_candidates_cost_linear_time(unit: str) -> None:
    text = (unit * 100_000)[:200_000]
    start = time.perf_counter()
    assert first_json_object(text) is None
    assert time.perf_counter() - start < 2.0  # the old search: minutes on the worst of these


def test_model_json_writes_a_model_holding_a_lone_surrogate() -> None:
    traj = Trajectory(question="q \ud83d", answer="a")
    data = json.loads(model_json(traj, indent=2))
    assert data["question"] == "q \ufffd" and data["answer"] == "a"
    assert Trajectory.model_validate_json(model_json(traj)).question == "q \ufffd"
