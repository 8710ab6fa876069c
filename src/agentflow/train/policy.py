"""The policy engine for training: a TransformersEngine whose planner replies start with a fixed prefix.

The untrained 135M planner almost never writes the planner's JSON on its own (about 1 reply in 10 names a
tool, and then only because the word "python" appears in its rambling), so rollouts carry no signal: every
trajectory of a question gets the same reward. A response prefix such as `{"tool_name": "` is the cheapest
form of constrained planner output that keeps the RL exact: the prefix is appended to the prompt after the
assistant header, identical for every trajectory, so it is prompt, not action. The model still samples every
token it is trained on, and the recorded log-probs stay those of the sampling distribution. The reply text
handed to the flow's parser is prefix + generated text, i.e. the JSON the planner "wrote".

Only planner conversations get the prefix (recognised by the planner's system prompt); executor, verifier and
analysis calls on the same engine are untouched.
"""

from __future__ import annotations

from typing import Any

from agentflow.config import FlowConfig, TransformersEngineConfig
from agentflow.engines.base import Completion, Engine, Message, SamplingParams
from agentflow.engines.hf import BASE_ADAPTER, AdapterView, TransformersEngine
from agentflow.planner import PLANNER_SYSTEM


def is_planner_call(messages: list[Message]) -> bool:
    return bool(messages) and messages[0].get("role") == "system" and messages[0].get("content") == PLANNER_SYSTEM


class PrefixingTokenizer:
    """A tokenizer that appends `prefix` to the generation prompt of planner conversations; all else delegates."""

    def __init__(self, tokenizer: Any, prefix: str) -> None:
        object.__setattr__(self, "raw", tokenizer)
        object.__setattr__(self, "prefix", prefix)

    def apply_chat_template(self, messages: list[Message], *args: Any, **kwargs: Any) -> Any:
        text = self.raw.apply_chat_template(messages, *args, **kwargs)
        if isinstance(text, str) and kwargs.get("add_generation_prompt") and is_planner_call(messages):
            text += self.prefix
        return text

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.raw(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.raw, name, value)


class PrefixedPlannerEngine(TransformersEngine):
    """TransformersEngine whose planner replies begin with `prefix` (see the module docstring).

    The prefix replaces schema-constrained decoding on this engine: a JSON grammar starts at `{`, which the
    prefix has already written, so the flow is told that this engine takes no schema (and records none to
    replay in the update).
    """

    def __init__(self, config: TransformersEngineConfig | None = None, *, model: Any, tokenizer: Any,
                 prefix: str) -> None:
        super().__init__(config, model=model, tokenizer=PrefixingTokenizer(tokenizer, prefix))
        self.supports_json_schema = False
        self.prefix = prefix

    async def generate(self, messages: list[Message], sampling: SamplingParams, *,
                       json_schema: dict[str, Any] | None = None, adapter: str | None = None) -> Completion:
        completion = await super().generate(messages, sampling, json_schema=json_schema, adapter=adapter)
        if is_planner_call(messages):
            completion = completion.model_copy(update={"text": self.prefix + completion.text})
        return completion

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "planner_prefix": self.prefix}


def adapter_name(role: str) -> str:
    """The PEFT adapter of a trained role: the planner's is PEFT's `default` (what a planner-only run saves and
    loads), every other role's is named after it."""
    return "default" if role == "planner" else role


def role_views(flow: FlowConfig, policy: Engine, config: Any) -> dict[str, Engine]:
    """Point every role that runs on the policy engine at its own view of it (`ENGINE@ROLE`): a trained role's
    calls go through its adapter, any other role's through the base model (frozen means frozen). `policy` is
    the engine that samples (the trainer's TransformersEngine, or its rollout engine: both take `adapter=`).
    Rewrites `flow`'s roles and engine table in place; returns the views to pass to `Flow.from_config`."""
    name = config.policy_engine_name
    views: dict[str, Engine] = {}
    for role in type(flow.roles).model_fields:
        role_config = getattr(flow.roles, role)
        if role_config.engine != name:
            continue
        view = f"{name}@{role}"
        flow.engines[view] = flow.engines[name]
        role_config.engine = view
        views[view] = AdapterView(policy, adapter_name(role) if role in config.train_roles else BASE_ADAPTER)
    return views
