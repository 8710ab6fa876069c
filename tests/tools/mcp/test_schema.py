"""Input schemas as servers advertise them: checked once, then every executor reply validated against them."""

from __future__ import annotations

import pytest

from agentflow.errors import ToolInputError
from agentflow.tools.mcp.schema import LOOSE_EXECUTOR_SCHEMA, InputSchema, InvalidSchemaError

TIME_SCHEMA = {"type": "object", "properties": {"timezone": {"type": "string", "description": "IANA name"}},
               "required": ["timezone"]}


def test_a_valid_schema_is_used_for_constrained_decoding_as_it_is():
    schema = InputSchema.check(TIME_SCHEMA)
    assert schema.executor_schema == TIME_SCHEMA and schema.constrained_note == ""


def test_replies_are_validated_with_every_reason_named():
    schema = InputSchema.check({"type": "object", "required": ["a", "b"],
                                "properties": {"a": {"type": "integer", "minimum": 0}, "b": {"type": "string"}}})
    schema.validate({"a": 1, "b": "x"}, tool="s.t")
    with pytest.raises(ToolInputError, match=r"input for tool 's.t': a: -1 is less than the minimum of 0") as err:
        schema.validate({"a": -1}, tool="s.t")
    assert "'b' is a required property" in str(err.value)


def test_nested_paths_and_internal_references_work():
    schema = InputSchema.check({"type": "object", "$defs": {"point": {"type": "object", "properties": {
        "x": {"type": "number"}}, "required": ["x"]}}, "properties": {"at": {"$ref": "#/$defs/point"}}})
    schema.validate({"at": {"x": 1.5}}, tool="t")
    with pytest.raises(ToolInputError, match="at.x: 'one' is not of type 'number'"):
        schema.validate({"at": {"x": "one"}}, tool="t")


def test_the_schema_dialect_it_names_is_the_one_used():
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
              "properties": {"n": {"type": "number", "maximum": 5, "exclusiveMaximum": True}}}
    schema = InputSchema.check(draft4)
    with pytest.raises(ToolInputError, match="n: 5 is greater than or equal to the maximum of 5"):
        schema.validate({"n": 5}, tool="t")


@pytest.mark.parametrize(("schema", "reason"), [
    ({"type": "object", "properties": {"n": {"type": "integer", "minimum": "zero"}}}, "'zero' is not of type"),
    ({"type": "objekt"}, "tool arguments must be an object"),
    ({"type": "object", "required": "name"}, "'name' is not of type 'array'"),
    ({"type": "object", "properties": {"p": {"$ref": "#/$defs/missing"}}}, "'#/$defs/missing' does not resolve"),
    ({"type": "object", "properties": {"p": {"$ref": "https://example.com/s.json"}}}, "does not resolve"),
    (["not", "an", "object"], "expected a JSON object, got list"),
])
def test_invalid_schemas_are_refused_with_the_reason(schema, reason):
    with pytest.raises(InvalidSchemaError, match=reason.replace("$", r"\$").replace("[", r"\[")):
        InputSchema.check(schema)


def test_a_schema_beyond_constrained_decoding_falls_back_to_any_object_but_is_still_validated():
    schema = InputSchema.check({"type": "object", "properties": {"word": {"type": "string", "not": {"enum": ["x"]}}}})
    assert schema.executor_schema == LOOSE_EXECUTOR_SCHEMA
    assert "not" in schema.constrained_note
    with pytest.raises(ToolInputError, match="word: 'x' should not be valid"):
        schema.validate({"word": "x"}, tool="t")
