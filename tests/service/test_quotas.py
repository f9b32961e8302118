"""Standing requests are bounded per address and in all, not only per connection
(issue 29, point 12): 200 connections with 1,024 subscriptions each took a good
client's confirmed-batch p50 from 0.4 to 723 ms. Here many connections from one other
address get no more than that address's quota together, and a good client on
127.0.0.1 still subscribes and asks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.service import Agent, TrackerService
from lowtide.service.net import Limits
from lowtide.wire.messages import Error, ErrorCode, MinTimeAt, MinTimeAtReply, Ok, Subscribe
from tests.service.raw import RawClient
from tests.service.relay import OTHER_HOST

pytestmark = pytest.mark.socket

CONNECTIONS = 6
PER_CONNECTION = 1_024
FAR_FUTURE_MS = 1 << 60


@pytest.fixture
def flooders(service: TrackerService) -> Iterator[list[RawClient]]:
    clients = [RawClient.welcomed(service.url, source=OTHER_HOST) for _ in range(CONNECTIONS)]
    try:
        yield clients
    finally:
        for client in clients:
            client.close()


def answers(client: RawClient, n: int) -> list[Ok | Error]:
    """The next ``n`` replies (Ok or Error), skipping the Notify frames."""
    out: list[Ok | Error] = []
    while len(out) < n:
        msg = client.recv()
        if isinstance(msg, Ok | Error):
            out.append(msg)
    return out


def test_subscriptions_are_capped_per_address(
    service: TrackerService, graph: SegmentGraph, flooders: list[RawClient]
) -> None:
    granted = 0
    for client in flooders:
        for req in range(1, PER_CONNECTION + 1):
            client.send(Subscribe(req, "sink"))
        replies = answers(client, PER_CONNECTION)
        granted += sum(isinstance(r, Ok) for r in replies)
        refused = [r for r in replies if isinstance(r, Error)]
        assert all(r.code == ErrorCode.LIMIT for r in refused)
    assert granted == Limits().max_subscriptions_per_host
    assert "max_subscriptions_per_host" in refused[0].message and OTHER_HOST in refused[0].message
    with Agent.connect(service.url, graph) as good, good.subscribe("sink") as sub:
        good.register_front(1, "src", 4)
        good.unregister_front(1)
        assert sub.next_update(5).time >= 0  # the good client is served


def test_questions_are_capped_per_address(
    service: TrackerService, graph: SegmentGraph, flooders: list[RawClient]
) -> None:
    waiting = 0
    for client in flooders:
        for req in range(1, PER_CONNECTION + 1):
            client.send(MinTimeAt(req, "sink", FAR_FUTURE_MS))
        client.send(Subscribe(0, "src"))  # a marker: its Ok comes after every refusal
        replies: list[object] = []
        while not replies or replies[-1] != Ok(0):
            replies.append(client.recv())
        waiting += PER_CONNECTION - sum(isinstance(r, Error) for r in replies)
    assert waiting == Limits().max_questions_per_host
    with Agent.connect(service.url, graph) as good:
        assert good.min_time_at("sink", 0) == 0  # the good client's question is answered


def test_a_gone_peers_questions_are_forgotten(service: TrackerService) -> None:
    """Connections that fill their quota and go, one after another, more than the
    address's quota in all: each one's questions leave with it."""
    for _ in range(Limits().max_questions_per_host // PER_CONNECTION + 2):
        client = RawClient.welcomed(service.url, source=OTHER_HOST)
        for req in range(1, PER_CONNECTION + 1):
            client.send(MinTimeAt(req, None, FAR_FUTURE_MS))
        assert client.ask(Subscribe(0, None)) == Ok(0)  # none of them was refused
        client.close()
    last = RawClient.welcomed(service.url, source=OTHER_HOST)
    try:
        assert isinstance(last.ask(MinTimeAt(1, None, 0)), MinTimeAtReply)
    finally:
        last.close()
