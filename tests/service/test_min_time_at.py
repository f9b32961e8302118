"""``Agent.min_time_at``: the min time a segment had at a past wall time, final once
the tracker's clock has passed it (deterministic completeness decisions in Spark)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lowtide.core.errors import UnknownSegment
from lowtide.core.messages import MinTimeUpdate
from lowtide.service import Agent, TrackerService
from lowtide.service.server.history import MinTimeHistory
from lowtide.wire.codec import decode, encode
from lowtide.wire.messages import LATEST_MS, MinTimeAt, MinTimeAtReply

pytestmark = pytest.mark.socket


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_wire_round_trip() -> None:
    for msg in (MinTimeAt(1, "sink", 123), MinTimeAt(2, None, 0), MinTimeAtReply(3, 42)):
        assert decode(encode(msg)) == msg


def test_history_answers_the_past_and_is_never_premature() -> None:
    h = MinTimeHistory(retention_ms=100)
    h.seed(0, {"s": 0})
    for i in range(1, 500):
        h.observe(i * 10, [MinTimeUpdate("s", i)])
    assert h.at("s", 4_990) == 499
    assert h.at("s", 4_985) == 498
    # pruned: older questions get 0 ("nothing known complete"), never a later value
    assert h.at("s", 5) == 0
    assert h.at("other", 10_000) == 0


def test_min_time_at_is_final(service: TrackerService, agent: Agent) -> None:
    before = now_ms()
    agent.register_front(front=1, segment="src", time=10)
    agent.heartbeat(1, 20)
    agent.flush()
    deadline = time.monotonic() + 5
    while agent.status()["segments"][0]["min_time"] < 20:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.06)
    mid = now_ms()
    assert agent.min_time_at("src", before - 1_000) == 0
    assert agent.min_time_at("src", mid) == 20
    agent.heartbeat(1, 30)
    agent.flush()
    time.sleep(0.2)
    # the past does not change when the present moves on
    assert agent.min_time_at("src", mid) == 20
    assert agent.min_time_at("src", now_ms()) == 30
    assert agent.min_time_at(None, now_ms()) == 30


def test_waits_until_the_time_has_passed(agent: Agent) -> None:
    t0 = time.monotonic()
    agent.register_front(front=1, segment="src", time=5)
    assert agent.min_time_at("sink", now_ms() + 300) == 5
    assert time.monotonic() - t0 >= 0.28


def test_the_latest_holds_what_was_confirmed_without_waiting_for_the_clock(
        service: TrackerService, agent: Agent) -> None:
    """A window's stamp asks for the latest min time: what the tracker confirmed before
    is in it, with no wait for the clock to pass a millisecond (before: -1 read as a
    time older than the history, answer 0)."""
    agent.register_front(front=1, segment="src", time=10)
    for hb in (20, 30):
        agent.heartbeat(1, hb)
        agent.flush()  # confirmed
        assert agent.min_time_at("src", LATEST_MS) == hb
    assert agent.min_time_at(None, LATEST_MS) == 30


def test_a_coordinator_answers_the_latest_as_its_now(tmp_path: Path) -> None:
    """A coordinator's steps do not hold what its shards confirmed: the latest is its
    clock's "now" there, answered once that has passed (never 0 for good)."""
    from lowtide.bench.service import GRAPH, server

    with server(tmp_path, shards=2) as url, Agent.connect(url, GRAPH) as agent:
        agent.register_front(0, "src", 5)
        agent.heartbeat(0, 9)
        agent.flush()
        deadline = time.monotonic() + 20
        while (t := agent.min_time_at("src", LATEST_MS)) < 9:
            assert time.monotonic() < deadline and t in (0, 5), t
            time.sleep(0.05)


def test_unknown_segment(agent: Agent) -> None:
    with pytest.raises(UnknownSegment):
        agent.min_time_at("nope", now_ms())


def test_history_doctests() -> None:
    import doctest

    import lowtide.service.server.history as history

    result = doctest.testmod(history)
    assert result.attempted > 0 and result.failed == 0
