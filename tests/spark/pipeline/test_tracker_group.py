"""``Pipeline(tracker=[...])``: a group's addresses (rule 18), tried in turn. No Spark:
the pipeline reaches its tracker before any query."""

from __future__ import annotations

import socket

import lowtide
from lowtide.core.graph import SegmentGraph
from lowtide.service import TrackerService

GRAPH = SegmentGraph.of(("src", ()), ("sink", ("src",)))


def test_a_pipeline_takes_a_list_of_trackers_and_finds_the_one_serving() -> None:
    svc = TrackerService.start(GRAPH)
    with socket.socket() as s:  # an address nobody serves: a standby, a dead leader
        s.bind(("127.0.0.1", 0))
        dead = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    pipe = lowtide.Pipeline(None, "group", tracker=[dead, svc.url])
    try:
        handle = pipe.start_tracker(GRAPH)
        assert handle.url == f"{dead},{svc.url}"
        assert handle.status()["global_min"] == 0
    finally:
        pipe.close()
        svc.stop()
