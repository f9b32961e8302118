"""Refused means never applied, and a refusal never lets a min time pass anything
(issue 21, points 1, 4 and 7), over real sockets and, where it matters, real restarts.
"""

from __future__ import annotations

import time
from contextlib import closing
from pathlib import Path

import pytest

from lowtide.core.errors import FrontHeld, FrontOwned, TableOverflow
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import Ack, AckBatch, Heartbeat
from lowtide.service import Agent, BatchKey, SessionFailed, TrackerService
from lowtide.wire.messages import Batch, Error, ErrorCode, FrontOp, Ok
from tests.service.raw import RawClient

pytestmark = pytest.mark.socket

FAR = 1 << 21  # slots ahead of the head: more than the table may grow (TableOverflow)


def sink_min(url: str, graph: SegmentGraph) -> int:
    with Agent.connect(url, graph) as probe:
        return int(probe.status()["segments"][2]["min_time"])


# ------------------------------------------------------------ point 1: failed sessions
def test_refused_background_flush_fails_the_session_on_the_server(
    service: TrackerService, graph: SegmentGraph
) -> None:
    """A client that goes on after its flush was refused (a client cannot be trusted
    to stop): its later heartbeats are refused, so the sink's min time stays below
    the item whose send-ack was in the refused flush."""
    with closing(RawClient.welcomed(service.url)) as raw:
        assert raw.ask(FrontOp(1, 7, True, 1, "src", 0)) == Ok(1)
        lost = AckBatch.of([Ack(0, 5, 0xA, 1), Ack(0, FAR, 0xB, 1)])  # item at 5 in flight
        refused = raw.ask(Batch(2, 7, "", lost))
        assert isinstance(refused, Error) and refused.code == ErrorCode.TABLE_OVERFLOW
        later = raw.ask(Batch(3, 7, "", AckBatch.empty(), (Heartbeat(1, 50),)))
        assert isinstance(later, Error) and later.code == ErrorCode.SESSION_FAILED
        assert "request 2" in later.message and "TABLE_OVERFLOW" in later.message
        moved = raw.ask(FrontOp(4, 7, True, 1, "src", 60))
        assert isinstance(moved, Error) and moved.code == ErrorCode.SESSION_FAILED
    assert sink_min(service.url, graph) == 0


def test_failed_session_stays_failed_after_a_restart(tmp_path: Path, graph: SegmentGraph) -> None:
    svc = TrackerService.start(graph, state_dir=tmp_path / "state")
    try:
        client = RawClient.welcomed(svc.url)
        client.ask(FrontOp(1, 7, True, 1, "src", 0))
        client.ask(Batch(2, 7, "", AckBatch.of([Ack(0, 5, 0xA, 1), Ack(0, FAR, 0xB, 1)])))
        client.close()
    finally:
        svc.stop()
    svc = TrackerService.start(graph, state_dir=tmp_path / "state")
    try:
        client = RawClient.welcomed(svc.url)
        later = client.ask(Batch(3, 7, "", AckBatch.empty(), (Heartbeat(1, 50),)))
        assert isinstance(later, Error) and later.code == ErrorCode.SESSION_FAILED
        client.close()
        assert sink_min(svc.url, graph) == 0
    finally:
        svc.stop()


def test_the_agent_raises_on_its_next_call(service: TrackerService, graph: SegmentGraph) -> None:
    with Agent.connect(service.url, graph) as agent:
        agent.register_front(1, "src", 0)
        agent.add_acks(AckBatch.of([Ack(0, 5, 0xA, 1), Ack(0, FAR, 0xB, 1)]))
        agent.heartbeat(1, 50)
        with pytest.raises(TableOverflow):
            agent.flush()
        for call in (lambda: agent.heartbeat(1, 60), agent.flush,
                     lambda: agent.register_front(2, "src", 0)):
            with pytest.raises(SessionFailed) as info:
                call()
            assert "\n" not in str(info.value) and "refused a background flush" in str(info.value)
    assert sink_min(service.url, graph) == 0


# ------------------------------------------------------------ point 7: refusals are final
def test_a_resent_refused_batch_stays_refused_across_a_restart(
    tmp_path: Path, graph: SegmentGraph
) -> None:
    state = tmp_path / "state"
    behind = Batch(2, 9, '["q",1,"src",0]', AckBatch.of([Ack(0, 3, 0x1, 1)]))
    svc = TrackerService.start(graph, state_dir=state)
    try:
        client = RawClient.welcomed(svc.url)
        client.ask(FrontOp(1, 9, True, 1, "src", 10))
        first = client.ask(behind)
        assert isinstance(first, Error) and first.code == ErrorCode.ACK_BEHIND_HEAD
        assert client.ask(behind) == first
        assert client.ask(Batch(3, 9, "", AckBatch.empty(), (Heartbeat(1, 11),))) == Ok(3)
        client.close()
    finally:
        svc.stop()
    svc = TrackerService.start(graph, state_dir=state)
    try:
        client = RawClient.welcomed(svc.url)
        assert client.ask(behind) == first  # not Ok(duplicate=True): it was never applied
        client.close()
    finally:
        svc.stop()


# ------------------------------------------------------------ point 4: fronts have owners
def test_another_session_may_not_move_or_unregister_a_front(
    service: TrackerService, graph: SegmentGraph
) -> None:
    with Agent.connect(service.url, graph) as owner, Agent.connect(service.url, graph) as other:
        owner.register_front(1, "src", 5, owner="gateway")
        owner.add_acks(AckBatch.of([Ack(0, 6, 0xA, 1)]))  # in flight, not yet received
        owner.flush()
        with pytest.raises(FrontOwned):
            other.unregister_front(1, owner="mallory")
        with pytest.raises(FrontOwned):
            other.register_front(1, "src", 100, owner="mallory")
        assert service_fronts(owner) == {"1": ["src", 5]}
        assert sink_min(service.url, graph) <= 6
        owner.unregister_front(1)


def test_another_owner_may_not_heartbeat_a_front(
    service: TrackerService, graph: SegmentGraph
) -> None:
    """Issue 29 point 4: a heartbeat moves a front as much as a registration does, so it
    proves the owner too, in a keyed batch and fire and forget alike."""
    with Agent.connect(service.url, graph) as owner:
        owner.register_front(1, "src", 5, owner="gateway")
        owner.add_acks(AckBatch.of([Ack(0, 6, 0xA, 1)]))  # the owner's legal item
        owner.flush()
        with Agent.connect(service.url, graph) as other:
            with pytest.raises(FrontOwned):
                other.send_batch(BatchKey("x", 0, "src", 0), AckBatch.empty(),
                                 [Heartbeat(1, 500)], owner="mallory")
            other.heartbeat(1, 500, owner="mallory")
            with pytest.raises(FrontOwned):
                other.flush()
        with Agent.connect(service.url, graph) as anonymous:
            anonymous.heartbeat(1, 500)  # no owner named: its own session, not the owner
            with pytest.raises(FrontOwned):
                anonymous.flush()
        assert service_fronts(owner) == {"1": ["src", 5]}
        assert sink_min(service.url, graph) <= 6
        with Agent.connect(service.url, graph) as task:  # a Spark task of the owner
            task.send_batch(BatchKey("x", 1, "src", 0), AckBatch.empty(), [Heartbeat(1, 7)],
                            owner="gateway")
        owner.heartbeat(1, 8)  # the registering agent proves its owner by itself
        owner.flush()
        assert service_fronts(owner) == {"1": ["src", 8]}


def test_a_successor_with_the_same_owner_name_takes_over(
    service: TrackerService, graph: SegmentGraph
) -> None:
    with Agent.connect(service.url, graph) as first:
        first.register_front(1, "src", 5, owner="ingest")
    with Agent.connect(service.url, graph) as successor:  # a restarted process
        with pytest.raises(FrontHeld):  # the first one was seen less than a lease ago
            successor.register_front(1, "src", 9, owner="ingest")
        time.sleep(1.1)  # EngineConfig.front_lease_ms: a live producer keeps its front
        successor.register_front(1, "src", 9, owner="ingest")
        assert service_fronts(successor) == {"1": ["src", 9]}
        successor.unregister_front(1, owner="ingest")
        assert service_fronts(successor) == {}


def service_fronts(agent: Agent) -> dict[str, list[object]]:
    fronts: dict[str, list[object]] = agent.status()["fronts"]
    return fronts
