"""Dead fronts and slow batches over a real loopback server (issue 34 points 2 and 3).

A producer (its own agent, its own session) registers front 2, sends one item and dies
without unregistering; front 1 goes on. With ``dead_fronts="retire"`` the tracker
retires front 2 after ``front_timeout_ms``: the item it sent stays tracked, the rest
progresses, and a restart from the state dir keeps the retirement. With ``"wait"`` the
status says which front it waits for and since when. A query's batch that runs far
past ``stuck_after_ms`` is reported as waiting, not as a loss; a real loss still is.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import Ack, AckBatch
from lowtide.service import Agent, BatchKey, TrackerService
from lowtide.service.web.view import utc_slots, view_document
from lowtide.wire.messages import BatchState

GRAPH = SegmentGraph.of(("src", ()), ("sink", ("src",)))
TIMEOUT_MS = 600
X, X1 = 0xA0, 0xA1


@contextmanager
def agent(svc: TrackerService) -> Iterator[Agent]:
    a = Agent.connect(svc.url, GRAPH)
    try:
        yield a
    finally:
        a.close()


def until(cond: Callable[[], Any], timeout_s: float = 30.0, beat: Callable[[], None] = (
        lambda: None)) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        beat()
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


def producer_dies(svc: TrackerService) -> None:
    """Front 2 registers at 100, sends X (slot 105) and goes silent for good."""
    with agent(svc) as doomed:
        doomed.register_front(2, "src", 100)
        doomed.add_acks(AckBatch.of([Ack(0, 105, X, 1)]))
        doomed.flush()


def test_retire_lets_the_rest_progress_keeps_items_tracked_and_survives_restart(
    tmp_path: Path,
) -> None:
    opts: dict[str, Any] = {"state_dir": tmp_path, "front_timeout_ms": TIMEOUT_MS,
                            "dead_fronts": "retire"}
    svc = TrackerService.start(GRAPH, **opts)
    try:
        with agent(svc) as live:
            live.register_front(1, "src", 100)
            producer_dies(svc)
            slot = iter(range(110, 10_000))
            status = until(lambda: (s := live.status())["front_events"]["dead_retired"] and s,
                           beat=lambda: live.heartbeat(1, next(slot)))
            assert list(status["fronts"]) == ["1"]
            (line,) = [e for e in status["front_events"]["recent"] if "front 2" in e]
            assert line.startswith("front 2 retired at ")
            assert "on 'src', its heartbeat at slot 100" in line
            assert line.endswith("still tracked in flight there: 1 item(s) in slots [105, 106)")
            live.flush()
            assert live.status()["segments"][0]["min_time"] == 105  # NEVER PREMATURE
            live.send_batch(BatchKey("q", 0, "src", 0),
                            AckBatch.of([Ack(1, 105, X1, 1), Ack(0, 105, X, -1)]))
            live.send_batch(BatchKey("q", 0, "sink", 0), AckBatch.of([Ack(1, 105, X1, -1)]))
            live.heartbeat(1, 500)
            live.flush()
            until(lambda: live.status()["global_min"] == 500)  # the rest progressed
    finally:
        svc.stop()
    svc = TrackerService.start(GRAPH, **opts)  # the retirement was logged
    try:
        with agent(svc) as again:
            status = again.status()
            assert list(status["fronts"]) == ["1"] and status["global_min"] == 500
            assert status["front_events"]["dead_retired"] == 1
    finally:
        svc.stop()


def test_wait_says_which_front_it_waits_for_and_since_when() -> None:
    svc = TrackerService.start(GRAPH, front_timeout_ms=TIMEOUT_MS, dead_fronts="wait",
                               metrics_port=0)
    try:
        with agent(svc) as live:
            live.register_front(1, "src", 100)
            producer_dies(svc)
            slot = iter(range(110, 10_000))
            status = until(lambda: (s := live.status())["fronts_dead"] and s,
                           beat=lambda: live.heartbeat(1, next(slot)))
            dead = status["fronts_dead"]["2"]
            assert (dead["segment"], dead["time"], dead["policy"]) == ("src", 100, "wait")
            assert dead["text"].startswith("front 2 dead, waited for: silent since 20")
            assert status["segments"][0]["min_time"] == 100  # it waits, as it says
            assert sorted(status["fronts"]) == ["1", "2"]
            web = {f["front"]: f for f in view_document(status, GRAPH)["fronts"]}
            assert web[2]["state"] == "dead" and web[1]["state"] != "dead"
            assert web[2]["detail"].startswith("front 2 dead, waited for: silent since 20")
            metrics = until(lambda: 'lowtide_fronts_dead{pipeline="default"} 1.0' in (
                text := svc.server.metrics.render().decode()) and text)
            assert 'lowtide_fronts_dead_retired_total{pipeline="default"} 0.0' in metrics
    finally:
        svc.stop()


def test_a_slow_batch_is_waiting_not_a_loss_and_a_real_loss_is_still_reported() -> None:
    svc = TrackerService.start(GRAPH, stuck_after_ms=300)
    try:
        with agent(svc) as a:
            a.register_front(1, "src", 100)
            a.report_batch("q", 0, BatchState.OPEN, ("src", "sink"))  # batch 0 runs
            a.send_batch(BatchKey("p", 0, "src", 0), AckBatch.of([Ack(0, 105, X, 1)]))
            a.heartbeat(1, 200)
            a.flush()
            for _ in range(10):  # 2 s: well past stuck_after_ms, the driver alive
                a.report_batch("q", 0, BatchState.OPEN, ("src", "sink"))
                time.sleep(0.2)
            status = a.status()
            assert status["stuck"] == []  # NO FALSE LOSS
            (waiting,) = status["waiting"]
            assert waiting.startswith("segment 'src', slots [105, 106): 1 item(s) not yet "
                                      "received, waiting for query q batch 0, running ")
            assert [b["batch"] for b in status["open_batches"]] == [0]
            assert view_document(status, GRAPH)["waiting"] == [utc_slots(waiting, 10)]
            for batch in (0, 1):  # batch 1 would read X; it closes without it: lost
                a.report_batch("q", batch, BatchState.OPEN, ("src", "sink"))
                a.report_batch("q", batch, BatchState.CLOSED, ("src", "sink"))
            stuck = until(lambda: a.status()["stuck"])
            assert stuck == ["segment 'src', slots [105, 106): 1 item(s) missing"]
    finally:
        svc.stop()


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_window_later_than_its_sla_is_logged_counted_and_names_what_holds_it() -> None:
    lines = Lines()
    logger = logging.getLogger("lowtide.service.freshness")
    logger.addHandler(lines)
    logger.setLevel(logging.WARNING)  # whatever another test set "lowtide" to
    svc = TrackerService.start(GRAPH, sla_ms=300, sla_window_ms=100, metrics_every_ms=100)
    try:
        with agent(svc) as a:
            slot = int(time.time() * 100)
            a.register_front(1, "src", slot)  # then silent: it lags the wall clock
            a.report_batch("q", 4, BatchState.OPEN, ("src", "sink"))
            late = until(lambda: (s := a.status())["freshness"]["late"] and s)["freshness"]
            first = late["late"][0]
            assert first["sink"] == "sink" and first["late_ms"] > 0
            assert first["end_ms"] - first["start_ms"] == 100 and late["sla_ms"] == 300
            assert first["held_by"].startswith("front 1 on 'src' (heartbeat ")
            # seconds the batch ran when the window was judged late: 0 unless the machine is slow
            assert re.search(r", query q batch 4 running \d+ s$", first["held_by"])
            assert first["text"].startswith("sink 'sink' window [20")
            assert " later than its SLA (0.3 s): held by front 1 on 'src'" in first["text"]
            (oldest, *_rest) = late["open"]  # every open window has an ETA
            assert oldest["eta_ms"] >= oldest["end_ms"]
            text = svc.server.metrics.render().decode()
            assert 'lowtide_windows_late_total{pipeline="default"}' in text
            assert "lowtide_windows_late_total{pipeline=\"default\"} 0.0" not in text
    finally:
        svc.stop()
        logger.removeHandler(lines)
        logger.setLevel(logging.NOTSET)
    logged = [r for r in lines.records if r.msg == "window later than its SLA"]
    assert logged and "held by front 1" in logged[0].__dict__["detail"]


def test_a_front_timeout_with_shards_is_refused_in_one_line() -> None:
    from lowtide.service.server.config import ServerConfig

    with pytest.raises(ValueError, match="central tracker only"):
        ServerConfig(GRAPH, front_timeout_ms=1_000, shard_urls=("tcp://127.0.0.1:1",))
    with pytest.raises(ValueError, match="use 'wait' or 'retire'"):
        ServerConfig(GRAPH, front_timeout_ms=1_000, dead_fronts="drop")
