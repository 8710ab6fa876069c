"""The flow: planner → executor → verifier turns over one shared memory, then the generator.

The same code runs for `agentflow solve`, `agentflow eval` and `agentflow train`. A `Flow` holds engines and
tools; each `asolve` call owns a fresh `FlowMemory` and `Trajectory`, so many questions run concurrently on one
flow without sharing state.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel

from agentflow.clock import QuestionClock, question_clock, run_within
from agentflow.config import STOP_ACTION, STOP_DESCRIPTION, FlowConfig, RoleConfig
from agentflow.engines import Engine, Message, build_engine
from agentflow.errors import (
    AgentFlowError,
    ConfigError,
    EngineError,
    QuestionTimeoutError,
    ToolError,
    ToolTimeoutError,
)
from agentflow.executor import (
    copied_example,
    executor_messages,
    fallback_field,
    parse_arguments,
    parse_cut_arguments,
)
from agentflow.generator import extract_answer, generator_messages
from agentflow.memory import FlowMemory, MemoryEntry, truncate
from agentflow.planner import analysis_messages, parse_planner_reply, planner_messages, planner_schema
from agentflow.textsafe import clean_text, cut_repetition
from agentflow.tools.base import Tool, ToolContext, create_tool
from agentflow.trajectory import Failure, LLMCall, ToolCall, Trajectory, Turn
from agentflow.verifier import VERIFIER_SCHEMA, parse_verdict, verifier_messages

log = logging.getLogger(__name__)

EventHandler = Callable[[str, dict[str, Any]], None]
"""Called as steps happen: ("analysis" | "plan" | "tool" | "verdict" | "answer", payload)."""

GENERATOR_RESERVE = 0.25
"""Share of the question's time budget kept for the generator, so a cut-off loop still yields an answer."""

POLICY_ENGINE_ERRORS = frozenset({"context_overflow"})
"""Engine failures the policy's own choices cause (memory grown past the context): scored, not excluded."""


class _EngineFailed(Exception):
    """Internal: an engine call failed after retries; the flow stops and records it."""

    def __init__(self, stage: str, error: EngineError) -> None:
        super().__init__(str(error))
        self.stage = stage
        self.error = error


class Flow:
    """A configured agentic system. Build with `Flow.from_config`; use `solve` / `asolve`."""

    def __init__(self, config: FlowConfig, engines: dict[str, Engine], tools: dict[str, Tool]) -> None:
        self.config = config
        self.engines = engines
        self.tools = tools
        self._checked = False
        self._check_lock = asyncio.Lock()

    @classmethod
    def from_config(cls, config: FlowConfig, *, engines: dict[str, Engine] | None = None,
                    tools: dict[str, Tool] | None = None) -> Flow:
        """Build engines and tools from `config`; `engines` / `tools` replace entries of the same name.

        MCP servers start here (their tools are known only once they answer); a server whose tools are passed
        in `tools` is shared, not started again. `aclose` stops them.
        """
        built: dict[str, Engine] = dict(engines or {})
        for name, engine_config in config.engines.items():
            if name not in built:
                built[name] = build_engine(engine_config)
        tool_objects: dict[str, Tool] = dict(tools or {})
        for name, settings in config.tools.items():
            if name not in tool_objects:
                tool_objects[name] = create_tool(name, settings)
        if config.mcp_servers:  # starts each server not already behind a tool passed in; SERVER.TOOL names
            from agentflow.tools.mcp.tool import mcp_tools

            tool_objects.update(mcp_tools(config.mcp_servers, given=tool_objects))
        return cls(config, built, tool_objects)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def check(self) -> None:
        """Check every tool's set-up once; raises ConfigError naming what is wrong."""
        async with self._check_lock:
            if self._checked:
                return
            for tool in self.tools.values():
                await tool.check()
            self._checked = True

    async def aclose(self) -> None:
        for tool in self.tools.values():
            await tool.aclose()
        for engine in self.engines.values():
            await engine.aclose()

    async def __aenter__(self) -> Flow:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def solve(self, question: str, *, on_event: EventHandler | None = None) -> Trajectory:
        """Synchronous `asolve` (runs its own event loop)."""

        async def run() -> Trajectory:
            try:
                return await self.asolve(question, on_event=on_event)
            finally:
                await self.aclose()

        return asyncio.run(run())

    # -- the loop ----------------------------------------------------------------------------------

    def _role(self, role: str) -> tuple[RoleConfig, Engine]:
        role_config: RoleConfig = getattr(self.config.roles, role)
        return role_config, self.engines[role_config.engine]

    def roles_record(self) -> dict[str, dict[str, Any]]:
        """Engine and sampling settings of each role, as recorded in trajectories."""
        record = {}
        for role in type(self.config.roles).model_fields:
            role_config, engine = self._role(role)
            record[role] = {"engine_name": role_config.engine, **engine.describe(),
                            "sampling": role_config.sampling.model_dump()}
        return record

    async def _call(self, role: str, messages: list[Message], *, stage: str,
                    json_schema: dict[str, Any] | None = None) -> LLMCall:
        role_config, engine = self._role(role)
        schema = json_schema if json_schema is not None and engine.supports_json_schema else None
        call = LLMCall(role=role, engine=engine.describe(), sampling=role_config.sampling, messages=messages,
                       json_schema=schema is not None, response_schema=schema)
        start = time.perf_counter()
        try:
            call.completion = await engine.generate(messages, role_config.sampling, json_schema=schema)
        except EngineError as err:
            raise _EngineFailed(stage, err) from err
        finally:
            call.seconds = time.perf_counter() - start
        return call

    def actions(self) -> list[str]:
        """What the planner may name: the tools, and `answer` with `planner_stop`."""
        return [*self.tools, STOP_ACTION] if self.config.planner_stop else list(self.tools)

    def _tool_descriptions(self, traj: Trajectory, turn: int) -> dict[str, str]:
        """The planner's menu; with `shuffle_tools`, in an order fixed by (question, variant, turn)."""
        names = self.actions()
        if self.config.shuffle_tools:
            random.Random(f"{traj.question}\x00{traj.variant}\x00{turn}").shuffle(names)
        return {name: self.tools[name].description if name in self.tools else STOP_DESCRIPTION for name in names}

    async def asolve(self, question: str, *, on_event: EventHandler | None = None, variant: int = 0) -> Trajectory:
        """Answer one question. Engine and tool failures are recorded in the trajectory, not raised.

        `variant` tells apart runs of the same question (a trainer's group of rollouts): with `shuffle_tools`
        it picks the tool-menu order, which is otherwise fixed by the question, so evaluations repeat.
        Raises ValueError for an empty question and ConfigError when a tool is not set up.
        """
        question = clean_text(question).strip()  # argv's undecodable bytes arrive as lone surrogates
        if not question:
            raise ValueError("the question is empty")
        await self.check()
        emit = on_event or (lambda kind, payload: None)
        limits = self.config.limits
        traj = Trajectory(question=question, variant=variant, roles=self.roles_record(), tools=list(self.tools),
                          started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
        memory = FlowMemory(question=question)
        start = time.perf_counter()
        clock = QuestionClock()
        loop_budget = limits.max_seconds * (1 - GENERATOR_RESERVE)
        with question_clock(clock):
            await self._bounded(traj, self._turns(traj, memory, emit), clock=clock, budget=loop_budget,
                                stage="flow", message=f"turn loop cut off after {loop_budget:.1f}s of its own time")
            if traj.stop_reason != "error":
                await self._bounded(traj, self._generate(traj, memory, emit), clock=clock, budget=limits.max_seconds,
                                    stage="generator",
                                    message=f"question exceeded {limits.max_seconds:.1f}s of its own time")
        traj.seconds = time.perf_counter() - start
        traj.queue_seconds = clock.waited_seconds()
        traj.failures += [failure for turn in traj.turns for failure in turn.failures]
        for call in self._all_calls(traj):
            if call.completion is not None:
                traj.usage.add(call.completion)
        return traj

    async def _bounded(self, traj: Trajectory, phase: Coroutine[Any, Any, None], *, clock: QuestionClock,
                       budget: float, stage: str, message: str) -> None:
        """Run one phase of a question until the question's own time (queue waits for a shared engine not
        counted) reaches `budget`, recording a cut-off or an engine failure.

        A cut-off is the policy's doing (its tools, its turns), so it is scored, not excluded."""
        try:
            await run_within(phase, clock, budget)
        except asyncio.TimeoutError:
            traj.stop_reason = "timeout"
            traj.failures.append(Failure(stage=stage, kind=QuestionTimeoutError.kind, infrastructure=False,
                                         message=message))
        except _EngineFailed as failed:
            self._record_engine_failure(traj, failed)

    @staticmethod
    def _record_engine_failure(traj: Trajectory, failed: _EngineFailed) -> None:
        traj.stop_reason = "error"
        turn = traj.turns[-1].index if traj.turns and failed.stage not in ("analysis", "generator") else None
        failure = Failure(stage=failed.stage, kind=failed.error.kind, message=str(failed.error), turn=turn,
                          infrastructure=failed.error.kind not in POLICY_ENGINE_ERRORS)
        if turn is not None:
            traj.turns[-1].failures.append(failure)
        else:
            traj.failures.append(failure)

    @staticmethod
    def _all_calls(traj: Trajectory) -> list[LLMCall]:
        calls = [traj.analysis, traj.generator]
        for turn in traj.turns:
            calls += [turn.planner, turn.executor, turn.verifier]
            if turn.tool_call:
                calls += [LLMCall.model_validate(c) for c in turn.tool_call.llm_calls]
        return [c for c in calls if c is not None]

    async def _turns(self, traj: Trajectory, memory: FlowMemory, emit: EventHandler) -> None:
        limits = self.config.limits
        if self.config.query_analysis:
            traj.analysis = await self._call("planner", analysis_messages(traj.question,
                                                                          self._tool_descriptions(traj, 0)),
                                             stage="analysis")
            traj.query_analysis = cut_repetition(traj.analysis.text.strip())
            memory.query_analysis = truncate(traj.query_analysis, limits.text_chars)
            emit("analysis", {"text": memory.query_analysis})
        for index in range(1, limits.max_turns + 1):
            turn = Turn(index=index)
            traj.turns.append(turn)
            turn_start = time.perf_counter()
            try:
                await self._turn(turn, traj, memory, emit)
            finally:
                turn.seconds = time.perf_counter() - turn_start
            if turn.verdict == "STOP":
                traj.stop_reason = "verifier_stop"
                return
            if self.config.planner_stop and turn.tool == STOP_ACTION:
                traj.stop_reason = "planner_stop"
                return
        traj.stop_reason = "max_turns"

    def _render(self, memory: FlowMemory, *, tool_names: bool = True) -> str:
        limits = self.config.limits
        return memory.render(token_budget=limits.memory_tokens, result_chars=limits.result_chars,
                             text_chars=limits.text_chars, tool_names=tool_names)

    async def _turn(self, turn: Turn, traj: Trajectory, memory: FlowMemory, emit: EventHandler) -> None:
        limits = self.config.limits
        names = self.actions()
        menu = self._tool_descriptions(traj, turn.index)
        turn.menu = list(menu)
        turn.planner = await self._call(
            "planner",
            planner_messages(question=traj.question, analysis=memory.query_analysis, tool_descriptions=menu,
                             memory=self._render(memory, tool_names=self.config.planner_memory_tools),
                             turn=turn.index, max_turns=limits.max_turns, tool_last=self.config.planner_tool_last),
            stage="planner", json_schema=planner_schema(names, text_chars=limits.plan_chars,
                                                        tool_last=self.config.planner_tool_last))
        step = parse_planner_reply(turn.planner.text, names)
        turn.context, turn.sub_goal = cut_repetition(step.context), cut_repetition(step.sub_goal)
        turn.tool = step.tool_name or step.raw_tool
        turn.tool_valid = step.tool_name is not None
        emit("plan", {"turn": turn.index, "tool": turn.tool, "valid": turn.tool_valid, "sub_goal": step.sub_goal})
        if self.config.planner_stop and step.tool_name == STOP_ACTION:
            return  # the planner's own stop: no tool, no verdict, nothing new in memory
        entry = MemoryEntry(turn=turn.index, sub_goal=step.sub_goal, tool=turn.tool)
        if step.tool_name is None:
            message = (f"planner named no valid tool (wrote {step.raw_tool!r}); "
                       f"choose one of: {', '.join(names)}")
            turn.failures.append(Failure(stage="planner", kind="invalid_tool", message=message, turn=turn.index))
            entry.error = message
        else:
            steps = self._render(memory) if self.config.executor_memory and memory.entries else ""
            await self._execute(turn, traj, step.tool_name, entry, emit, steps=steps)
        memory.add(entry)
        if not self.config.verify:
            return
        turn.verifier = await self._call(
            "verifier",
            verifier_messages(question=traj.question, analysis=memory.query_analysis, memory=self._render(memory)),
            stage="verifier", json_schema=VERIFIER_SCHEMA)
        turn.verdict, turn.verdict_parsed = parse_verdict(turn.verifier.text)
        if not turn.verdict_parsed:
            turn.failures.append(Failure(stage="verifier", kind="parse", turn=turn.index,
                                         message="verdict not understood; continuing"))
        entry.verdict = turn.verdict
        emit("verdict", {"turn": turn.index, "verdict": turn.verdict})

    async def _execute(self, turn: Turn, traj: Trajectory, tool_name: str, entry: MemoryEntry,
                       emit: EventHandler, *, steps: str = "") -> None:
        tool = self.tools[tool_name]
        fixed = tool.settings.fixed_input(question=traj.question, sub_goal=turn.sub_goal)
        direct = fallback_field(tool) if self.config.direct_tool_input and turn.sub_goal else None
        if fixed is not None:
            arguments: dict[str, Any] | None = fixed
        elif direct is not None:
            arguments = {direct: turn.sub_goal}
        else:
            turn.executor = await self._call(
                "executor",
                executor_messages(question=traj.question, context=turn.context, sub_goal=turn.sub_goal, tool=tool,
                                  text_chars=self.config.limits.text_chars, steps=steps),
                stage="executor", json_schema=tool.executor_schema())
            arguments = parse_arguments(turn.executor.text)
            completion = turn.executor.completion
            if arguments is None and completion is not None and completion.finish_reason == "length":
                arguments = parse_cut_arguments(turn.executor.text)
                if arguments is not None:
                    turn.failures.append(Failure(stage="executor", kind="executor_cut", turn=turn.index,
                                                 message="the executor's reply reached its token limit inside "
                                                         "the JSON; its fields were read up to the cut"))
            example = copied_example(tool, traj.question, arguments)
            if example is not None:
                turn.failures.append(Failure(stage="executor", kind="copied_example", turn=turn.index,
                                             message=f"the executor repeated the worked example for "
                                                     f"{example.question!r}; not used"))
                arguments = None
        call = ToolCall(tool=tool_name, arguments=arguments or {})
        turn.tool_call = call
        try:
            args = tool.parse_input(call.arguments)
        except ToolError as err:
            field = fallback_field(tool)
            if field is None or not turn.sub_goal:
                self._tool_failed(turn, call, entry, err)
                return
            turn.failures.append(Failure(stage="executor", kind="executor_fallback", turn=turn.index,
                                         message=f"{err}; used the sub-goal as {field!r}"))
            call.arguments = {field: turn.sub_goal}
            try:
                args = tool.parse_input(call.arguments)
            except ToolError as err2:
                self._tool_failed(turn, call, entry, err2)
                return
        if fixed is None:  # a fixed input is the tool's configuration, not a choice: memory shows the result only
            # what the tool runs, as validated (a program without its comments), not the reply's raw text
            entry.arguments = args.model_dump(mode="json", exclude_unset=True) if isinstance(args, BaseModel) \
                else call.arguments
        timeout = self.config.limits.tool_timeout_s
        start = time.perf_counter()
        try:
            result = await asyncio.wait_for(
                tool.run(args, ToolContext(llm=self._tool_llm(call), timeout_s=timeout, question=traj.question,
                                           steps=self._step_outputs(traj, turn))), timeout=timeout)
        except asyncio.TimeoutError:
            self._tool_failed(turn, call, entry, ToolTimeoutError(f"tool {tool_name!r} exceeded {timeout:.1f}s"))
        except _EngineFailed:
            raise
        except (ToolError, ConfigError) as err:
            self._tool_failed(turn, call, entry, err)
        except Exception as err:  # a tool's own bug must not end the question: record it, go on
            log.exception("tool %s raised", tool_name)
            self._tool_failed(turn, call, entry, ToolError(f"{type(err).__name__}: {err}"))
        else:
            call.output, call.data, call.truncated = result.output, result.data, result.truncated
            entry.result = result.output
        finally:
            call.seconds = time.perf_counter() - start
        code = call.data.get("code") if isinstance(call.data, dict) else None
        emit("tool", {"turn": turn.index, "tool": tool_name, "arguments": call.arguments,
                      "output": truncate(call.output or (call.error.message if call.error else ""), 200),
                      "error": call.error is not None, "code": code if isinstance(code, str) else None,
                      "llm_calls": len(call.llm_calls)})

    @staticmethod
    def _step_outputs(traj: Trajectory, current: Turn) -> list[str]:
        """What the tools of the turns before `current` returned (their error, when they failed)."""
        outputs = []
        for turn in traj.turns:
            if turn is current:
                break
            call = turn.tool_call
            if call is not None:
                outputs.append(call.output if call.error is None else f"Error: {call.error.message}")
        return outputs

    def _tool_llm(self, call: ToolCall) -> Callable[[list[Message]], Any]:
        async def llm(messages: list[Message]) -> Any:
            record = await self._call("tools", messages, stage="tool")
            call.llm_calls.append(record.model_dump())
            assert record.completion is not None
            return record.completion

        return llm

    @staticmethod
    def _tool_failed(turn: Turn, call: ToolCall, entry: MemoryEntry, err: AgentFlowError) -> None:
        failure = Failure(stage="tool", kind=err.kind, message=str(err), turn=turn.index)
        call.error = failure
        turn.failures.append(failure)
        entry.error = str(err)

    async def _generate(self, traj: Trajectory, memory: FlowMemory, emit: EventHandler) -> None:
        traj.generator = await self._call(
            "generator",
            generator_messages(question=traj.question, analysis=memory.query_analysis, memory=self._render(memory),
                               latest=memory.latest(self.config.limits.result_chars)),
            stage="generator")
        traj.raw_answer = traj.generator.text
        traj.answer = cut_repetition(extract_answer(traj.generator.text))
        emit("answer", {"answer": traj.answer})
