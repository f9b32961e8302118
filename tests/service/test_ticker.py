"""A tracker's ticks: every 250 ms for a central tracker, 50 ms for a shard or a
coordinator, and at a waiting ``MinTimeAt`` question's time when that comes first."""

from __future__ import annotations

import asyncio
import time

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.service import Agent, TrackerService
from lowtide.service.clock import SystemClock
from lowtide.service.server.config import ServerConfig
from lowtide.service.server.ticker import CENTRAL_TICK_MS, FAST_TICK_MS, Ticker

GRAPH = SegmentGraph.of(("src", ()), ("sink", ("src",)))


def test_the_tick_follows_the_role() -> None:
    assert ServerConfig().tick_every_ms() == CENTRAL_TICK_MS == 250
    assert ServerConfig(shard=(0, 2)).tick_every_ms() == FAST_TICK_MS == 50
    assert ServerConfig(shard_urls=("tcp://127.0.0.1:1",)).tick_every_ms() == FAST_TICK_MS
    assert ServerConfig(tick_ms=7).tick_every_ms() == 7


def _ticks(every_ms: int, run_s: float, due_in_ms: int | None = None) -> list[float]:
    """When a Ticker ticked (seconds from its start) over ``run_s``."""
    clock = SystemClock()

    async def main() -> list[float]:
        ticker, at = Ticker(every_ms, clock), list[float]()
        t0 = time.monotonic()

        async def tick() -> None:
            at.append(time.monotonic() - t0)

        task = asyncio.create_task(ticker.run(tick))
        await asyncio.sleep(0.01)
        if due_in_ms is not None:
            ticker.expect(clock.now_ms() + due_in_ms)
        await asyncio.sleep(run_s)
        task.cancel()
        return at

    return asyncio.run(main())


def test_a_ticker_ticks_at_its_period_and_sooner_when_a_time_is_expected() -> None:
    assert len(_ticks(5_000, 0.3)) == 0
    early = _ticks(5_000, 0.5, due_in_ms=100)
    assert len(early) == 1 and 0.08 <= early[0] <= 0.45  # at the time, then the period


@pytest.mark.socket
def test_a_question_about_the_near_future_is_answered_at_its_time() -> None:
    """Without the early tick the answer would wait for the next one, 5 s away."""
    with TrackerService.start(GRAPH, tick_ms=5_000) as svc:
        agent = Agent.connect(svc.url, GRAPH)
        try:
            agent.register_front(front=1, segment="src", time=5)
            for ahead_ms in (0, 150):
                t0 = time.monotonic()
                assert agent.min_time_at("sink", time.time_ns() // 1_000_000 + ahead_ms) == 5
                assert ahead_ms / 1000 - 0.01 <= time.monotonic() - t0 < 2.0
        finally:
            agent.close()
