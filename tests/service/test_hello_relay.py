"""The handshake covers everything either side relies on (issue 29, point 5): a relay
that rewrites the Hello (same segment names, other edges) between a real agent and a
real fresh tracker is caught by the proofs with a secret, and by the client's own
check of what the Welcome says it agreed to without one. The grid and the shard a
client expects are part of the Hello too."""

from __future__ import annotations

import dataclasses

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.service import Agent, ServiceError, TrackerService
from lowtide.wire.messages import ErrorCode, Hello
from tests.service.conftest import SECRET
from tests.service.relay import HelloRewriter

pytestmark = pytest.mark.socket

#: The pipeline the client means: src -> mid -> sink.
CHAIN = SegmentGraph.of(("src", ()), ("mid", ("src",)), ("sink", ("mid",)))
#: What the relay makes of it: the same names, but sink fed by src directly, so the
#: sink's min time would not wait for items in flight in mid.
REWIRED = (("src", ()), ("mid", ("src",)), ("sink", ("src",)))


def rewire(hello: Hello) -> Hello:
    return dataclasses.replace(hello, graph=REWIRED)


def test_with_a_secret_a_rewritten_hello_fails_the_proofs_and_is_adopted_by_no_one() -> None:
    with TrackerService.start(None, secret=SECRET) as fresh:
        relay = HelloRewriter(fresh.url, rewire)
        try:
            with (Agent.connect(relay.url, CHAIN, secret=SECRET, connect_timeout_s=2) as agent,
                  pytest.raises(ServiceError) as info):
                agent.register_front(1, "src", 5, timeout_s=5)
            assert relay.altered >= 1
            assert info.value.code == ErrorCode.AUTH_FAILED
            assert "altered" in str(info.value)
            assert fresh.server.engine is None  # the rewired graph was not adopted
        finally:
            relay.close()
        with Agent.connect(fresh.url, CHAIN, secret=SECRET) as good:  # the real one is
            good.register_front(1, "src", 5)
            assert [s["segment"] for s in good.status()["segments"]] == ["src", "mid", "sink"]
        assert fresh.server.engine is not None and fresh.server.engine.graph == CHAIN


def test_without_a_secret_the_client_refuses_a_welcome_for_another_graph() -> None:
    with TrackerService.start(None) as fresh:
        relay = HelloRewriter(fresh.url, rewire)
        try:
            with (Agent.connect(relay.url, CHAIN, connect_timeout_s=2) as agent,
                  pytest.raises(ServiceError) as info):
                agent.register_front(1, "src", 5, timeout_s=5)
            assert info.value.code == ErrorCode.GRAPH_MISMATCH
            assert "Welcome" in str(info.value)
        finally:
            relay.close()


def test_an_agent_that_expects_a_grid_is_refused_by_a_tracker_with_another(
    graph: SegmentGraph,
) -> None:
    with TrackerService.start(graph, grid=TimeGrid(100, 1)) as svc:
        with (Agent.connect(svc.url, graph, grid=TimeGrid(10, 1), connect_timeout_s=2) as agent,
              pytest.raises(ServiceError) as info):
            agent.register_front(1, "src", 5, timeout_s=5)
        assert info.value.code == ErrorCode.GRID_MISMATCH
        assert "delta_ms 100" in str(info.value)
        with Agent.connect(svc.url, graph) as agent:  # one that expects nothing learns it
            assert agent.grid == TimeGrid(100, 1)


def test_an_agent_keeps_the_grid_it_learnt_across_a_tracker_restart(graph: SegmentGraph) -> None:
    """It labels and merges by the first tracker's grid: a tracker restarted on its port
    with another grid is refused, not taken silently."""
    first = TrackerService.start(graph, grid=TimeGrid(100, 1))
    port = first.server.port
    with Agent.connect(first.url, graph, connect_timeout_s=2) as agent:
        assert agent.grid == TimeGrid(100, 1)
        first.stop()
        with TrackerService.start(graph, grid=TimeGrid(10, 1), port=port):
            with pytest.raises(ServiceError) as info:
                agent.register_front(1, "src", 5, timeout_s=10)
            assert info.value.code == ErrorCode.GRID_MISMATCH
