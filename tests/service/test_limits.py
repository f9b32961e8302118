"""What one peer can make the tracker hold is bounded (issue 21, point 6): frames
before authentication, connections, silent connections, and standing requests per
connection. Each refusal is clear, and other clients go on being served."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.service import Agent, TrackerService
from lowtide.service.net import Limits
from lowtide.wire.frames import HEADER
from lowtide.wire.messages import (
    Error,
    ErrorCode,
    FrontOp,
    MinTimeAt,
    Notify,
    Ok,
    Subscribe,
    Welcome,
)
from tests.service.raw import RawClient

pytestmark = pytest.mark.socket

FAR_FUTURE_MS = 1 << 60


@pytest.fixture
def limited(graph: SegmentGraph) -> Iterator[TrackerService]:
    limits = Limits(
        max_connections=3,
        idle_timeout_s=0.5,
        max_questions_per_peer=3,
        max_subscriptions_per_peer=2,
    )
    svc = TrackerService.start(graph, limits=limits)
    try:
        yield svc
    finally:
        svc.stop()


def assert_closed(client: RawClient) -> None:
    with pytest.raises(ConnectionError):
        while True:
            client.recv(timeout_s=5)


def test_a_large_frame_before_authentication_is_refused_not_buffered(
    service: TrackerService,
) -> None:
    client = RawClient.open(service.url)
    try:
        client.send_raw(HEADER.pack(32 << 20) + b"x" * 1000)  # and the rest never comes
        err = client.recv(timeout_s=3)
        limit = Limits().max_handshake_frame
        assert isinstance(err, Error) and f"exceeds the limit of {limit}" in err.message
        assert_closed(client)
    finally:
        client.close()


def test_connections_are_capped(limited: TrackerService, graph: SegmentGraph) -> None:
    clients = [RawClient.open(limited.url) for _ in range(3)]
    try:
        assert all(isinstance(c.hello(), Welcome) for c in clients)
        extra = RawClient.open(limited.url)
        err = extra.hello()  # handshakes have slots of their own; admission is refused
        assert isinstance(err, Error) and err.code == ErrorCode.LIMIT
        assert "Limits.max_connections" in err.message
        assert_closed(extra)
        extra.close()
        clients.pop().close()
        time.sleep(0.2)  # the server sees that one go
        with Agent.connect(limited.url, graph) as good:
            assert good.status()["connections"] == 3
    finally:
        for c in clients:
            c.close()


def test_a_silent_connection_is_closed_and_keepalives_keep_one_open(
    limited: TrackerService,
) -> None:
    silent, talking = RawClient.open(limited.url), RawClient.open(limited.url)
    try:
        assert isinstance(silent.hello(), Welcome) and isinstance(talking.hello(), Welcome)
        for _ in range(8):  # 1.6 s, over three idle timeouts
            talking.send_raw(HEADER.pack(0))  # an empty frame: a keepalive
            time.sleep(0.2)
        assert_closed(silent)
        talking.send(FrontOp(1, 5, True, 1, "src", 3))
        assert talking.recv() == Ok(1)
    finally:
        silent.close()
        talking.close()


def test_min_time_questions_per_connection_are_capped(limited: TrackerService) -> None:
    client = RawClient.open(limited.url)
    try:
        assert isinstance(client.hello(), Welcome)
        for req in range(1, 5):
            client.send(MinTimeAt(req, None, FAR_FUTURE_MS))
        err = client.recv()  # the first three wait for their time; the fourth:
        assert isinstance(err, Error) and err.req == 4 and err.code == ErrorCode.LIMIT
        assert "max_questions_per_peer" in err.message
    finally:
        client.close()


def test_subscriptions_per_connection_are_capped(limited: TrackerService) -> None:
    client = RawClient.open(limited.url)
    try:
        assert isinstance(client.hello(), Welcome)
        for _ in range(5):  # the same request again replaces, it does not add
            client.send(Subscribe(1, "src"))
            assert client.recv() == Ok(1) and isinstance(client.recv(), Notify)
        client.send(Subscribe(2, "mid"))
        assert client.recv() == Ok(2) and isinstance(client.recv(), Notify)
        client.send(Subscribe(3, "sink"))
        err = client.recv()
        assert isinstance(err, Error) and err.req == 3 and err.code == ErrorCode.LIMIT
        assert "max_subscriptions_per_peer" in err.message
        client.send(FrontOp(4, 5, True, 1, "src", 3))
        assert client.recv() == Ok(4)
        notify = client.recv()  # one update per subscription: 1 was replaced, not added
        assert isinstance(notify, Notify) and [req for req, _ in notify.updates] == [1, 2]
    finally:
        client.close()
