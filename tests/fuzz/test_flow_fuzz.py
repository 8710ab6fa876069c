"""Hostile replies from every role through the real `Flow`: no exception escapes, the time limit holds, the
trajectory saves and reloads, prompts stay bounded. Fast tier by default; `-m slow` runs 10,000 flows."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings

from tests.fuzz.flow_cases import FlowCase, check_case, flow_cases

FUZZ = settings(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow,
                                                                     HealthCheck.data_too_large,
                                                                     HealthCheck.large_base_example])


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@settings(FUZZ, max_examples=150)
@given(case=flow_cases())
def test_any_replies_end_in_a_saved_trajectory(loop: asyncio.AbstractEventLoop, case: FlowCase) -> None:
    assert check_case(case, loop) == []


@pytest.mark.slow
@pytest.mark.parametrize("part", range(4))
@settings(FUZZ, max_examples=2_500)
@given(case=flow_cases())
def test_ten_thousand_flows_of_hostile_replies(loop: asyncio.AbstractEventLoop, part: int, case: FlowCase) -> None:
    """10,000 flows as four runs of 2,500: Hypothesis keeps ~0.2 MB per example until its run ends."""
    assert check_case(case, loop) == []
