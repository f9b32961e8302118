"""A query attached to a Kafka topic while its producers run (rule 16, issue 34 point 5),
against a real tracker service and no Spark or broker: the topic is the labelled Arrow
batches the producers' fronts hand back (``lt_front`` as the header carries it). Each
running front joins the new query through the ``joins_dir`` it shares with it (no
restart) and answers its join time; the query's entry keeps each front's records from
there on and none of a front that has not joined, so the fronts' acks and the query's
receipts are the same records (rule 5) and its segment completes; a retried task keeps
the same rows; a producer killed while the query attaches: its successor joins or
resumes it, and the new segment never passes a record it did not receive."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.feather as feather
import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.service import Agent
from lowtide.spark.sources.front import Front
from lowtide.spark.sources.joins import release_join, request_join, start_times
from lowtide.spark.sources.read_stream import Labels
from lowtide.spark.tracking import AckAccumulator
from lowtide.spark.tracking.transport import TrackerRef, connect
from tests.spark.sources.helpers import segment, stop_producer, wait_for

pytestmark = pytest.mark.socket
GRID = TimeGrid(delta_ms=10)
GRAPH = SegmentGraph.of(("in_a", ()), ("sink_a", ("in_a",)))
LATE = [("in_b", ()), ("sink_b", ("in_b",))]


def now_slot() -> int:
    return GRID.slot_of(time.time_ns() // 1_000_000)


def produced(front: Front, n: int) -> pa.RecordBatch:
    """What the Kafka producer writes for ``n`` records, as Spark reads it back."""
    batch = front.label(pd.DataFrame({"v": np.arange(n, dtype=np.int64)}))
    front.written(batch)
    rows = pa.Table.from_pandas(batch.records, preserve_index=False)
    rows = rows.append_column("lt_front", pa.array([front.front] * n, pa.int64()))
    return rows.to_batches()[0]


def read_into(agent: Agent, joins_dir: Path, topic: list[pa.RecordBatch]) -> pa.RecordBatch:
    """The new query's entry over the whole topic: receipts out of ``in_b``."""
    rows = pa.Table.from_batches(topic).combine_chunks().to_batches()[0]
    acc = AckAccumulator()
    out = Labels("lt_time", "lt_ack", "in_b", str(joins_dir))(
        rows, acc, agent.graph.index("in_b"), agent.graph.index("sink_b"), now_slot())
    agent.add_acks(acc.build(GRID.window_slots))
    agent.flush()
    return out


def test_running_kafka_fronts_join_a_query_attached_to_their_topic(tmp_path: Path) -> None:
    from lowtide.service import TrackerService

    joins = tmp_path / "joins"
    with TrackerService.start(GRAPH, grid=GRID) as svc:
        ref = TrackerRef(svc.url, GRAPH, GRID)
        agent = Agent.connect(svc.url, GRAPH)
        fronts = [Front(None, f, ref, segment="in_a", joins_dir=joins, heartbeat_ms=None)
                  for f in (0, 1)]
        try:
            topic = [produced(f, 3) for f in fronts]     # before the query: not for it
            agent.change_graph(attach=LATE)              # the tracker attaches it ...
            request_join(joins, "in_b", consumer="in_b")  # ... and it asks to be fed
            assert start_times(joins, "in_b", [0, 1]) == {0: None, 1: None}
            assert read_into(agent, joins, topic).num_rows == 0   # none of theirs yet
            time.sleep(0.03)
            fronts[0].heartbeat()                        # front 0 joins between batches
            assert fronts[0].segments == ("in_a", "in_b")
            topic += [produced(f, 4) for f in fronts]    # front 1's: still not for it
            time.sleep(0.03)
            fronts[1].heartbeat()
            topic += [produced(f, 5) for f in fronts]
            joined = start_times(joins, "in_b", [0, 1])
            assert all(t is not None and t > 0 for t in joined.values())
            time.sleep(0.05)
            beats = [f.heartbeat() for f in fronts]
            wait_for(lambda: segment(svc, "in_b")["bound"] >= min(beats))
            assert segment(svc, "in_b")["in_flight"] == 4 + 5 + 5
            got = read_into(agent, joins, topic)
            assert got.num_rows == 4 + 5 + 5             # front 0 from its 2nd, 1 its 3rd batch
            assert "lt_front" not in got.schema.names
            # a retried task decides the same rows (its key is applied once: rule 6)
            again = Labels("lt_time", "lt_ack", "in_b", str(joins))(
                pa.Table.from_batches(topic).combine_chunks().to_batches()[0],
                AckAccumulator(), 2, 3, now_slot())
            assert again.num_rows == got.num_rows
            time.sleep(0.05)
            [f.heartbeat() for f in fronts]
            last = max(int(b.column(b.schema.names.index("lt_time"))[0].as_py()) for b in topic)
            wait_for(lambda: segment(svc, "in_b")["min_time"] > last)
            assert segment(svc, "in_b")["in_flight"] == 0 and not svc.status()["stuck"]
            release_join(joins, "in_b")                  # detached: the fronts leave it
            wait_for(lambda: all(f.heartbeat() >= 0 and f.segments == ("in_a",)
                                 for f in fronts))
        finally:
            for f in fronts:
                f.close()
            agent.close()
            connect(ref).close()


PRODUCER = """
import sys, time
import pandas as pd, pyarrow as pa, pyarrow.feather as feather
from lowtide.spark.sources.front import Front
from lowtide.spark.tracking.transport import TrackerRef
front = Front(None, 0, TrackerRef.from_option(sys.argv[1]), segment="in_a",
              joins_dir=sys.argv[2], owner="producer-0", heartbeat_ms=5)
for i in range(10_000):      # one record every few ms into the 'topic', until killed
    batch = front.label(pd.DataFrame({"v": [i]}))
    rows = pa.Table.from_pandas(batch.records, preserve_index=False)
    rows = rows.append_column("lt_front", pa.array([0], pa.int64()))
    feather.write_feather(rows, f"{sys.argv[3]}/.{i}.tmp")
    __import__("os").replace(f"{sys.argv[3]}/.{i}.tmp", f"{sys.argv[3]}/{i:06d}.arrow")
    front.written(batch)
    if i == 2:
        print("sent", flush=True)
    time.sleep(0.003)
"""


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_kafka_producer_killed_while_a_query_attaches_is_never_premature(
        tmp_path: Path, seed: int) -> None:
    from lowtide.service import TrackerService

    joins, topic = tmp_path / "joins", tmp_path / "topic"
    topic.mkdir()
    with TrackerService.start(GRAPH, grid=GRID) as svc:
        ref = TrackerRef(svc.url, GRAPH, GRID)
        agent = Agent.connect(svc.url, GRAPH)
        producer = subprocess.Popen(
            [sys.executable, "-c", PRODUCER, ref.to_option(), str(joins), str(topic)],
            stdout=subprocess.PIPE, text=True)
        successor = None
        try:
            assert producer.stdout is not None and producer.stdout.readline() == "sent\n"
            agent.change_graph(attach=LATE)
            request_join(joins, "in_b", consumer="in_b")
            time.sleep(random.Random(seed).uniform(0.0, 0.4))  # before, during or after its join
            producer.kill()
            producer.wait()
            successor = Front(None, 0, ref, segment="in_a", joins_dir=joins,
                              owner="producer-0", heartbeat_ms=5)
            wait_for(lambda: "in_b" in successor.segments)
            (start,) = start_times(joins, "in_b", [0]).values()
            assert start is not None
            records = [produced(successor, 4) for _ in range(3)]
            time.sleep(0.1)
            written = [feather.read_table(p).to_batches()[0] for p in sorted(topic.glob("*.arrow"))]
            everything = [*written, *records]
            times = np.concatenate([b.column(b.schema.names.index("lt_time")).to_numpy()
                                    for b in everything])
            kept = int((times >= start).sum())
            held = segment(svc, "in_b")
            # what the query will keep, and the record the kill caught between its label
            # and its write, if any (acked, never written: missing, fail closed)
            lost = held["in_flight"] - kept
            assert lost in (0, 1)
            assert held["min_time"] <= times[times >= start].min()  # never past one of them
            got = read_into(agent, joins, everything)
            assert got.num_rows == kept >= 12
            if lost:
                time.sleep(0.3)
                after = segment(svc, "in_b")
                assert after["in_flight"] == 1
                assert after["min_time"] <= int(times[times >= start].max())
            else:
                wait_for(lambda: segment(svc, "in_b")["in_flight"] == 0
                         and segment(svc, "in_b")["min_time"] > start)
                assert not svc.status()["stuck"]
        finally:
            stop_producer(producer, successor, agent, ref)
