"""`lowtide status`: rows received and sent per segment, rows/s between polls, fronts
with the stalled ones named, over a real loopback server (central and 2 shards)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from lowtide.bench.service import GRAPH, server
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import AckBatch
from lowtide.core.time import TimeGrid
from lowtide.service import Agent, BatchKey, TrackerService
from lowtide.service.client.status import render
from lowtide.service.progress import RowRates, stalled_fronts
from lowtide.service.server.metrics import ServerMetrics
from lowtide.service.web.view import view_document

GRID = TimeGrid(delta_ms=10)


def text_of(status: dict[str, Any], rates: RowRates | None = None) -> str:
    console = Console(record=True, width=200)
    console.print(render(status, rates))
    return console.export_text()


def chain(front: int, slot: int, rows: int) -> list[tuple[str, AckBatch]]:
    """A front's ``rows`` items of ``slot`` through src -> mid -> sink, as four keyed
    batches (what a source task, two operators and a sink would send)."""
    v = np.arange(1, rows + 1, dtype=np.uint64) + np.uint64(front * 1_000_000 + slot * 1_000)
    t = np.full(rows, slot)
    return [
        ("src", AckBatch.from_columns(0, t, v, 1)),
        (
            "mid",
            AckBatch.concat(
                [AckBatch.from_columns(1, t, v, 1), AckBatch.from_columns(0, t, v, -1)]
            ),
        ),
        (
            "sink",
            AckBatch.concat(
                [AckBatch.from_columns(2, t, v, 1), AckBatch.from_columns(1, t, v, -1)]
            ),
        ),
        ("out", AckBatch.from_columns(2, t, v, -1)),
    ]


def send_chain(agent: Agent, front: int, slot: int, rows: int) -> None:
    for name, batch in chain(front, slot, rows):
        agent.send_batch(BatchKey("q", slot, name, front), batch)


def rows_of(status: dict[str, Any]) -> dict[str, tuple[int, int]]:
    return {s["segment"]: (s["received"], s["sent"]) for s in status["segments"]}




def test_row_rates_window_and_restart() -> None:
    rates = RowRates(window_s=3.0)
    assert rates.observe("a", 0.0, 0) is None  # one sample: no rate yet
    assert rates.observe("a", 1.0, 100) == 100.0
    assert rates.observe("a", 5.0, 900) == pytest.approx(200.0)  # old samples leave
    assert rates.observe("a", 6.0, 10) is None  # the tracker restarted: from zero again


def test_stalled_fronts_behind_the_pack_or_silent() -> None:
    fronts = {"0": ["src", 1_000], "1": ["src", 990], "2": ["src", 600]}
    assert stalled_fronts(fronts, 10_200, GRID) == [2]
    assert stalled_fronts(fronts, 10_000 + 61_000, GRID) == [0, 1, 2]


def test_metrics_count_rows_per_segment() -> None:
    metrics = ServerMetrics()
    seg = {"segment": "src", "min_time": 1, "open_windows": 0, "received": 3, "sent": 5}
    status = {"segments": [seg], "global_min": 1, "stuck": []}
    metrics.observe(status, 100, GRID)
    body = metrics.render().decode()
    assert 'lowtide_rows_total{direction="received",pipeline="default",segment="src"} 3.0' in body
    assert 'lowtide_rows_total{direction="sent",pipeline="default",segment="src"} 5.0' in body


def test_metrics_count_on_after_a_shard_restarts_from_zero() -> None:
    """A coordinator's sum falls when a shard restarts; what comes after still counts."""
    metrics = ServerMetrics()
    for received in (100, 40, 70):  # 100, then a restart lost 60, then 30 more
        seg = {"segment": "src", "min_time": 1, "open_windows": 0, "received": received}
        metrics.observe({"segments": [seg], "global_min": 1, "stuck": []}, 100, GRID)
    body = metrics.render().decode()
    assert 'lowtide_rows_total{direction="received",pipeline="default",segment="src"} 130.0' in body


@pytest.mark.socket
def test_status_counts_rows_and_rates_them(graph: SegmentGraph) -> None:
    with TrackerService.start(graph, grid=GRID) as svc, Agent.connect(svc.url, graph) as agent:
        agent.register_front(0, "src", 1)
        send_chain(agent, 0, 1, 30)
        agent.add_acks(AckBatch.from_columns(0, [2] * 5, np.arange(1, 6), 1))  # fire and forget
        agent.flush()
        first = agent.status()
        assert rows_of(first) == {"src": (30, 35), "mid": (30, 30), "sink": (30, 30)}
        assert first["acks_applied"] == 7  # entries merged by (segment, window), not rows
        rates = RowRates()
        text_of(first, rates)
        time.sleep(0.6)  # RowRates needs half a second between samples
        send_chain(agent, 0, 3, 20)
        second = agent.status()
        shown = text_of(second, rates)
        line = next(ln for ln in shown.splitlines() if ln.lstrip("│ ").startswith("sink"))
        assert float(line.split("│")[4].replace(",", "")) > 0, shown  # the rows/s column
        raw = subprocess.run(
            [sys.executable, "-m", "lowtide.cli", "status", "--url", svc.url, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert raw.returncode == 0, raw.stderr
        assert rows_of(json.loads(raw.stdout))["sink"] == (50, 50)


@pytest.mark.socket
def test_status_names_the_front_whose_heartbeats_stop(graph: SegmentGraph) -> None:
    with TrackerService.start(graph, grid=GRID) as svc, Agent.connect(svc.url, graph) as agent:
        now = GRID.slot_of(time.time_ns() // 1_000_000)
        agent.register_front(0, "src", now)
        agent.register_front(1, "src", now)
        for step in range(1, 4):  # front 0 moves on, front 1 stays silent
            agent.heartbeat(0, now + step * 100)
            agent.flush()
            fronts = agent.status()["fronts"]
            assert fronts["0"][1] == now + step * 100 and fronts["1"][1] == now
        shown = text_of(agent.status())
        rows = {ln.split("│")[1].strip(): ln for ln in shown.splitlines() if "│ src" in ln}
        assert "STALLED" in rows["1"] and "STALLED" not in rows["0"], shown
        cli = subprocess.run(
            [sys.executable, "-m", "lowtide.cli", "status", "--url", svc.url, "--once"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0 and "STALLED" in cli.stdout, cli.stderr


@pytest.mark.socket
def test_coordinator_sums_row_counts_of_its_shards(tmp_path: Path) -> None:
    with server(tmp_path, shards=2) as url, Agent.connect(url, GRAPH) as agent:
        agent.register_front(0, "src", 1)
        for slot in range(1, 5):  # windows alternate between the two shards
            for name, batch in chain(0, slot, 10)[:2]:  # into src, then on into mid
                agent.send_batch(BatchKey("q", slot, name, 0), batch)
        deadline = time.monotonic() + 20
        status = agent.status()
        while rows_of(status) != {"src": (40, 40), "mid": (0, 40), "sink": (0, 0)}:
            assert time.monotonic() < deadline, status  # the coordinator polls shards each 1 s
            time.sleep(0.1)
            status = agent.status()
        per_shard = [rows_of(s["status"])["src"][0] for s in status["shards"]]
        assert per_shard == [20, 20]


def test_declared_and_refused_fronts_show_in_lowtide_status() -> None:
    """Issue 29 point 1: the consumer's side (``lowtide status``, the web view) shows a
    declared front still awaited and a front refused for being behind."""
    status = {"server": "t", "segments": [], "fronts": {}, "now_ms": 0,
              "fronts_declared": {"4": ["src", 1000, -1]},
              "front_events": {"behind": 1, "retired": 0, "recent": [
                  "refused: front 5 registers at 80, below its segment's min time 120"]}}
    text = text_of(status)
    assert "front 4 declared on src, not registered: holds it at 1000" in text
    assert "fronts refused as behind their segment: 1" in text
    assert "front 5 registers at 80" in text
    doc = view_document(status, SegmentGraph.of(("src", ())))
    assert doc["fronts"] == [{"front": 4, "segment": "src", "heartbeat": 1000,
                              "heartbeat_lag_ms": -10_000, "stalled": False,
                              "declared": True}]
    assert doc["front_events"]["behind"] == 1
