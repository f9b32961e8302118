"""Metrics, `lowtide status`, structured logs and the CLI wiring."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import time
import urllib.request

import pytest

from lowtide.cli import build_parser
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import AckBatch
from lowtide.service import Agent, BatchKey, TrackerService
from lowtide.service.client.status import answer_within, render
from lowtide.service.errors import ConnectionLost
from lowtide.service.logs import JsonFormatter

pytestmark = pytest.mark.socket


def test_cli_registers_service_commands() -> None:
    parser = build_parser()
    for argv in (["serve"], ["status"], ["bench", "service"]):
        assert callable(parser.parse_args(argv).handler)


def test_metrics_endpoint(graph: SegmentGraph) -> None:
    svc = TrackerService.start(graph, metrics_port=0, metrics_every_ms=0)
    try:
        with Agent.connect(svc.url, graph) as agent:
            agent.register_front(1, "src", 5)
            key = BatchKey("q", 0, "src", 0)
            agent.send_batch(key, AckBatch.from_columns(0, [5, 6], [1, 2], 1))
            agent.send_batch(key, AckBatch.from_columns(0, [5, 6], [1, 2], 1))
            with agent.subscribe("src") as sub:
                sub.next_update(5)
            url = f"http://127.0.0.1:{svc.server.metrics_port}/metrics"
            expected = [
                'lowtide_acks_total{pipeline="default"} 2.0',
                'lowtide_dedup_hits_total{pipeline="default"} 1.0',
                # slot 5 of 10 ms starts 50 ms after the epoch
                'lowtide_min_time_timestamp_seconds{pipeline="default",segment="src"} 0.05',
                'lowtide_open_windows{pipeline="default",segment="src"} 2.0',
                'lowtide_lag_seconds{pipeline="default",segment="_global"}',
                'lowtide_stuck_windows{pipeline="default",segment="_global"} 0.0',
            ]
            body, deadline = "", time.monotonic() + 30
            # gauges refresh on the server's tick, which a loaded machine delays
            while time.monotonic() < deadline:
                body = urllib.request.urlopen(url, timeout=5).read().decode()
                if all(line in body for line in expected):
                    break
                time.sleep(0.05)
        assert [line for line in expected if line not in body] == []
    finally:
        svc.stop()


def test_status_command(service: TrackerService, agent: Agent) -> None:
    agent.register_front(1, "src", 42)
    cmd = [sys.executable, "-m", "lowtide.cli", "status", "--url", service.url]
    shown = subprocess.run([*cmd, "--once"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "sink" in shown.stdout and "42" in shown.stdout
    raw = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=60)
    assert json.loads(raw.stdout)["global_min"] == 42


def test_status_of_a_missing_server_fails_cleanly() -> None:
    cmd = [sys.executable, "-m", "lowtide.cli", "status", "--url", "tcp://127.0.0.1:9", "--once"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "no answer" in done.stderr


def test_render_shows_shards_and_stuck_windows() -> None:
    status = {
        "server": "lowtide",
        "url": "tcp://x:1",
        "global_min": 3,
        "delta_ms": 10,
        "now_ms": 100,
        "segments": [
            {"segment": "a", "min_time": 3, "bound": 4, "open_windows": 1, "in_flight": 2}
        ],
        "shards": [{"url": "tcp://x:2", "connected": False, "status": None}],
        "stuck": ["segment 'a', slots [3, 4): 2 item(s) missing"],
    }
    from rich.console import Console

    console = Console(record=True, width=120)
    console.print(render(status))
    text = console.export_text()
    assert "DOWN" in text and "missing" in text and "70" in text  # lag = 100 - 3 * 10


def test_json_logs_keep_fields() -> None:
    record = logging.makeLogRecord(
        {"name": "lowtide.x", "levelname": "WARNING", "msg": "refused peer", "peer": "1.2.3.4:5"}
    )
    line = json.loads(JsonFormatter().format(record))
    assert line["event"] == "refused peer" and line["peer"] == "1.2.3.4:5"
    assert line["level"] == "warning"


def test_a_refused_dial_ends_the_wait_for_an_answer_at_once() -> None:
    """Nobody listens there: waiting the whole timeout tells nothing more (``status
    --once`` against a down tracker took 5 s). A group's next address may lead: it
    waits."""

    class Refused:
        connected = asyncio.Event()
        last_failure = ConnectionLost("dial")
        last_failure.__cause__ = ConnectionRefusedError()

        def __init__(self, url: str) -> None:
            self.url = url

    async def waited_s(url: str, timeout_s: float) -> float:
        start = time.monotonic()
        never = asyncio.get_running_loop().create_future()
        assert await answer_within(never, Refused(url), timeout_s) is None  # type: ignore[arg-type]
        return time.monotonic() - start

    assert asyncio.run(waited_s("tcp://127.0.0.1:1", 30.0)) < 1.0
    assert asyncio.run(waited_s("tcp://127.0.0.1:1,tcp://127.0.0.1:2", 0.5)) >= 0.5
