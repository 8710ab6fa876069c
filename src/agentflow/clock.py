"""A question's own clock: wall time minus the time its requests wait for a shared engine, with the time an
engine serves several requests at once shared between them.

Many questions share one engine (an eval at concurrency 8, a trainer's B x G rollouts); a question whose
request sits in the engine's queue behind the others is not slow by its own doing. Engines mark such waits
with `waiting_for_capacity()` (a request queued for a free slot). A request that is being served beside n - 1
others (a transformers batch, llama.cpp's parallel slots on the same threads) takes about n times as long as
alone; engines mark that time with `SharedCompute.served()`, and the question is charged 1/n of it while n
requests are in (processor sharing: each request's share is the engine's virtual time over its stay). A lone
request is charged all of its time, so a hung engine call still runs out the clock. The flow's time limit
counts only what is charged, so it guards against hangs and runaway tools without firing on a healthy but
busy run, however slow the machine (on 2 cores at 24 concurrent rollouts, wall time alone cut off a third of
the questions at 300 s).

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


class SharedCompute:
    """One engine's requests in flight and its virtual time: the seconds each of them is charged, which run at
    1/n of the wall clock while n requests are being served."""

    def __init__(self) -> None:
        self._serving = 0
        self._virtual = 0.0
        self._since = time.perf_counter()

    def virtual_seconds(self) -> float:
        now = time.perf_counter()
        if self._serving:
            self._virtual += (now - self._since) / self._serving
        self._since = now
        return self._virtual

    @property
    def serving(self) -> int:
        return self._serving

    @contextlib.contextmanager
    def served(self) -> Iterator[None]:
        """Mark one request being served: its question (if any) is charged its share of the time."""
        self.virtual_seconds()
        self._serving += 1
        clock = _CLOCK.get()
        section = clock._enter_shared(self) if clock is not None else None
        try:
            yield
        finally:
            if section is not None:
                clock._leave_shared(section)
            self.virtual_seconds()
            self._serving -= 1


class QuestionClock:
    """Active seconds of one question: wall time since `start`, less the time spent waiting for capacity and
    less what other requests took of the time its own were served together with them (`SharedCompute`; a
    question's own model calls are one at a time, so its served sections do not overlap)."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.waited = 0.0
        self._waits = 0
        self._wait_since = 0.0
        self._shared: list[tuple[SharedCompute, float, float]] = []

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

    def _enter_shared(self, engine: SharedCompute) -> tuple[SharedCompute, float, float]:
        section = (engine, engine.virtual_seconds(), time.perf_counter())
        self._shared.append(section)
        return section

    def _leave_shared(self, section: tuple[SharedCompute, float, float]) -> None:
        self._shared.remove(section)
        self.waited += self._not_charged(section, time.perf_counter())

    @staticmethod
    def _not_charged(section: tuple[SharedCompute, float, float], now: float) -> float:
        engine, virtual_start, wall_start = section
        return max(0.0, (now - wall_start) - (engine.virtual_seconds() - virtual_start))

    def active_seconds(self) -> float:
        now = time.perf_counter()
        current = now - self._wait_since if self._waits else 0.0
        shared = sum(self._not_charged(section, now) for section in self._shared)
        return now - self.started - self.waited - current - shared

    def waited_seconds(self) -> float:
        """Seconds not charged: waits for capacity, and the others' share of time served together."""
        now = time.perf_counter()
        shared = sum(self._not_charged(section, now) for section in self._shared)
        return self.waited + (now - self._wait_since if self._waits else 0.0) + shared


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
