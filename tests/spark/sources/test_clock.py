"""The clock source's offsets against a real tracker (sockets, no Spark): the segment's
min time, taken from what the tracker pushed, never above what it would answer, and
without asking it each micro-batch while the pushes are fresh."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.service import Agent, TrackerService
from lowtide.service.client.base_agent import close_shared
from lowtide.spark.sources.clock import ClockReader
from lowtide.spark.tracking.receive import read_stamp, stamp_ms
from lowtide.spark.tracking.transport import TrackerRef

pytestmark = pytest.mark.socket

GRAPH = SegmentGraph.of(("w", ()), ("w.state", ("w",)), ("out", ("w.state",)))


@pytest.fixture
def tracked() -> Iterator[tuple[TrackerService, Agent, TrackerRef]]:
    svc = TrackerService.start(GRAPH)
    agent = Agent.connect(svc.url, GRAPH)
    try:
        agent.register_front(front=0, segment="w", time=1_000)
        yield svc, agent, TrackerRef(svc.url, GRAPH)
    finally:
        agent.close()
        close_shared(svc.url)  # the reader's process-wide agent
        svc.stop()  # a second stop does nothing


def reader(ref: TrackerRef, tmp: Path) -> ClockReader:
    return ClockReader({"lowtide.tracker": ref.to_option(), "lowtide.segment": "w",
                        "step_ms": "10", "op_id": "3", "checkpoint": str(tmp)})


def beat(agent: Agent, slot: int) -> None:
    agent.heartbeat(0, slot)
    agent.flush()


def until(fn: Any, want: int, timeout_s: float = 10.0) -> int:
    deadline = time.monotonic() + timeout_s
    while (got := fn()) != want:
        assert time.monotonic() < deadline, f"{got} != {want}"
        time.sleep(0.01)
    return got


def test_the_clock_reads_pushed_min_times(tracked: Any, tmp_path: Path) -> None:
    svc, agent, ref = tracked
    grid = ref.grid
    r = reader(ref, tmp_path)
    beat(agent, 2_000)
    until(lambda: read_stamp(ref, "w"), stamp_ms(2_000, grid))
    until(r.stamp, stamp_ms(2_000, grid))
    for slot in (2_500, 3_000):  # each move arrives pushed, never ahead of the tracker
        beat(agent, slot)
        while (got := r.stamp()) != stamp_ms(slot, grid):
            assert got <= read_stamp(ref, "w")
            time.sleep(0.01)
    # no question per micro-batch: the pushed min time is answered with the tracker
    # gone (asking it would wait for it, up to 30 s, and fail)
    svc.stop()
    assert r.stamp() == stamp_ms(3_000, grid)


def test_before_the_first_push_it_asks(tracked: Any, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _svc, agent, ref = tracked
    r = reader(ref, tmp_path)
    monkeypatch.setattr(r, "_on_update", lambda update: None)  # no push arrives
    beat(agent, 2_600)
    until(r.stamp, stamp_ms(2_600, ref.grid))  # each call asks the tracker
    assert r._pushed is None
