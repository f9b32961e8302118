"""Front producer + log source logic without Spark, on the core tracker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import ManualClock, TimeGrid
from lowtide.spark.sources.front import Front
from lowtide.spark.sources.log_source import (
    FrontPartition,
    LogStreamReader,
    log_offsets,
    log_partitions,
    read_log_partition,
)
from lowtide.spark.tracking import TRACK_COL, AckAccumulator
from lowtide.spark.tracking.transport import TrackerRef
from tests.spark.helpers import CoreAgent

GRID = TimeGrid(delta_ms=10)
GRAPH = SegmentGraph.of(("ingest", ()), ("parse", ("ingest",)))


@pytest.fixture
def memory_ref(monkeypatch: pytest.MonkeyPatch):
    """The log source's task outside Spark: ``memory://`` is a CoreAgent, the task is
    batch 0's."""
    from lowtide.spark.sources import log_source as source
    from lowtide.spark.tracking import transport

    agent = CoreAgent(GRAPH, GRID)
    transport.register_scheme("memory", lambda ref: agent)
    monkeypatch.setattr(source, "task_identity", lambda: transport.TaskIdentity("q", 0, 0, 0))
    yield TrackerRef("memory://front", GRAPH, GRID), agent
    transport.register_scheme("memory", None)


def _log_reader(ref: TrackerRef, path: Path) -> LogStreamReader:
    return LogStreamReader({"path": str(path), "lowtide.tracker": ref.to_option(),
                            "lowtide.segment": "ingest", "lowtide.out": "parse"})


def test_front_labels_acks_logs_and_the_source_completes_it(tmp_path, memory_ref) -> None:
    ref, agent = memory_ref
    t0 = time.time_ns() // 10_000_000 * 10  # now, on a slot boundary
    s0 = GRID.slot_of(t0)
    clock = ManualClock(t0)
    front = Front(tmp_path, 4, agent, grid=GRID, clock=clock, fsync="never", heartbeat_ms=None)
    agent.step()  # the tracker's tables move up to the front's (wall-clock) slot
    assert front.send([b"a", b"b"]) == 0
    clock.advance(25)
    assert front.send([b"c"]) == 2
    clock.advance(20)
    assert front.heartbeat() == s0 + 4
    mins = agent.step()
    assert mins["ingest"] == s0  # records of slots s0 and s0 + 2 are in flight

    start: dict[str, int] = {}
    end = log_offsets(str(tmp_path), None, start, max_records=None)
    assert end == {"f4": 3}
    (part,) = log_partitions(start, end)
    batch, times, _acks = read_log_partition(str(tmp_path), part)
    assert batch.column("payload").to_pylist() == [b"a", b"b", b"c"]
    assert times.tolist() == [s0, s0, s0 + 2]
    task = _log_reader(ref, tmp_path).read(part)  # receives from ingest, sends to parse
    out = next(task)
    assert [k.segment for k, _a, _h in agent.batches] == ["ingest"]  # sent before the rows
    assert next(task, None) is None
    mins = agent.step()
    assert mins["ingest"] == s0 + 4 and mins["parse"] == s0  # parse waits for its receiver
    acc = AckAccumulator()  # parse receives what the source sent, by its tracking column
    acc.add_packed(GRAPH.index("parse"), out.column(TRACK_COL).to_numpy(), s0, -1)
    agent.send_batch(("q", 0, "parse", 0), acc.build(1))
    assert agent.step()["parse"] == s0 + 4
    front.close()


def test_the_log_source_refuses_records_labelled_far_from_its_clock(tmp_path, memory_ref) -> None:
    """A front with a clock of its own (here: 1970) cannot feed Spark: its slots would not
    unwrap from the tracking column; the task fails instead of acking wrong slots."""
    ref, agent = memory_ref
    with Front(tmp_path, 0, agent, grid=GRID, clock=ManualClock(1_000), fsync="never",
               heartbeat_ms=None) as front:
        front.send([b"x"])
    (part,) = log_partitions({}, log_offsets(str(tmp_path), None, {}, max_records=None))
    with pytest.raises(ValueError, match="label rows with the wall clock"):
        next(iter(_log_reader(ref, tmp_path).read(part)))


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
    f = Front(tmp_path, 1, agent, grid=GRID, clock=clock, fsync="never", heartbeat_ms=None)
    f.send([b"x"] * 3)
    f.close(end=False)  # a pause: a successor resumes the front
    with Front(tmp_path, 1, agent, grid=GRID, clock=clock, fsync="never",
               heartbeat_ms=None) as f:
        assert f.send([b"y"]) == 3
    part = FrontPartition(1, 0, 4)
    assert read_log_partition(str(tmp_path), part)[0].column("offset").to_pylist() == [0, 1, 2, 3]
