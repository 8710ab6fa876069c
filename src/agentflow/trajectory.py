"""The trajectory record: everything one question's run did, as a documented, versioned JSON format.

Stable keys (format version 1): `question`, `answer`, `turns` (each with `tool` and `verdict`).
`docs/trajectory.md` documents every field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from agentflow.engines.base import Completion, Message, SamplingParams
from agentflow.textsafe import model_json

TRAJECTORY_FORMAT_VERSION = 1


class Failure(BaseModel):
    """A recorded failure: where it happened, its type, and the message."""

    stage: str = Field(..., description="'analysis', 'planner', 'executor', 'tool', 'verifier', 'generator', 'flow'.")
    kind: str = Field(..., description="Error kind, e.g. 'engine_timeout', 'tool_input', 'parse', 'question_timeout'.")
    message: str
    turn: int | None = None
    infrastructure: bool = Field(
        False, description="True when the failure is outside the policy's control (an engine down or failing "
        "after its retries, a configuration error): the run says nothing about the policy, so evaluation reports "
        "it apart and training excludes it. False for what the policy's choices cause (its own time limit, a "
        "context overflow, tool errors): scored like any other answer.")


class LLMCall(BaseModel):
    """One engine call: the prompt as sent, the settings as sent, and the reply."""

    role: str
    engine: dict[str, Any]
    sampling: SamplingParams
    messages: list[Message]
    json_schema: bool = False
    response_schema: dict[str, Any] | None = Field(
        None, description="The JSON schema the reply was constrained to, when it was (a trainer replays it to "
        "recompute the log-probs of the masked distribution).")
    completion: Completion | None = None
    seconds: float = 0.0

    @property
    def text(self) -> str:
        return self.completion.text if self.completion else ""


class ToolCall(BaseModel):
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    output: str = ""
    data: dict[str, Any] = Field(default_factory=dict)
    truncated: bool = False
    seconds: float = 0.0
    error: Failure | None = None
    llm_calls: list[dict[str, Any]] = Field(default_factory=list)


class Turn(BaseModel):
    """One planner → executor → verifier round."""

    index: int
    context: str = ""
    sub_goal: str = ""
    tool: str | None = Field(None, description="Tool name as parsed from the planner (may be invalid).")
    tool_valid: bool = False
    menu: list[str] = Field(default_factory=list, description="The actions in the order the planner's menu listed "
                            "them this turn (empty in records written before it was kept).")
    planner: LLMCall | None = None
    executor: LLMCall | None = None
    tool_call: ToolCall | None = None
    verifier: LLMCall | None = None
    verdict: Literal["STOP", "CONTINUE"] | None = None
    verdict_parsed: bool = False
    failures: list[Failure] = Field(default_factory=list)
    seconds: float = 0.0


class Usage(BaseModel):
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, completion: Completion) -> None:
        self.calls += 1
        self.prompt_tokens += completion.prompt_tokens
        self.completion_tokens += completion.completion_tokens


class Trajectory(BaseModel):
    """The complete record of one question."""

    format_version: int = TRAJECTORY_FORMAT_VERSION
    question: str
    variant: int = Field(0, description="Which run of the question this is (a trainer's rollout index).")
    answer: str = ""
    raw_answer: str = Field("", description="The generator's reply before <answer> extraction.")
    query_analysis: str = ""
    analysis: LLMCall | None = None
    turns: list[Turn] = Field(default_factory=list)
    generator: LLMCall | None = None
    stop_reason: Literal["verifier_stop", "planner_stop", "max_turns", "timeout", "error"] | None = None
    failures: list[Failure] = Field(default_factory=list, description="Every failure, of every stage.")
    roles: dict[str, dict[str, Any]] = Field(default_factory=dict, description="Engine and sampling per role.")
    tools: list[str] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    seconds: float = 0.0
    queue_seconds: float = Field(0.0, description="Of `seconds`, what the question's time limit did not count: "
                                 "waits for a shared engine's capacity, and the other requests' share of the time "
                                 "its own were served together with them (`agentflow.clock`).")
    started_at: str = ""

    @property
    def infrastructure_failure(self) -> Failure | None:
        """The first failure that made the run say nothing about the policy (engine down, config), if any."""
        return next((f for f in self.failures if f.infrastructure), None)

    def planner_calls(self) -> list[LLMCall]:
        """The planner's calls, in order: the training rows of Flow-GRPO."""
        return self.role_calls("planner")

    def role_calls(self, role: str) -> list[LLMCall]:
        """The answered calls of one module, in order: the planner's, executor's and verifier's of each turn
        (the planner's query analysis is not one of its turns), or the generator's."""
        if role == "generator":
            calls = [self.generator]
        elif role in ("planner", "executor", "verifier"):
            calls = [getattr(t, role) for t in self.turns]
        else:
            raise ValueError(f"no calls of a role {role!r} in a trajectory")
        return [c for c in calls if c is not None and c.completion is not None]

    def write(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(model_json(self, indent=2), encoding="utf-8")
        tmp.replace(path)
