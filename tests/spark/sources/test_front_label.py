"""``Front.label`` for a producer that writes elsewhere, on the core tracker: labels on
every kind of batch, acks before the hand-back, heartbeats only past written batches,
fan-out to several consumers, and the faults (killed between label and write)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from lowtide.core.acks import root_acks
from lowtide.core.time import ManualClock
from lowtide.spark.sources.front import CONSUMER_STRIDE, Front, Labelled
from lowtide.spark.sources.labels import from_label
from tests.spark.helpers import CoreAgent
from tests.spark.sources.helpers import GRAPH, GRID, T0, receive


def make_front(agent: CoreAgent, clock: ManualClock, **kw) -> Front:
    return Front(None, 2, agent, grid=GRID, clock=clock, heartbeat_ms=None, **kw)


@pytest.mark.parametrize("records", [
    [b"a", b"b", b"c"],
    pa.table({"v": [1, 2, 3]}),
    pa.record_batch({"v": [1, 2, 3]}),
    pd.DataFrame({"v": [1, 2, 3]}),
], ids=["bytes", "table", "record_batch", "pandas"])
def test_labels_then_receipts_complete_the_ingest_segment_exactly(records) -> None:
    agent, clock = CoreAgent(GRAPH, GRID), ManualClock(T0)
    front = make_front(agent, clock)
    batch = front.label(records)
    assert batch.times.tolist() == [100_000] * 3
    assert from_label(batch.acks).tolist() == root_acks(2, np.arange(
        batch.first_seq, batch.first_seq + 3, dtype=np.uint64)).tolist()
    if not isinstance(records, list):  # tables carry the labels as columns
        cols = batch.records.to_pydict() if hasattr(batch.records, "to_pydict") else {
            c: batch.records[c].tolist() for c in batch.records.columns}
        assert cols["lt_time"] == batch.times.tolist()
        assert cols["lt_ack"] == batch.acks.tolist()
    front.written(batch)
    clock.advance(50)
    assert front.heartbeat() == 100_005
    assert agent.step()["ingest"] == 100_000  # sent, not yet received
    receive(agent, "ingest", batch.times[:2], batch.acks[:2])
    assert agent.step()["ingest"] == 100_000  # one record still in flight
    receive(agent, "ingest", batch.times[2:], batch.acks[2:])
    assert agent.step()["ingest"] == 100_005


def test_heartbeats_never_pass_a_batch_not_yet_written() -> None:
    agent, clock = CoreAgent(GRAPH, GRID), ManualClock(T0)
    front = make_front(agent, clock)
    first = front.label([b"x"])
    clock.advance(30)
    second = front.label([b"y"])
    clock.advance(30)
    assert front.heartbeat() == 100_000
    front.written(second)
    assert front.heartbeat() == 100_000  # the first batch is still unwritten
    front.written(first)
    assert front.heartbeat() == 100_006
    assert front.status()["in_flight"] == 0 and front.status()["written"] == 2


def test_a_producer_killed_between_label_and_write_stops_its_segment() -> None:
    """Acked, never written, never received: the front's last promise stays below the
    records and the segment never passes them (the tracker reports them missing)."""
    agent, clock = CoreAgent(GRAPH, GRID), ManualClock(T0)
    front = make_front(agent, clock)
    lost = front.label([b"x", b"y"])
    clock.advance(100)
    assert front.close() == 100_000  # the process dies; nothing more is written
    agent.tracker.step(0)
    assert agent.tracker.min_time("ingest") == 100_000
    assert len(lost) == 2


def test_a_front_feeds_every_consumer_segment_and_neither_stalls_the_other() -> None:
    agent, clock = CoreAgent(GRAPH, GRID), ManualClock(T0)
    front = make_front(agent, clock, segment=("ingest", "ingest_b"))
    assert front.front_ids() == [2, 2 + CONSUMER_STRIDE]
    batch = front.label([b"a", b"b"])
    front.written(batch)
    clock.advance(20)
    front.heartbeat()
    receive(agent, "ingest", batch.times, batch.acks)  # consumer A is done
    mins = agent.step()
    assert mins["ingest"] == 100_002 and mins["ingest_b"] == 100_000  # B has not read yet
    receive(agent, "ingest_b", batch.times, batch.acks)
    assert agent.step()["ingest_b"] == 100_002  # each copy once: no duplicates reported


def test_a_front_without_a_log_numbers_records_from_its_start_time() -> None:
    """A restarted producer never reuses its previous run's ack values."""
    agent = CoreAgent(GRAPH, GRID)
    a = make_front(agent, ManualClock(T0)).label([b"x"])
    b = make_front(agent, ManualClock(T0 + 1)).label([b"x"])
    assert isinstance(a, Labelled) and a.first_seq != b.first_seq
    assert a.acks[0] != b.acks[0]


def test_label_refuses_what_it_cannot_label(tmp_path) -> None:
    agent, clock = CoreAgent(GRAPH, GRID), ManualClock(T0)
    with pytest.raises(TypeError, match="list of bytes"):
        make_front(agent, clock).label({"v": 1})
    with make_front(agent, clock) as f, pytest.raises(ValueError, match="send"):
        Front(tmp_path, 3, agent, grid=GRID, heartbeat_ms=None).label([b"x"])
    with pytest.raises(ValueError, match="log_dir=None"):
        Front(tmp_path, 4, agent, grid=GRID, heartbeat_ms=None, time_from="ts")
    assert f.status()["labelled"] == 0


NO_PYSPARK = """
import sys
sys.modules["pyspark"] = None  # an import of pyspark now fails
import lowtide
lowtide.Front
from lowtide.spark.sources import kafka_producer, files_producer, labels
assert not any(m.startswith("pyspark") for m in sys.modules if sys.modules[m] is not None)
print("ok")
"""


def test_a_producer_process_needs_no_pyspark() -> None:
    out = subprocess.run([sys.executable, "-c", NO_PYSPARK], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
