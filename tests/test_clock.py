"""The question clock: its own time counts, waits for a shared engine's capacity do not."""

from __future__ import annotations

import asyncio

import pytest

from agentflow.clock import QuestionClock, current_clock, question_clock, run_within, waiting_for_capacity


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
