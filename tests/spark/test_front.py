"""Front producer + log source logic without Spark, on the core tracker."""

from __future__ import annotations

import time

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import ManualClock, TimeGrid
from lowtide.spark.front import Front
from lowtide.spark.source import FrontPartition, log_offsets, log_partitions, read_log_partition
from lowtide.spark.tracking import AckAccumulator

from .conftest import CoreAgent

GRID = TimeGrid(delta_ms=10)
GRAPH = SegmentGraph.of(("ingest", ()), ("parse", ("ingest",)))


def test_front_labels_acks_logs_and_the_source_completes_it(tmp_path) -> None:
    agent = CoreAgent(GRAPH, GRID)
    clock = ManualClock(1_000)
    front = Front(tmp_path, 4, agent, grid=GRID, clock=clock, fsync="never", heartbeat_ms=None)
    assert front.send([b"a", b"b"]) == 0
    clock.advance(25)
    assert front.send([b"c"]) == 2
    clock.advance(20)
    assert front.heartbeat() == 104
    mins = agent.step()
    assert mins["ingest"] == 100  # records of slots 100 and 102 are in flight

    start: dict[str, int] = {}
    end = log_offsets(str(tmp_path), None, start, max_records=None)
    assert end == {"f4": 3}
    (part,) = log_partitions(start, end)
    batch, times, acks = read_log_partition(str(tmp_path), part)
    assert batch.column("payload").to_pylist() == [b"a", b"b", b"c"]
    assert times.tolist() == [100, 100, 102]
    acc = AckAccumulator()  # what the source task sends: children first, then receipt
    acc.add(GRAPH.index("parse"), times, acks, +1)
    acc.add(GRAPH.index("ingest"), times, acks, -1)
    agent.send_batch(("q", 0, "ingest", 4), acc.build(1))
    mins = agent.step()
    assert mins["ingest"] == 104 and mins["parse"] == 100  # parse waits for its receiver
    front.close()


def test_front_heartbeats_while_idle(tmp_path) -> None:
    agent = CoreAgent(GRAPH, GRID)
    front = Front(tmp_path, 0, agent, grid=GRID, fsync="never", heartbeat_ms=5)
    try:
        first = agent.step()["ingest"]
        time.sleep(0.1)
        assert agent.step()["ingest"] > first
    finally:
        last = front.close()
    assert agent.step()["ingest"] == last


def test_front_resumes_its_log(tmp_path) -> None:
    agent = CoreAgent(GRAPH, GRID)
    clock = ManualClock(5_000)
    with Front(tmp_path, 1, agent, grid=GRID, clock=clock, fsync="never",
               heartbeat_ms=None) as f:
        f.send([b"x"] * 3)
    with Front(tmp_path, 1, agent, grid=GRID, clock=clock, fsync="never",
               heartbeat_ms=None) as f:
        assert f.send([b"y"]) == 3
    part = FrontPartition(1, 0, 4)
    assert read_log_partition(str(tmp_path), part)[0].column("offset").to_pylist() == [0, 1, 2, 3]
