"""Logs under hostile peers (issue 21, point 11): fields from peers are clipped and
escaped, so a name cannot forge lines or flood the log, and one peer's repeated
errors are rate limited."""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Iterator

import pytest

from lowtide.core.errors import FrontOwned
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import Ack, AckBatch
from lowtide.service import Agent, TrackerService
from lowtide.service.logs import MAX_FIELD, JsonFormatter, LogBudget, TextFormatter
from lowtide.wire.frames import HEADER
from lowtide.wire.messages import WIRE_VERSION, Error, Hello, Role, Welcome
from tests.service.logged import capturing
from tests.service.raw import RawClient

FORGED = "\n00:00:00 info    lowtide.service.server: all is well"
EVIL_NAME = FORGED + "x" * 200_000  # within the handshake frame limit


@pytest.fixture(params=[TextFormatter, JsonFormatter])
def captured(request: pytest.FixtureRequest) -> Iterator[io.StringIO]:
    with capturing(request.param()) as out:
        yield out


@pytest.mark.socket
def test_a_hostile_name_and_repeated_bad_frames(
    service: TrackerService, captured: io.StringIO
) -> None:
    client = RawClient.open(service.url)
    try:
        client.send(Hello(WIRE_VERSION, Role.AGENT, b"n" * 32, EVIL_NAME, None))
        assert isinstance(client.recv(), Welcome)
        for _ in range(50):
            client.send_raw(HEADER.pack(3) + b"\xff\x00\x01")
        for _ in range(50):
            assert isinstance(client.recv(), Error)  # every one answered...
    finally:
        client.close()
    lines = captured.getvalue().splitlines()
    bad = [line for line in lines if "bad input" in line]
    assert 1 <= len(bad) <= 5  # ...but logged a few times only
    assert not any(line.startswith("00:00:00") or "all is well" in line[:40] for line in lines)
    assert all(len(line) < 8 * MAX_FIELD for line in lines)
    if lines[0].startswith("{"):
        assert all(json.loads(line) for line in lines)


def test_the_budget_refills_and_counts_what_it_dropped() -> None:
    now = [0.0]
    budget = LogBudget(burst=2, period_s=10, clock=lambda: now[0])
    assert [budget.allow("a") for _ in range(5)] == [0, 0, None, None, None]
    assert budget.allow("b") == 0  # per peer
    now[0] = 10.0
    assert budget.allow("a") == 3  # the next line says how many were dropped


@pytest.fixture
def plain() -> Iterator[io.StringIO]:
    """What a handler lowtide did not set up prints: the record's message alone."""
    with capturing(logging.Formatter("%(message)s")) as out:
        yield out


@pytest.mark.socket
def test_every_line_carries_its_details_under_any_handler(
    graph: SegmentGraph, plain: io.StringIO
) -> None:
    """Issue 29, point 15: a query's start-up printed lines reading just `stuck window`
    and `refused request`."""
    with TrackerService.start(graph, stuck_after_ms=100) as svc:
        with Agent.connect(svc.url, graph) as owner, Agent.connect(svc.url, graph) as other:
            owner.register_front(1, "src", 1)
            owner.add_acks(AckBatch.of([Ack(0, 2, 0xA, 1)]))  # sent, never received
            owner.heartbeat(1, 10)
            owner.flush()
            with pytest.raises(FrontOwned):
                other.register_front(1, "src", 50)
            time.sleep(0.5)
        # (from an address of its own: refusals are logged a few times a minute per host)
        RawClient.open(svc.url, preamble=b"GET ", source="127.0.0.9").close()
        time.sleep(0.2)
    lines = plain.getvalue().splitlines()
    events = {line.split(":", 1)[0] for line in lines}
    assert {"stuck window", "refused request", "refused peer"} <= events, lines
    assert all(": " in line and "=" in line for line in lines), lines
    stuck = next(line for line in lines if line.startswith("stuck window"))
    assert "segment 'src'" in stuck and "1 item(s) missing" in stuck and "fix=" in stuck
    refused = next(line for line in lines if line.startswith("refused request"))
    assert "FRONT_OWNED" in refused
