"""A server's input schema, checked once: valid JSON Schema with resolvable references, and usable by
constrained decoding; then the validator every executor reply goes through before the call."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator, SchemaError
from jsonschema.exceptions import relevance
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from agentflow.errors import ToolInputError

log = logging.getLogger(__name__)

LOOSE_EXECUTOR_SCHEMA: dict[str, Any] = {"type": "object"}
"""What the executor is constrained to when the server's schema is beyond llguidance: any JSON object."""

MAX_REPORTED_ERRORS = 5


class InvalidSchemaError(ValueError):
    """The schema is not one we can validate against; the message says why."""


@dataclass(frozen=True)
class InputSchema:
    """A checked input schema, its validator, and the schema the executor's reply is constrained to."""

    schema: dict[str, Any]
    validator: Validator
    executor_schema: dict[str, Any]
    constrained_note: str = ""
    """Empty when constrained decoding uses the full schema; else why it falls back to any JSON object."""

    @classmethod
    def check(cls, schema: Any) -> InputSchema:
        """Raises InvalidSchemaError when `schema` is not a valid JSON Schema for an object of arguments."""
        if not isinstance(schema, dict):
            raise InvalidSchemaError(f"expected a JSON object, got {type(schema).__name__}")
        if schema.get("type", "object") != "object":
            raise InvalidSchemaError(f"tool arguments must be an object, the schema says type {schema['type']!r}")
        validator_cls = validator_for(schema, default=Draft202012Validator)
        try:
            validator_cls.check_schema(schema)
        except SchemaError as err:
            at = "/".join(map(str, err.path))
            raise InvalidSchemaError(f"{err.message}" + (f" (at {at})" if at else "")) from None
        _check_references(schema)
        # an empty registry: references resolve inside the schema, never over the network
        validator = validator_cls(schema, registry=Registry())
        note = _constrained_decoding_problem(schema)
        if note:
            log.info("input schema beyond constrained decoding (%s); the executor is held to a JSON object", note)
        return cls(schema=schema, validator=validator, executor_schema=LOOSE_EXECUTOR_SCHEMA if note else schema,
                   constrained_note=note)

    def validate(self, arguments: dict[str, Any], *, tool: str) -> None:
        """Raises ToolInputError listing what is wrong with `arguments`, most relevant first."""
        try:
            errors = sorted(self.validator.iter_errors(arguments), key=relevance)
        except Unresolvable as err:  # checked at start; a schema can still hide a reference in a rare keyword
            raise ToolInputError(f"invalid input for tool {tool!r}: its schema has an unresolvable reference "
                                 f"({err})") from None
        if not errors:
            return
        reasons = "; ".join(f"{'.'.join(map(str, e.absolute_path)) or 'input'}: {e.message}"
                            for e in errors[:MAX_REPORTED_ERRORS])
        more = f" (and {len(errors) - MAX_REPORTED_ERRORS} more)" if len(errors) > MAX_REPORTED_ERRORS else ""
        raise ToolInputError(f"invalid input for tool {tool!r}: {reasons}{more}")


def _references(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [ref for value in node.values() for ref in _references(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _references(value)]
    return []


def _check_references(schema: dict[str, Any]) -> None:
    resource = Resource.from_contents(schema, default_specification=DRAFT202012)
    base = resource.id() or "urn:agentflow:input-schema"
    resolver = Registry().with_resource(base, resource).resolver(base_uri=base)
    for ref in _references(schema):
        try:
            resolver.lookup(ref)
        except Unresolvable:
            raise InvalidSchemaError(f"reference {ref!r} does not resolve inside the schema") from None


def _constrained_decoding_problem(schema: dict[str, Any]) -> str:
    """Why llguidance (the transformers engine's constrained decoding) cannot compile `schema`, or ''."""
    import llguidance

    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema)
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None)
    except Exception as err:  # llguidance raises plain exceptions for schemas it cannot read
        return str(err)[:300]
    return "; ".join(messages)[:300] if failed else ""
