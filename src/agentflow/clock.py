"""A question's own clock: wall time minus the time its requests wait for a shared engine.

Many questions share one engine (an eval at concurrency 8, a trainer's B x G rollouts); a question whose
request sits in the engine's queue behind the others is not slow by its own doing. Engines mark such waits
with `waiting_for_capacity()` (a request queued for a batch or a free slot), and the flow's time limit counts
only the rest, so the limit guards against hangs and runaway tools without firing on a healthy but busy run.

The clock travels in a context variable: `asolve` sets one per question, and every task it starts (and the
engine calls made from them) sees it. Outside a question, waits are not recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

T = TypeVar("T")


class QuestionClock:
    """Active seconds of one question: wall time since `start`, less the time spent waiting for capacity."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.waited = 0.0
        self._waits = 0
        self._wait_since = 0.0

    def pause(self) -> None:
        if self._waits == 0:
            self._wait_since = time.perf_counter()
        self._waits += 1

    def resume(self) -> None:
        if self._waits == 0:
            return
        self._waits -= 1
        if self._waits == 0:
            self.waited += time.perf_counter() - self._wait_since

    @property
    def waiting(self) -> bool:
        return self._waits > 0

    def active_seconds(self) -> float:
        now = time.perf_counter()
        current = now - self._wait_since if self._waits else 0.0
        return now - self.started - self.waited - current

    def waited_seconds(self) -> float:
        return self.waited + (time.perf_counter() - self._wait_since if self._waits else 0.0)


_CLOCK: ContextVar[QuestionClock | None] = ContextVar("agentflow_question_clock", default=None)


def current_clock() -> QuestionClock | None:
    return _CLOCK.get()


@contextlib.contextmanager
def question_clock(clock: QuestionClock) -> Iterator[QuestionClock]:
    token = _CLOCK.set(clock)
    try:
        yield clock
    finally:
        _CLOCK.reset(token)


@contextlib.contextmanager
def waiting_for_capacity() -> Iterator[None]:
    """Mark a wait for a shared engine's capacity (a queue, a slot): it does not count against the question."""
    clock = _CLOCK.get()
    if clock is None:
        yield
        return
    clock.pause()
    try:
        yield
    finally:
        clock.resume()


async def run_within(phase: Coroutine[Any, Any, T], clock: QuestionClock, budget: float) -> T:
    """Run `phase` until the clock's active seconds reach `budget`; then cancel it and raise TimeoutError.

    Time the question spends waiting for capacity does not count: the deadline moves out by that much.
    """
    task = asyncio.ensure_future(phase)
    try:
        while True:
            remaining = budget - clock.active_seconds()
            if remaining <= 0 and not clock.waiting:
                task.cancel()
                await asyncio.wait({task})
                if task.cancelled():
                    raise asyncio.TimeoutError
                return task.result()  # it finished (or failed) in the meantime: that outcome stands
            done, _ = await asyncio.wait({task}, timeout=max(remaining, 0.05))
            if done:
                return task.result()
    except asyncio.CancelledError:
        task.cancel()
        raise
