"""Handshakes that go wrong (issue 21, point 5): whatever a peer sends or fails to
send while it is admitted, it gets a clear error and a closed connection, and the
tracker goes on serving everyone else (never a fail-stop)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.service import Agent, TrackerService
from lowtide.service.net import Limits
from lowtide.wire.messages import WIRE_VERSION, Error, ErrorCode, Hello, Role, Welcome, graph_spec
from tests.service.raw import RawClient

pytestmark = pytest.mark.socket


@pytest.fixture
def fresh() -> Iterator[TrackerService]:
    """A standalone server without a graph: it adopts the first valid client's."""
    svc = TrackerService.start(None, limits=Limits(handshake_timeout_s=0.5))
    try:
        yield svc
    finally:
        svc.stop()


def assert_serves(svc: TrackerService, graph: SegmentGraph) -> None:
    with Agent.connect(svc.url, graph) as good:
        good.register_front(1, graph.names[0], 7)
        assert good.status()["global_min"] == 7


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ((("a", ("b",), 2, ()), ("b", ("a",))), "in a cycle and has key ranges"),
        ((), "at least one segment"),
        ((("a", ()), ("a", ())), "declared twice"),
        ((("a", ()), ("b", ("nope",))), "unknown inbound"),
    ],
    ids=["ranges-in-a-cycle", "empty", "duplicate", "dangling"],
)
def test_a_bad_graph_in_hello_is_refused_and_the_tracker_serves_on(
    fresh: TrackerService, graph: SegmentGraph, spec: tuple, says: str
) -> None:
    client = RawClient.open(fresh.url)
    try:
        err = client.hello(spec)
        assert isinstance(err, Error) and err.code == ErrorCode.BAD_REQUEST
        assert "bad pipeline graph" in err.message and says in err.message
        with pytest.raises(ConnectionError):
            client.recv()
    finally:
        client.close()
    assert_serves(fresh, graph)


def test_a_handshake_that_times_out_while_waiting_to_be_admitted(
    fresh: TrackerService, graph: SegmentGraph
) -> None:
    """The state task is busy (here: stopped) when a Hello arrives; the handshake
    times out, and then the state task gets to the peer's admission."""
    server = fresh.server
    fresh.call(lambda: server._tasks[0].cancel())  # the state task, paused
    client = RawClient.open(fresh.url)
    try:
        err = client.hello(graph_spec(graph))
        assert isinstance(err, Error) and "timed out" in err.message
    finally:
        client.close()

    def resume() -> None:
        server._tasks[0] = asyncio.get_running_loop().create_task(server._state_loop())

    fresh.call(resume)
    time.sleep(0.2)  # the state task admits the late Hello, whose peer is gone
    with Agent.connect(fresh.url, graph) as good:  # adopts this graph: not failed
        good.register_front(1, "src", 7)
        assert good.status()["global_min"] == 7


def test_a_large_graph_is_admitted_within_the_handshake_timeout() -> None:
    """8,000 segments declared sink first took the quadratic sort 12 s."""
    n = 8_000
    spec = tuple((f"s{i}", (f"s{i - 1}",) if i else ()) for i in reversed(range(n)))
    with TrackerService.start(None, limits=Limits(handshake_timeout_s=4.0)) as svc:
        client = RawClient.open(svc.url)
        try:
            welcome = client.hello(spec, timeout_s=10)
            assert isinstance(welcome, Welcome) and len(welcome.graph) == n
        finally:
            client.close()


def test_a_client_of_another_wire_version_is_told_so(fresh: TrackerService) -> None:
    """Version 2's Hello is laid out otherwise: the answer names both versions."""
    client = RawClient.open(fresh.url)
    try:
        client.send(Hello(WIRE_VERSION - 1, Role.AGENT, b"n" * 32, "old", None))
        err = client.recv()
        assert isinstance(err, Error) and err.code == ErrorCode.BAD_FRAME
        assert f"wire version {WIRE_VERSION - 1}, this lowtide speaks {WIRE_VERSION}" in err.message
    finally:
        client.close()
