"""Typed errors. Every failure the flow can meet has a class, so callers can record it by type."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError


class AgentFlowError(Exception):
    """Base class for all errors raised by agentflow."""

    kind = "error"


class ConfigError(AgentFlowError):
    """A configuration that cannot work (unknown engine, missing API key, unconfigured backend)."""

    kind = "config"


class ModelNotFoundError(ConfigError):
    """A model file or checkpoint that is not on disk."""

    kind = "model_not_found"


class SandboxUnavailableError(ConfigError):
    """The kernel lacks a mechanism the chosen sandbox isolation level needs; the message says how to enable it."""

    kind = "sandbox_unavailable"


class EngineError(AgentFlowError):
    """A call to a language-model engine failed."""

    kind = "engine"
    retryable = False


class EngineTimeoutError(EngineError):
    kind = "engine_timeout"
    retryable = True


class EngineRateLimitError(EngineError):
    kind = "engine_rate_limit"
    retryable = True


class EngineServerError(EngineError):
    """The server answered 5xx."""

    kind = "engine_server_error"
    retryable = True


class EngineUnavailableError(EngineError):
    """The server could not be reached (connection refused, DNS, reset)."""

    kind = "engine_unavailable"
    retryable = True


class EngineBadRequestError(EngineError):
    """The server refused the request (4xx other than 429): retrying will not help."""

    kind = "engine_bad_request"


class EngineContextOverflowError(EngineBadRequestError):
    """The prompt plus the reply budget exceed the model's context: the flow's own growth (memory, tool output)
    caused it, so it is scored as the policy's failure, not excluded as infrastructure."""

    kind = "context_overflow"


_OVERFLOW_MARKERS = ("context_length_exceeded", "maximum context length", "exceed_context_size",
                     "exceeds the available context size", "longer than the model's context length",
                     "context window", "too many tokens")


def bad_request_error(message: str) -> EngineBadRequestError:
    """The typed error for a refused request: a context overflow when the server's message says so (OpenAI,
    vLLM, SGLang and llama.cpp word it differently), else a plain bad request."""
    lowered = message.lower()
    if any(marker in lowered for marker in _OVERFLOW_MARKERS):
        return EngineContextOverflowError(message)
    return EngineBadRequestError(message)


class EngineResponseError(EngineError):
    """The server answered, but not with a usable completion (malformed JSON, no choices, null text)."""

    kind = "engine_bad_response"
    retryable = True


class ToolError(AgentFlowError):
    """A tool failed; the message is shown to the planner in memory."""

    kind = "tool"


class ToolInputError(ToolError):
    """Arguments that do not match the tool's input schema."""

    kind = "tool_input"


class ToolTimeoutError(ToolError):
    kind = "tool_timeout"


class UnknownToolError(ToolError):
    kind = "unknown_tool"


class QuestionTimeoutError(AgentFlowError):
    """The per-question wall-clock budget ran out."""

    kind = "question_timeout"


INFRASTRUCTURE_ERRORS: tuple[type[AgentFlowError], ...] = (EngineError, ConfigError)
"""Failures that say nothing about the policy's answer: evaluation and training count them apart."""


def validation_message(err: ValidationError, model: type[BaseModel] | None = None) -> str:
    """Pydantic's errors as one line (`key.path: problem; ...`), without its URLs; an unknown key names the
    nearest known one."""
    parts = []
    for error in err.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "top level"
        if error["type"] == "extra_forbidden":
            hint = _nearest_key(model, [str(p) for p in error["loc"]]) if model else None
            parts.append(f"unknown key {where}" + (f" (did you mean {hint}?)" if hint else ""))
        else:
            got = error.get("input")
            shown = f" (got {got!r})" if isinstance(got, str | int | float | bool) else ""
            parts.append(f"{where}: {error['msg']}{shown}")
    return "; ".join(parts)


def _nearest_key(model: type[BaseModel], loc: list[str]) -> str | None:
    """The known field closest to the last key of `loc`, found by walking the models along it."""
    import difflib

    from pydantic import BaseModel

    current: Any = model
    for part in loc[:-1]:
        fields = getattr(current, "model_fields", None)
        if fields is None or part not in fields:
            return None
        annotation = fields[part].annotation
        current = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        if current is None:
            return None
    names = list(getattr(current, "model_fields", {}))
    match = difflib.get_close_matches(loc[-1], names, n=1, cutoff=0.6)
    return ".".join([*loc[:-1], match[0]]) if match else None
