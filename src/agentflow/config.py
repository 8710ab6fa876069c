"""Typed configuration of a flow: engines, the role → engine table, tools and limits.

Loaded from YAML (`FlowConfig.from_yaml`) or built in code. Unknown keys are errors, so no setting is
accepted and then ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from agentflow.engines.base import SamplingParams
from agentflow.errors import ConfigError, validation_message
from agentflow.tools.mcp.config import SERVER_NAME_PATTERN, McpServerConfig


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML config file holds; ConfigError when the file is missing or is not a YAML mapping."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(raw).__name__}")
    return raw


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LlamaCppEngineConfig(_Strict):
    """Embedded llama.cpp (through `xllamacpp`): fast CPU inference of GGUF files, no server to start."""

    kind: Literal["llamacpp"] = "llamacpp"
    model_path: str | None = Field(None, description="GGUF file; default: the bundled SmolLM2-135M-Instruct.")
    n_ctx: int = Field(8192, ge=256, description="Context size shared by all parallel slots.")
    n_parallel: int = Field(4, ge=1, description="Concurrent sequences (slots) decoded together.")
    n_threads: int | None = Field(None, ge=1, description="CPU threads; default: half the cores, 1 to 4.")
    n_gpu_layers: int = Field(0, ge=0, description="Layers offloaded to a GPU, when built with one.")
    requantize: Literal["q8_0"] | None = Field(
        None, description="Re-quantise the model to Q8_0 before loading (once; cached under the agentflow cache). "
        "The bundled file is Q4_1, whose CPU kernels are slower: Q8_0 reads prompts 1.8x faster on the 2-core "
        "reference machine (docs/engines.md). Llama-architecture GGUF files only.")
    adapter: str | None = Field(
        None, description="PEFT LoRA adapter directory applied over the model (at scale 1), e.g. one trained by "
        "`agentflow train`; `bundled:NAME` is one shipped with the package. Written once as a llama.cpp LoRA "
        "file (cached). Llama-architecture models only.")


class OpenAIEngineConfig(_Strict):
    """Any OpenAI-compatible HTTP server: vLLM, SGLang, Ollama, llama.cpp server, OpenAI, gateways."""

    kind: Literal["openai"] = "openai"
    model: str = Field(..., description="Model name sent with each request (pinned; recorded in trajectories).")
    base_url: str = Field("https://api.openai.com/v1", description="Server root, ending in /v1.")
    api_key_env: str | None = Field("OPENAI_API_KEY", description="Environment variable holding the API key.")
    timeout_s: float = Field(60.0, gt=0, description="Timeout of one HTTP request.")
    max_retries: int = Field(3, ge=0, description="Retries on timeouts, 429, 5xx and malformed replies.")
    json_schema: bool = Field(True, description="Send response_format json_schema for structured roles.")
    logprobs: bool = Field(False, description="Ask for token log-probs (needed when this engine is the policy).")
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description="Extra JSON fields sent with every request, for server-specific "
        "settings (vLLM: top_k, return_tokens_as_token_ids; llama.cpp server: top_k, min_p).")


class TransformersEngineConfig(_Strict):
    """Hugging Face transformers (+ optional PEFT adapter): the trainable planner's engine."""

    kind: Literal["transformers"] = "transformers"
    model: str | None = Field(None, description="HF checkpoint directory or GGUF file; default: bundled model.")
    adapter: str | None = Field(None, description="PEFT adapter directory applied on top of `model`; "
                                "`bundled:NAME` is one shipped with the package (bundled:lookup_compute).")
    device: str = Field("auto", description="'auto', 'cpu', 'cuda', 'cuda:1', ...")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="'auto' = bfloat16 on CUDA where supported, float32 on CPU.")
    max_batch_size: int = Field(8, ge=1, description="Concurrent requests batched into one generate call.")
    n_threads: int | None = Field(None, ge=1, description="torch CPU threads (process-wide); default: torch's own.")
    json_schema: bool = Field(True, description="Constrain replies to the JSON schema a role asks for (the "
                              "planner's tool enum, the executor's tool input) with llguidance; false = free "
                              "text, parsed tolerantly.")
    seed: int | None = Field(None, description="Start of the engine's sampling stream (unseeded requests draw "
                             "from it, call after call); None: fresh OS entropy. A trainer sets its run seed.")


EngineConfig = Annotated[
    LlamaCppEngineConfig | OpenAIEngineConfig | TransformersEngineConfig, Field(discriminator="kind")
]


class RoleConfig(_Strict):
    """Which engine a role uses, and with which sampling settings."""

    engine: str = Field("default", description="Name of an entry in `engines`.")
    sampling: SamplingParams = Field(default_factory=SamplingParams)


def _role(max_tokens: int, temperature: float = 0.0) -> Any:
    return Field(default_factory=lambda: RoleConfig(
        sampling=SamplingParams(max_tokens=max_tokens, temperature=temperature)))


class RolesConfig(_Strict):
    """The role → engine table."""

    planner: RoleConfig = _role(128)
    executor: RoleConfig = _role(160)
    verifier: RoleConfig = _role(64)
    generator: RoleConfig = _role(160)
    tools: RoleConfig = _role(256)
    """Engine of LLM-backed tools (code writing in `python`, `base_generator`). The planner's settings also
    drive its query analysis."""


class LimitsConfig(_Strict):
    max_turns: int = Field(3, ge=1, description="Planner turns before the generator must answer.")
    max_seconds: float = Field(300.0, gt=0, description="Wall-clock budget of one question, enforced.")
    tool_timeout_s: float = Field(30.0, gt=0, description="Wall-clock budget of one tool call.")
    memory_tokens: int = Field(768, ge=64, description="Token budget of memory rendered into a prompt.")
    result_chars: int = Field(600, ge=50, description="Characters of a tool result kept in rendered memory.")
    plan_chars: int = Field(
        150, ge=1, description="Longest sub-goal and longest context the planner's JSON schema allows. A reply "
        "decoded under the schema then fits in about 2 * plan_chars + 30 tokens: a planner max_tokens at least "
        "that large never cuts the reply inside its JSON.")
    text_chars: int = Field(
        2000, ge=50, description="Characters of one model-written text (query analysis, sub-goal, context, tool "
        "name) shown in a later prompt; the trajectory keeps it whole.")


def _default_engines() -> dict[str, Any]:
    return {"default": LlamaCppEngineConfig()}


def _default_tools() -> dict[str, dict[str, Any]]:
    return {"python": {}, "wikipedia_search": {}, "base_generator": {}}


STOP_ACTION = "answer"
"""The planner's action that ends the turn loop (`FlowConfig.planner_stop`)."""
STOP_DESCRIPTION = "stop using tools: memory holds what the question needs; the final answer is written now"


class FlowConfig(_Strict):
    """Everything a flow needs. The defaults run offline on the bundled model."""

    engines: dict[str, EngineConfig] = Field(default_factory=_default_engines)
    roles: RolesConfig = Field(default_factory=RolesConfig)
    tools: dict[str, dict[str, Any]] = Field(
        default_factory=_default_tools, description="Enabled tools by name, each with its settings.")
    mcp_servers: dict[Annotated[str, StringConstraints(pattern=SERVER_NAME_PATTERN)], McpServerConfig] = Field(
        default_factory=dict, description="MCP servers by name: every tool each one offers becomes a flow tool "
        "named SERVER.TOOL (see docs/tools.md).")
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    query_analysis: bool = Field(True, description="Run the planner's query analysis before the first turn.")
    executor_memory: bool = Field(
        False, description="Show the executor the memory of earlier turns, not only the planner's sub-goal and "
        "context (the paper's executor sees the action alone). For planners too small to copy what a later "
        "tool needs (a number found at turn 1) into their context.")
    planner_memory_tools: bool = Field(
        True, description="Name the tool of each earlier step in the planner's memory. false: the planner sees "
        "sub-goals and results only. A small planner copies the tool named in its memory: the bundled 135M model "
        "picks the turn-1 tool again at turn 2 with probability 0.99 when it is named, so it never tries a "
        "second tool (docs/training.md).")
    verify: bool = Field(True, description="Ask the verifier after each turn whether memory suffices (STOP ends "
                         "the loop). false: no verifier call, every question runs max_turns turns: for models "
                         "whose verdicts are noise, on tasks whose number of steps is known.")
    planner_tool_last: bool = Field(
        False, description="The planner writes its context and sub-goal first and names the tool last, the order "
        "of the paper's planner (Context, Sub-Goal, Tool Name): the tool is then chosen after the planner has "
        "said what the step must do. false: the tool first (a reply cut by max_tokens still names its tool).")
    shuffle_tools: bool = Field(
        False, description="Show the planner its tool menu in a shuffled order, fixed per question, run variant "
        "and turn. Small models tend to pick the first tool listed; shuffling removes that position bias and "
        "lets a trained planner explore every tool.")
    planner_stop: bool = Field(
        False, description="Offer the planner one more action besides the tools, `answer` (`STOP_ACTION`): the "
        "turn loop ends there and the generator answers from memory. A question that needs one tool can then "
        "stop after one, decided by the planner itself (the trainable policy) instead of the verifier. At turn 1 "
        "it answers with no tool at all.")
    direct_tool_input: bool = Field(
        False, description="Skip the executor model for tools with one main text field (python: task, "
        "wikipedia_search: query, ...): the planner's sub-goal is that field. One model call less per turn; "
        "for small models whose executor replies are worse than the sub-goal itself.")

    def model_post_init(self, __context: Any) -> None:
        for role_name in RolesConfig.model_fields:
            role: RoleConfig = getattr(self.roles, role_name)
            if role.engine not in self.engines:
                raise ConfigError(f"role {role_name!r} names engine {role.engine!r}, which is not in "
                                  f"engines ({', '.join(self.engines) or 'none'})")
        if not self.tools and not self.mcp_servers:
            raise ConfigError("no tools enabled")
        if self.planner_stop and STOP_ACTION in self.tools:
            raise ConfigError(f"planner_stop offers the action {STOP_ACTION!r}: a tool of that name would be "
                              "unreachable; rename the tool")

    @classmethod
    def from_yaml(cls, path: str | Path) -> FlowConfig:
        return cls.from_dict(read_yaml_mapping(path), source=str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], *, source: str = "config") -> FlowConfig:
        try:
            return cls.model_validate(raw)
        except ValidationError as err:
            raise ConfigError(f"{source}: {validation_message(err, cls)}") from None


BUNDLED_FLOW = Path(__file__).parent / "configs" / "flow_default.yaml"
"""The flow run when no config is given with the bundled model: the settings measured best for it."""


def bundled_flow_config() -> FlowConfig:
    """`flow_default.yaml`: the configuration this project measured best for the bundled 135M model. Code
    defaults (`FlowConfig()`) are the paper's flow (query analysis, verifier, three turns), the base for any
    model a user names."""
    return FlowConfig.from_yaml(BUNDLED_FLOW)

