"""A failed session raises a fresh exception on every call (issue 29, point 13): one
exception object re-raised kept every raise's frames, so its traceback grew without
bound in a producer that goes on heartbeating. The same holds for the other errors
an agent keeps and raises again (a refusal at handshake)."""

from __future__ import annotations

import traceback

import pytest

from lowtide.core.errors import TableOverflow
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import Ack, AckBatch
from lowtide.service import Agent, ServiceError, SessionFailed, TrackerService

pytestmark = pytest.mark.socket

FAR = 1 << 21


def depth(exc: BaseException) -> int:
    return len(traceback.extract_tb(exc.__traceback__))


def raised(call) -> BaseException:
    try:
        call()
    except Exception as exc:
        return exc
    raise AssertionError("the call did not raise")


def test_session_failed_does_not_grow_with_each_call(
    service: TrackerService, graph: SegmentGraph
) -> None:
    with Agent.connect(service.url, graph) as agent:
        agent.register_front(1, "src", 0)
        agent.add_acks(AckBatch.of([Ack(0, 5, 0xA, 1), Ack(0, FAR, 0xB, 1)]))
        with pytest.raises(TableOverflow):
            agent.flush()
        calls = (lambda: agent.heartbeat(1, 60), agent.flush, lambda: agent.add_acks(
            AckBatch.empty()), lambda: agent.register_front(2, "src", 0))
        for call in calls:
            first = raised(call)
            for _ in range(200):
                last = raised(call)
            assert isinstance(last, SessionFailed) and last is not first
            assert depth(last) == depth(first)
            assert str(last) == str(first)


def test_a_refusal_at_handshake_does_not_grow_with_each_call(
    secured: TrackerService, graph: SegmentGraph
) -> None:
    with Agent.connect(secured.url, graph, secret=b"not the secret at all") as agent:
        first = raised(lambda: agent.register_front(1, "src", 0, timeout_s=5))
        assert isinstance(first, ServiceError)
        for _ in range(50):
            last = raised(lambda: agent.register_front(1, "src", 0, timeout_s=5))
        assert last is not first and depth(last) == depth(first)

