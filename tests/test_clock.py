"""The question clock: its own time counts, waits for a shared engine's capacity do not, and time served
together with other requests counts by share."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentflow.clock import (
    QuestionClock,
    SharedCompute,
    current_clock,
    question_clock,
    run_within,
    waiting_for_capacity,
)


async def test_waits_for_capacity_pause_the_clock() -> None:
    clock = QuestionClock()
    with question_clock(clock):
        assert current_clock() is clock
        with waiting_for_capacity():
            await asyncio.sleep(0.2)
            assert clock.waiting
        await asyncio.sleep(0.1)
    assert current_clock() is None
    assert clock.waited_seconds() == pytest.approx(0.2, abs=0.05)
    assert clock.active_seconds() == pytest.approx(0.1, abs=0.05)


async def test_a_phase_past_its_own_budget_is_cancelled() -> None:
    cancelled = asyncio.Event()

    async def hang() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(asyncio.TimeoutError):
        await run_within(hang(), QuestionClock(), 0.2)
    assert cancelled.is_set()


async def test_the_deadline_moves_out_by_the_time_spent_waiting() -> None:
    clock = QuestionClock()

    async def queued_then_work() -> str:
        with waiting_for_capacity():
            await asyncio.sleep(0.5)  # longer than the whole budget, but only queueing
        await asyncio.sleep(0.1)
        return "done"

    with question_clock(clock):
        assert await run_within(queued_then_work(), clock, 0.3) == "done"


async def test_a_phase_that_fails_in_time_raises_its_own_error() -> None:
    async def fail() -> None:
        await asyncio.sleep(0.05)
        raise ValueError("engine said no")

    with pytest.raises(ValueError, match="engine said no"):
        await run_within(fail(), QuestionClock(), 1.0)


def test_waits_outside_a_question_are_not_recorded() -> None:
    with waiting_for_capacity():
        assert current_clock() is None


async def _served(compute: SharedCompute, clock: QuestionClock, seconds: float) -> str:
    with question_clock(clock), compute.served():
        await asyncio.sleep(seconds)
    return "done"


async def test_a_request_served_alone_is_charged_all_its_time() -> None:
    compute, clock = SharedCompute(), QuestionClock()
    await _served(compute, clock, 0.2)
    assert clock.active_seconds() == pytest.approx(0.2, abs=0.05)
    assert clock.waited_seconds() < 0.03 and compute.serving == 0


async def test_requests_served_together_are_each_charged_their_share() -> None:
    """Four requests in one engine for 0.4 s: each is charged about 0.1 s, and together the 0.4 s the engine
    served them (processor sharing), not 1.6 s."""
    compute = SharedCompute()
    clocks = [QuestionClock() for _ in range(4)]
    start = time.perf_counter()
    await asyncio.gather(*(_served(compute, clock, 0.4) for clock in clocks))
    elapsed = time.perf_counter() - start
    for clock in clocks:
        assert clock.active_seconds() == pytest.approx(0.1, abs=0.04)
        assert clock.waited_seconds() == pytest.approx(0.3, abs=0.05)
    assert sum(clock.active_seconds() for clock in clocks) == pytest.approx(elapsed, abs=0.08)


async def test_the_share_is_charged_while_it_runs_so_a_lone_hang_still_runs_out_the_clock() -> None:
    """Four questions served together for 0.8 s each fit a 0.5 s budget (0.2 s each); one served alone for
    0.8 s does not, and is cut off while its request is still in the engine."""
    compute = SharedCompute()

    async def question() -> str:
        clock = QuestionClock()
        with question_clock(clock):
            async def call() -> str:
                with compute.served():
                    await asyncio.sleep(0.8)
                return "done"
            return await run_within(call(), clock, 0.5)

    assert await asyncio.gather(*(question() for _ in range(4))) == ["done"] * 4
    start = time.perf_counter()
    with pytest.raises(asyncio.TimeoutError):
        await question()
    assert time.perf_counter() - start < 0.7 and compute.serving == 0
