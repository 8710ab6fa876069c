"""Agents for tests of the eval runner: scripted answers, tracked concurrency, injected failures.

Also importable by a subprocess (`--agent tests.eval.fake_agents:slow_agent`) for the kill -9 resume test.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from agentflow.errors import ConfigError
from agentflow.trajectory import Failure, ToolCall, Trajectory, Turn, Usage


class FakeAgent:
    """Answers with `answer(question)`; questions containing 'ENGINE_DOWN' fail like an unreachable engine,
    'CRASH' raises out of asolve, 'TIMEOUT' ends like a question whose time budget ran out.
    Records the questions asked and the peak number solved at once."""

    def __init__(self, answer: Callable[[str], str] = lambda q: "<answer>x</answer>", *, delay_s: float = 0.0,
                 fail_marker: str = "ENGINE_DOWN") -> None:
        self.answer = answer
        self.delay_s = delay_s
        self.fail_marker = fail_marker
        self.asked: list[str] = []
        self.active = 0
        self.peak = 0
        self.closed = False

    async def asolve(self, question: str) -> Trajectory:
        self.asked.append(question)
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await asyncio.sleep(self.delay_s)
            if "CRASH" in question:
                raise RuntimeError("bug in the agent")
            traj = Trajectory(question=question, stop_reason="verifier_stop",
                              usage=Usage(calls=3, prompt_tokens=30, completion_tokens=6))
            traj.turns.append(Turn(index=0, tool="python", tool_valid=True, tool_call=ToolCall(tool="python")))
            if self.fail_marker and self.fail_marker in question:
                traj.stop_reason = "error"
                traj.failures.append(Failure(stage="planner", kind="engine_unavailable",
                                             message="connection refused", infrastructure=True))
                return traj
            traj.raw_answer = self.answer(question)
            traj.answer = traj.raw_answer
            if "TIMEOUT" in question:   # the flow's own budget ran out; the generator still answered
                traj.stop_reason = "timeout"
                traj.failures.append(Failure(stage="flow", kind="question_timeout",
                                             message="turn loop cut off after 225.0s"))
            return traj
        finally:
            self.active -= 1

    async def aclose(self) -> None:
        self.closed = True


def slow_agent(config: Any) -> FakeAgent:
    """For the subprocess resume test: a wrong-or-right answer after AGENTFLOW_TEST_DELAY seconds."""
    delay = float(os.environ.get("AGENTFLOW_TEST_DELAY", "0.3"))
    return FakeAgent(lambda q: "<answer>Paris</answer>" if "France" in q else "<answer>no idea</answer>",
                     delay_s=delay)


def broken_setup_agent(config: Any) -> Any:
    """An agent whose tools are not set up: `check` fails before any item runs."""

    class Broken(FakeAgent):
        async def check(self) -> None:
            raise ConfigError("tool wikipedia_search: index missing")

    return Broken()
