"""Key ranges (rule 15) and loops (rule 11) over real sockets: the tracker's status,
`lowtide status`, the metrics and the web view show a min time per key range, on one
tracker and on `lowtide serve --shards 2`."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from rich.console import Console

from lowtide.core.graph import SegmentGraph, SegmentSpec
from lowtide.core.messages import AckBatch
from lowtide.service import Agent, BatchKey, TrackerService
from lowtide.service.client.status import render
from lowtide.service.deploy.standalone import read_graph
from lowtide.service.web.view import view_document
from lowtide.wire.messages import graph_spec
from tests.service.procs import serve

pytestmark = pytest.mark.socket

# front 1 feeds range 3 of src (it lags), front 2 ranges 0..2
RANGED = SegmentGraph.of(
    SegmentSpec("src", (), key_ranges=4, front_ranges=((1, (3,)), (2, (0, 1, 2)))),
    ("sink", ("src",)),
)


def wait_for(read: Any, done: Any, what: str) -> Any:
    deadline = time.monotonic() + 30
    while not done(got := read()):
        assert time.monotonic() < deadline, f"never saw {what}: {got}"
        time.sleep(0.05)
    return got


def test_status_metrics_and_view_show_a_min_time_per_key_range() -> None:
    svc = TrackerService.start(RANGED, metrics_port=0, web_port=0, metrics_every_ms=0)
    try:
        with svc.agent() as agent:
            agent.register_front(1, "src", 10)
            agent.register_front(2, "src", 10)
            # a row of range 1 sent and received: acks carry its range's code
            cell = RANGED.cell(0, 1)
            agent.send_batch(BatchKey("q", 0, "src", 0),
                             AckBatch.from_columns(cell, [20], [0xA], 1))
            agent.heartbeat(2, 50)
            agent.flush()
            status = wait_for(agent.status, lambda s: s["segments"][0]["key_ranges"][0] == 50,
                              "range 0 at 50")
            src = status["segments"][0]
            assert src["key_ranges"] == [50, 20, 50, 10] and src["min_time"] == 10
            assert src["received"] == 0 and src["sent"] == 1  # counted for src
            shown = Console(width=200, record=True)
            shown.print(render(status))
            text = shown.export_text()
            assert "src#3" in text and "src#1" in text
            url = f"http://127.0.0.1:{svc.server.metrics_port}/metrics"
            metrics = wait_for(lambda: urllib.request.urlopen(url, timeout=5).read().decode(),
                               lambda b: 'segment="src#0"} 0.5' in b, "src#0 at 0.5 s")
            assert 'lowtide_min_time_timestamp_seconds{pipeline="default",segment="src#3"} 0.1' \
                in metrics
            assert svc.web_url is not None
            view = wait_for(lambda: json_view(svc.web_url), lambda v: v["segments"]
                            and v["segments"][0]["key_ranges"][0]["min_time"] == 50,
                            "key ranges in the view")
            assert [k["min_time"] for k in view["segments"][0]["key_ranges"]] == [50, 20, 50, 10]
    finally:
        svc.stop()


def test_a_sharded_service_combines_shows_and_serves_each_key_range(tmp_path: Path) -> None:
    """`lowtide serve --shards 2`, adopting the agent's graph (as a Spark pipeline's
    remote tracker does): each range's min time is the minimum over both shards (slot
    50 is shard 0's, 51 shard 1's), announced to a range's subscribers, asked by
    `min_time_at`, and shown by the status, `lowtide status`, the metrics and the web
    view, as one tracker shows them."""
    args = ("--shards", "2", "--metrics-port", "0", "--web-port", "0")
    with serve(tmp_path, *args) as coordinator:
        out = coordinator.proc.stdout
        assert out is not None  # printed with the serving line: read from its buffer
        extra = {line.split()[1]: line.split()[-1] for line in (out.readline(), out.readline())}
        with Agent.connect(coordinator.url, RANGED) as agent:
            agent.register_front(1, "src", 10)
            agent.register_front(2, "src", 10)
            with agent.subscribe("src#0") as sub:
                assert sub.wait_for(10, 30).time == 10
                agent.send_batch(BatchKey("q", 0, "src", 0),
                                 AckBatch.from_columns(RANGED.cell(0, 1), [20], [0xA], 1))
                agent.heartbeat(2, 50)
                agent.flush()
                assert sub.wait_for(50, 30).time == 50
            status = wait_for(agent.status, lambda s: s["segments"][0]["key_ranges"] ==
                              [50, 20, 50, 10], "every range combined")
            assert status["segments"][0]["min_time"] == 10 == status["global_min"]
            at = time.time_ns() // 1_000_000
            assert (agent.min_time_at("src#0", at), agent.min_time_at("src#1", at)) == (50, 20)
            shown = Console(width=200, record=True)
            shown.print(render(status))
            assert "src#3" in shown.export_text()
            metrics = wait_for(lambda: urllib.request.urlopen(extra["metrics"], timeout=5)
                               .read().decode(), lambda b: 'segment="src#1"} 0.2' in b,
                               "src#1 at 0.2 s")
            assert 'lowtide_min_time_timestamp_seconds{pipeline="default",segment="src#0"} 0.5' \
                in metrics
            view = wait_for(lambda: json_view(extra["web"]), lambda v: v["segments"] and
                            v["segments"][0]["key_ranges"][0]["min_time"] == 50, "the view")
            assert [k["min_time"] for k in view["segments"][0]["key_ranges"]] == [50, 20, 50, 10]


def test_a_graph_file_may_split_a_segment_into_key_ranges(tmp_path: Path) -> None:
    graph_file = tmp_path / "graph.json"
    graph_file.write_text(json.dumps(graph_spec(RANGED)))  # [["src", [], 4, [[1, [3]], ...
    assert read_graph(graph_file) == RANGED
    graph_file.write_text('[["src", [], 4, [[1, [7]]]]]')
    with pytest.raises(ValueError, match="front 1 feeds ranges \\[7\\]"):
        read_graph(graph_file)


def json_view(url: str | None) -> Any:
    parts = urlsplit(str(url))
    view = f"http://{parts.hostname}:{parts.port}/api/view"
    return json.loads(urllib.request.urlopen(view, timeout=5).read())


def test_the_view_draws_a_loop() -> None:
    loop = SegmentGraph.of(("in", ()), ("work", ("in", "retry")), ("retry", ("work",)))
    doc = view_document({"segments": [], "global_min": 0}, loop)
    assert [s["depth"] for s in doc["segments"]] == [0, 1, 2]


def test_a_key_range_is_asked_and_followed_like_a_segment() -> None:
    svc = TrackerService.start(RANGED)
    try:
        with svc.agent() as agent:
            agent.register_front(1, "src", 10)
            agent.register_front(2, "src", 10)
            with agent.subscribe("src#0") as sub:
                assert sub.next_update(10).time == 10
                agent.heartbeat(2, 50)
                agent.flush()
                assert sub.next_update(10).time == 50
            at = svc.server.clock.now_ms()
            assert agent.min_time_at("src#0", at) == 50
            assert agent.min_time_at("src#3", at) == 10
            with pytest.raises(Exception, match="src#4"):
                agent.min_time_at("src#4", at)
            # a task's ranges asked together (one round trip's wait): the same answers
            assert agent.min_times_at(["src#0", "src#3", "src", None], at) == [50, 10, 10, 10]
            with pytest.raises(Exception, match="src#4"):
                agent.min_times_at(["src#0", "src#4"], at)
    finally:
        svc.stop()
