"""The tool contract: a card the planner reads, a pydantic input schema, and an async `run`.

Adding a tool is one file in `agentflow/tools/`: subclass `Tool`, decorate it with `@register_tool`.
"""

from __future__ import annotations

import abc
import importlib
import pkgutil
import re
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentflow.engines.base import Completion, Message
from agentflow.errors import ConfigError, ToolInputError, UnknownToolError, validation_message
from agentflow.textsafe import clean_text

LLMCall = Callable[[list[Message]], Awaitable[Completion]]
"""How an LLM-backed tool asks its engine for text; the flow binds the engine and sampling settings."""


def trim_text(text: str, limit: int) -> str:
    """`text` with its whitespace collapsed, cut at a word boundary to at most `limit` characters (then " …")."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"


class ToolContext(BaseModel):
    """What a tool may use besides its arguments."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    llm: LLMCall | None = None
    timeout_s: float = 30.0
    question: str = ""
    """The question being answered (the `python` tool binds it for the code as `question`)."""
    steps: list[str] = Field(default_factory=list)
    """What the earlier turns' tools returned, oldest first (the `python` tool binds it as `steps`)."""


class ToolResult(BaseModel):
    """A tool's answer. `output` is what the planner sees in memory; `data` is the structured form."""

    output: str
    data: dict[str, Any] = Field(default_factory=dict)
    truncated: bool = False
    llm_calls: list[dict[str, Any]] = Field(default_factory=list, description="Prompts and replies of LLM calls.")

    @field_validator("output")
    @classmethod
    def _clean(cls, output: str) -> str:  # the output goes into later prompts, which engines encode as UTF-8
        return clean_text(output)


class ToolExample(BaseModel):
    """One worked call: for this question and sub-goal, this input. The executor sees it before its task."""

    model_config = ConfigDict(frozen=True)

    question: str
    sub_goal: str
    input: dict[str, Any]
    steps: str = Field("", description="What the executor is shown of earlier steps in this example (with "
                       "`executor_memory`): how a call uses a result found before it.")


class ToolSettings(BaseModel):
    """Per-tool settings from the config file; subclasses add fields."""

    model_config = ConfigDict(extra="forbid")

    examples: list[ToolExample] | None = Field(
        None, description="Worked calls shown to the executor in place of the tool's own (None: the tool's "
        "own): a config can show a small executor the shape of its task's calls.")
    description: str | None = Field(
        None, description="The line the planner's menu shows for this tool, in place of the tool's own (None: "
        "the tool's own). With `tool`, the same tool can be offered twice under two names, e.g. two "
        "`document_search` tools over two collections, each described by what it holds.")
    input: dict[str, Any] | None = Field(
        None, description="A fixed input for every call of this tool; the executor model is not asked. In "
        "string values, {question} and {sub_goal} are replaced by the question and the planner's sub-goal (other "
        "braces stay as written, so code can be given as is). For tools whose input is the same shape for every "
        "question of a task, e.g. a search whose query is the question itself.")

    def fixed_input(self, *, question: str, sub_goal: str) -> dict[str, Any] | None:
        """`input` with {question} and {sub_goal} replaced, or None when the executor writes the input."""
        if self.input is None:
            return None

        def fill(value: Any) -> Any:
            if isinstance(value, str):
                return value.replace("{question}", question).replace("{sub_goal}", sub_goal)
            return value

        return {key: fill(value) for key, value in self.input.items()}


class Tool(abc.ABC):
    """A tool with a card. Subclasses set the class attributes and implement `run`."""

    name: ClassVar[str]
    description: ClassVar[str]
    input_model: ClassVar[type[BaseModel]]
    output_description: ClassVar[str]
    limitations: ClassVar[str] = ""
    best_practices: ClassVar[str] = ""
    settings_model: ClassVar[type[ToolSettings]] = ToolSettings
    #: True when the tool calls an LLM (it then gets `ToolContext.llm`).
    uses_llm: ClassVar[bool] = False
    #: Input field the planner's sub-goal fills when the executor's reply is unusable (None: infer it).
    fallback_field: ClassVar[str | None] = None
    #: Worked calls (in the executor's reply format, see `executor_schema`), shown to the executor as prior
    #: exchanges: small models copy the shape of the input (one print, a question naming the subject) instead
    #: of inventing one. With a single example the bundled 135M model copies the example's own name.
    examples: ClassVar[tuple[ToolExample, ...]] = ()

    def __init__(self, settings: ToolSettings | None = None, *, name: str | None = None) -> None:
        self.settings = settings if settings is not None else self.settings_model()
        if name is not None:  # one tool class offered under a name of the config's (`create_tool`)
            self.name = name
        if self.settings.description is not None:
            self.description = self.settings.description

    def worked_examples(self) -> tuple[ToolExample, ...]:
        """The worked calls the executor is shown: the settings' when given, else the tool's own."""
        return self.examples if self.settings.examples is None else tuple(self.settings.examples)

    def input_schema(self) -> dict[str, Any]:
        """JSON schema of the tool's input."""
        return self.input_model.model_json_schema()

    def card(self) -> dict[str, Any]:
        """The tool card shown to the planner and by `agentflow tool list`."""
        return {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema(),
            "output": self.output_description,
            "limitations": self.limitations,
            "best_practices": self.best_practices,
            "examples": [example.model_dump() for example in self.worked_examples()],
        }

    def executor_schema(self) -> dict[str, Any]:
        """JSON schema the executor's reply is constrained to; by default the input schema."""
        return self.input_schema()

    def parse_input(self, arguments: dict[str, Any]) -> BaseModel:
        """Validate arguments against the input schema; raises ToolInputError with the reasons."""
        try:
            return self.input_model.model_validate(arguments)
        except ValidationError as err:
            reasons = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'input'}: {e['msg']}" for e in err.errors())
            raise ToolInputError(f"invalid input for tool {self.name!r}: {reasons}") from None

    async def check(self) -> None:  # noqa: B027 - optional hook
        """Fail early, with a ConfigError, when the tool cannot work as configured."""

    @abc.abstractmethod
    async def run(self, args: Any, ctx: ToolContext) -> ToolResult:
        """Run the tool on validated arguments. Raise ToolError (or a subclass) on failure."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


_REGISTRY: dict[str, type[Tool]] = {}


def register_tool(cls: type[Tool]) -> type[Tool]:
    """Class decorator that makes a tool available by name."""
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"tool name {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def _discover() -> None:
    import agentflow.tools as package

    for info in pkgutil.iter_modules(package.__path__):
        if info.name != "base":
            importlib.import_module(f"{package.__name__}.{info.name}")


def tool_classes() -> dict[str, type[Tool]]:
    """All registered tools by name (importing every module of `agentflow.tools`)."""
    _discover()
    return dict(sorted(_REGISTRY.items()))


TOOL_KEY = "tool"
"""Settings key naming the tool class when a config offers a tool under a name of its own."""


def tool_class_name(name: str, settings: dict[str, Any] | None) -> str:
    """The registered tool a config entry builds: its `tool` key, else its own name."""
    return str((settings or {}).get(TOOL_KEY, name))


def create_tool(name: str, settings: dict[str, Any] | None = None) -> Tool:
    """Build one tool from its config name and settings dict. The settings' `tool` key, when present, names the
    registered tool to build, which is then offered under `name` (e.g. `staff_directory: {tool: document_search,
    data_path: staff.json, description: ...}`)."""
    kind = tool_class_name(name, settings)
    settings = {key: value for key, value in (settings or {}).items() if key != TOOL_KEY}
    classes = tool_classes()
    if kind not in classes:
        raise UnknownToolError(f"unknown tool {kind!r}; available: {', '.join(classes)}")
    if kind != name and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", name):
        raise ConfigError(f"tool name {name!r}: a tool offered under a name of its own needs letters, digits, "
                          "'_' or '-' (a '.' is for MCP tools, SERVER.TOOL)")
    cls = classes[kind]
    try:
        parsed = cls.settings_model.model_validate(settings)
    except ValidationError as err:
        raise ConfigError(f"bad settings for tool {name!r}: {validation_message(err, cls.settings_model)}") from None
    return cls(parsed, name=None if kind == name else name)
