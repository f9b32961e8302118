"""A shard refuses acks that cannot prove their node time (rule 8; issue 21, point 3),
and since their items may be in flight anyway, holds its min times below them: a
shard server on a real socket, fed by a raw client that lies."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import Ack, AckBatch, Heartbeat, NodeTime
from lowtide.core.time import TimeGrid
from lowtide.service import TrackerService
from lowtide.wire.messages import (
    Batch,
    Error,
    ErrorCode,
    FrontOp,
    Ok,
    Role,
    ShardReportFrame,
    WatchShard,
)
from tests.service.raw import RawClient

pytestmark = pytest.mark.socket

GRAPH = SegmentGraph.of(("src", ()), ("sink", ("src",)))
LOW = 4  # window 4 of 1 slot: shard 0 of 2 owns it


@pytest.fixture
def shard0() -> Iterator[tuple[RawClient, RawClient]]:
    """An agent's and a coordinator's connection to shard 0 of 2."""
    svc = TrackerService.start(GRAPH, grid=TimeGrid(10, 1), shard=(0, 2))
    try:
        agent = RawClient.welcomed(svc.url, shard=(0, 2))
        coordinator = RawClient.welcomed(svc.url, Role.COORDINATOR, (0, 2))
        try:
            yield agent, coordinator
        finally:
            agent.close()
            coordinator.close()
    finally:
        svc.stop()


def reported(coordinator: RawClient) -> tuple[int, ...]:
    assert coordinator.ask(WatchShard(99)) == Ok(99)
    report = coordinator.recv()
    assert isinstance(report, ShardReportFrame)
    return report.report.min_times


@pytest.mark.parametrize(
    "node_time",
    [None, NodeTime(node=5, counter=1, min_time=LOW + 50)],
    ids=["no-node-time", "lying-min-time"],
)
def test_unproven_acks_are_refused_and_hold_the_shard(
    shard0: tuple[RawClient, RawClient], node_time: NodeTime | None
) -> None:
    agent, coordinator = shard0
    assert agent.ask(FrontOp(1, 5, True, 1, "src", 0)) == Ok(1)
    in_flight = AckBatch.of([Ack(0, LOW, 0xA, 1)])
    refused = agent.ask(Batch(2, 5, '["q",0,"src",0]', in_flight, (), node_time))
    assert isinstance(refused, Error) and refused.code == ErrorCode.BAD_REQUEST
    assert "rule 8" in refused.message
    # its owner heartbeats the front far past the refused item: the shard stays below it
    assert agent.ask(Batch(3, 5, "", AckBatch.empty(), (Heartbeat(1, 100),))) == Ok(3)
    assert max(reported(coordinator)) <= LOW


def test_proven_acks_are_applied(shard0: tuple[RawClient, RawClient]) -> None:
    agent, coordinator = shard0
    assert agent.ask(FrontOp(1, 5, True, 1, "src", 0)) == Ok(1)
    acks = AckBatch.of([Ack(0, LOW, 0xA, 1), Ack(0, LOW, 0xA, -1)])
    assert agent.ask(Batch(2, 5, "", acks, (Heartbeat(1, 100),), NodeTime(5, 1, LOW))) == Ok(2)
    assert min(reported(coordinator)) >= 100
