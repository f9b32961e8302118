"""The metrics follow Prometheus' conventions, and the Grafana dashboard in
docs/grafana queries only metrics a live server exports (and all of them)."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import lowtide
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import AckBatch
from lowtide.service import Agent, BatchKey, TrackerService

pytestmark = pytest.mark.socket

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "lowtide.json"
NOT_BASE_UNITS = re.compile(r"_(ms|milliseconds|us|ns|minutes|hours|slots?|kb|mb)(_|$)")
PER_SEGMENT = {"lag_seconds", "min_time_timestamp_seconds", "open_windows", "stuck_windows", "rows"}


def scrape(graph: SegmentGraph) -> list[Any]:
    """The families of a live server that applied a batch (and one again)."""
    svc = TrackerService.start(graph, metrics_port=0, metrics_every_ms=0, pipeline="orders")
    try:
        with Agent.connect(svc.url, graph) as agent:
            agent.register_front(1, "src", 5)
            key = BatchKey("q", 0, "src", 0)
            for _ in range(2):
                agent.send_batch(key, AckBatch.from_columns(0, [5, 6], [1, 2], 1))
            url = f"http://127.0.0.1:{svc.server.metrics_port}/metrics"
            for _ in range(100):  # gauges refresh on the server's tick
                body = urllib.request.urlopen(url, timeout=5).read().decode()
                if "lowtide_open_windows{" in body:
                    break
                time.sleep(0.05)
        return list(text_string_to_metric_families(body))
    finally:
        svc.stop()


def exported_names(families: list[Any]) -> set[str]:
    """What a query may name: a counter's samples are ``_total``; the client's
    ``_created`` series (a counter's start time) need no panel."""
    return {
        f.name + "_total" if f.type == "counter" else f.name
        for f in families
        if not f.name.endswith("_created")
    }


def lowtide_families(graph: SegmentGraph) -> list[Any]:
    return [f for f in scrape(graph) if f.name.startswith("lowtide_")]


def test_metric_names_follow_prometheus_conventions(graph: SegmentGraph) -> None:
    families = lowtide_families(graph)
    assert len(families) >= 10
    for family in families:
        assert family.documentation, f"{family.name} has no help text"
        assert not NOT_BASE_UNITS.search(family.name), f"{family.name}: use base units"
        assert family.type in ("counter", "gauge"), family.name
        if family.type == "gauge":
            assert not family.name.endswith("_total"), family.name
        for sample in family.samples:
            if family.type == "counter":
                assert sample.name.endswith(("_total", "_created")), sample.name
            assert sample.labels.get("pipeline") == "orders", sample
            if family.name.removeprefix("lowtide_") in PER_SEGMENT:
                assert sample.labels.get("segment"), sample
    segments = {s.labels["segment"] for f in families for s in f.samples if "segment" in s.labels}
    assert segments == {"src", "mid", "sink", "_global"}
    (info,) = (f for f in families if f.name == "lowtide_build_info")
    assert [(s.labels["version"], s.value) for s in info.samples] == [(lowtide.__version__, 1)]


def dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return exprs


def test_dashboard_queries_exist_and_cover_every_metric(graph: SegmentGraph) -> None:
    exported = exported_names(lowtide_families(graph))
    queried = {n for e in dashboard_queries() for n in re.findall(r"\blowtide_[a-z_]+", e)}
    assert queried <= exported, f"the dashboard queries missing metrics: {queried - exported}"
    assert exported <= queried, f"metrics without a panel: {exported - queried}"
