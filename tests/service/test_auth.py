"""Mutual authentication and protected frames (issue 21, point 9): with a shared
secret, a tracker that cannot prove it tells an agent nothing, and a frame altered
on the way is refused."""

from __future__ import annotations

import os

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.service import Agent, ServiceError, TrackerService
from lowtide.wire.messages import WIRE_VERSION, Auth, Challenge, ErrorCode, Hello, Welcome
from tests.service.conftest import SECRET
from tests.service.peers import AlteringProxy, FakeTracker

pytestmark = pytest.mark.socket



def welcome(hello: Hello) -> Welcome:
    assert hello.graph is not None
    return Welcome(WIRE_VERSION, "fake", hello.graph, 10, 1)


SCRIPTS = {
    # it cannot compute the server's proof, so it makes one up
    "made-up-proof": lambda h: [Challenge(os.urandom(32), os.urandom(32)), welcome(h)],
    # or it skips the challenge altogether
    "no-challenge": lambda h: [welcome(h)],
}


@pytest.mark.parametrize("script", SCRIPTS.values(), ids=SCRIPTS.keys())
def test_an_agent_believes_nothing_from_a_tracker_that_cannot_prove_the_secret(
    graph: SegmentGraph, script
) -> None:
    fake = FakeTracker(script)
    try:
        with Agent.connect(fake.url, graph, secret=SECRET, connect_timeout_s=2) as agent:
            with pytest.raises(ServiceError) as info:
                agent.subscribe("sink", timeout_s=5)
            assert info.value.code == ErrorCode.AUTH_FAILED
        # and the agent never proved anything to it
        assert not any(isinstance(m, Auth) for m in fake.received)
    finally:
        fake.close()


FRONT_OP, TIME_OFFSET = 11, 26  # a FrontOp's type byte; where its time starts


def test_an_altered_frame_is_refused_and_never_applied(
    secured: TrackerService, graph: SegmentGraph
) -> None:
    proxy = AlteringProxy(secured.url, FRONT_OP, TIME_OFFSET)
    try:
        with Agent.connect(proxy.url, graph, secret=SECRET) as agent:
            agent.register_front(1, "src", 6, timeout_s=10)  # altered to 7: refused, resent
            assert proxy.altered == 1
            assert agent.status()["fronts"] == {"1": ["src", 6]}
        assert secured.server.metrics.errors.labels("default", "AUTH_FAILED")._value.get() == 1
    finally:
        proxy.close()


def test_agents_with_the_secret_work_through_a_faithful_proxy(
    secured: TrackerService, graph: SegmentGraph
) -> None:
    proxy = AlteringProxy(secured.url, kind=255, offset=0)  # never matches: alters nothing
    try:
        with Agent.connect(proxy.url, graph, secret=SECRET) as agent, agent.subscribe("src") as sub:
            agent.register_front(1, "src", 6)
            assert sub.wait_for(6, 5).time == 6
    finally:
        proxy.close()
