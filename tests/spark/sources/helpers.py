"""What the source tests share (and the table sinks' tests): the core-tracker set-up of
``Front.label`` and a consumer's receipt; producers that label their records as the
label contract says and write them as files, Delta commits or Kafka records while a
query runs; exact windows over such an entry, checked against a batch recomputation."""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from lowtide.core.acks import child_acks, root_acks
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import AckBatch
from lowtide.core.time import TimeGrid
from lowtide.service import Agent, BatchKey
from lowtide.spark.sources.labels import KAFKA_HEADER_EXPRS, from_label
from lowtide.spark.tracking import AckAccumulator
from tests.spark.helpers import CoreAgent, fail_once

GRID = TimeGrid(delta_ms=10)

# ------------------------------------------------------- Front.label on the core tracker

GRAPH = SegmentGraph.of(("ingest", ()), ("ingest_b", ()), ("sink", ("ingest", "ingest_b")))
T0 = 1_000_000  # ms: slot 100_000
_keys = itertools.count()


def receive(agent: CoreAgent, segment: str, times: np.ndarray, labels: np.ndarray) -> None:
    """A consumer's receipt: lt_ack XOR-ed into lt_time of its segment, count -1."""
    acc = AckAccumulator()
    acc.add(GRAPH.index(segment), np.asarray(times), from_label(labels), -1)
    agent.send_batch(("consumer", next(_keys), segment, 0), acc.build(GRID.window_slots))


# ------------------------------------------------------- producers feeding a Spark entry

WINDOW_MS = 500
SIZE = WINDOW_MS // GRID.delta_ms
SCHEMA = "front int, seq long, k string, v long, lt_time long, lt_ack long"


class LabelFronts:
    """Fronts of a producer process, as the label contract says: each batch gets
    ``lt_time`` (the front's clock slot, minus its lag) and ``lt_ack`` (root acks of
    (front, seq)); its send-acks go to the tracker before the write, the heartbeat
    only after the write returned."""

    def __init__(self, agent: Any, segment: str, fronts: dict[int, int]) -> None:
        self.agent, self.segment = agent, segment
        self.lag_slots = fronts  # front -> how far behind the clock it labels
        self.next_seq = dict.fromkeys(fronts, 0)
        self.last = {}
        # the laggard first: a front registered alone lets its segment's min time run
        # up to it, and a later front may not register below that
        for f, lag in sorted(fronts.items(), key=lambda kv: -kv[1]):
            self.last[f] = self._slot(lag)
            agent.register_front(f, segment, self.last[f], owner="test-producer")

    def _slot(self, lag: int) -> int:
        return GRID.slot_of(time.time_ns() // 1_000_000) - lag

    def write(self, front: int, n: int, write: Any) -> pd.DataFrame:
        slot = max(self._slot(self.lag_slots[front]), self.last[front])
        seq = np.arange(self.next_seq[front], self.next_seq[front] + n, dtype=np.uint64)
        acks = root_acks(front, seq)
        rows = pd.DataFrame({
            "front": np.full(n, front, np.int32), "seq": seq.astype(np.int64),
            "k": [f"k{int(s) % 3}" for s in seq], "v": (seq % 7).astype(np.int64),
            "lt_time": np.full(n, slot, np.int64), "lt_ack": acks.view(np.int64)})
        index = self.agent.graph.index(self.segment)
        self.agent.add_acks(AckBatch.from_columns(index, [slot], [np.bitwise_xor.reduce(acks)],
                                                  [n]))
        self.agent.flush()
        write(rows)
        self.next_seq[front] += n
        self.last[front] = slot
        return rows

    def heartbeat(self) -> int:
        """Every front promises its current slot; returns the smallest."""
        for f, lag in self.lag_slots.items():
            self.last[f] = max(self.last[f], self._slot(lag))
            self.agent.heartbeat(f, self.last[f])
        self.agent.flush()
        return min(self.last.values())


def produce(fronts: LabelFronts, write: Any, rounds: int, every_s: float) -> list[pd.DataFrame]:
    """``rounds`` writes per front, ``every_s`` apart, heartbeating after each."""
    out = []
    for i in range(rounds):
        for f in fronts.lag_slots:
            out.append(fronts.write(f, 20 + 5 * i, write))
        fronts.heartbeat()
        time.sleep(every_s)
    return out


def parquet_files(folder: Path) -> Any:
    """A writer of one Parquet file per call, renamed into ``folder`` when complete
    (Spark's file source must never see half a file)."""
    count = [0]

    def write(rows: pd.DataFrame) -> None:
        count[0] += 1
        tmp = folder.parent / f".tmp-{count[0]}.parquet"
        pq.write_table(pa.Table.from_pandas(rows, preserve_index=False), tmp)
        os.replace(tmp, folder / f"batch-{count[0]:04d}.parquet")

    return write


def batch_windows(rows: pd.DataFrame) -> pd.DataFrame:
    """The batch recomputation: count and sum of v per (k, window start slot)."""
    start = rows["lt_time"] // SIZE * SIZE
    g = rows.assign(start=start).groupby(["k", "start"])
    return g.agg(n=("v", "size"), total=("v", "sum")).reset_index()


def exact_windows(pipe: Any, df: Any, name: str = "ingest") -> Any:
    failing = fail_once(lambda b, p: b == 2)  # the entry's batch is applied, then it fails
    return (pipe.read_stream(df, name=name)
            .transform(lambda d: d.mapInArrow(failing, d.schema))
            .window(f"{WINDOW_MS} milliseconds", key="k", name="win")
            .agg(n="count", total=("v", "sum")))


def results_of(out: Path) -> pd.DataFrame:
    files = sorted(out.glob("*.parquet"))
    res = pa.concat_tables([pq.read_table(f) for f in files]).to_pandas()
    ms = pd.to_datetime(res["window_start"], utc=True).map(lambda t: t.value // 1_000_000)
    return res.assign(start=ms // GRID.delta_ms)


def assert_equal_to_batch(results: pd.DataFrame, written: list[pd.DataFrame]) -> None:
    expected = batch_windows(pd.concat(written, ignore_index=True))
    keys = list(zip(results["k"], results["start"], strict=True))
    assert len(keys) == len(set(keys)), "a window was emitted twice"
    got = results.set_index(["k", "start"]).sort_index()[["n", "total"]]
    exp = expected.set_index(["k", "start"]).sort_index()[["n", "total"]]
    pd.testing.assert_frame_equal(got.astype(np.int64), exp.astype(np.int64))


def has_delta(spark: Any) -> bool:
    return "DeltaSparkSessionExtension" in spark.conf.get("spark.sql.extensions", "")

NEEDS_DELTA = ("the shared Spark session has no Delta Lake: give tests/conftest.py's session "
               "SessionConfig(delta=True, kafka=True)'s spark.jars and extensions")


def kafka_labelled(spark: Any, bootstrap: str, topic: str, extra: tuple[str, ...] = (),
                   front: bool = False) -> Any:
    """The topic's records: the JSON fields, ``extra`` Kafka columns (e.g. ``offset``),
    and the labels from the headers (``front``: and ``lt_front``)."""
    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", topic).option("startingOffsets", "earliest")
           .option("includeHeaders", "true").load())
    labels = [f"{expr} AS {name}" for name, expr in KAFKA_HEADER_EXPRS.items()]
    return (raw.selectExpr("from_json(CAST(value AS STRING), 'k string, v long') AS r",
                           *extra, *labels)
            .selectExpr("r.k AS k", "r.v AS v", *extra, "lt_time", "lt_ack",
                        *(["lt_front"] if front else [])))


def kafka_fronts(pipe: Any, bootstrap: str, topic: str, partitions: int,
                 segment: Any = "ingest") -> tuple[list[Any], list[Any]]:
    """A front (heartbeating every 20 ms) and a Kafka producer for each partition."""
    from lowtide.spark.sources.front import Front
    from lowtide.spark.sources.kafka_producer import KafkaProducerConfig

    fronts = [Front(None, i, pipe.tracker_ref, segment=segment, heartbeat_ms=20)
              for i in range(partitions)]
    producers = [KafkaProducerConfig(topic, bootstrap, partition=i).build(f)
                 for i, f in enumerate(fronts)]
    return fronts, producers


def needs_kafka_connector(spark: Any) -> None:
    if "spark-sql-kafka" not in spark.conf.get("spark.jars", ""):
        import pytest

        pytest.skip("the shared Spark session has no Kafka connector: run `make setup`")


def producing(producer: Any, rounds: int, every_s: float, out: list) -> threading.Thread:
    def run() -> None:
        for i in range(rounds):
            rows = pd.DataFrame({"k": [f"k{j % 3}" for j in range(i, i + 12)],
                                 "v": list(range(i, i + 12))})
            out.append(producer.send(rows).records)
            time.sleep(every_s)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def close_all(pipe: Any, queries: list[Any], producers: list[Any], fronts: list[Any]) -> None:
    """Stop the queries, then the producers and their fronts, then the pipeline."""
    for query in queries:
        query.stop()
    for closable in (*producers, *fronts):
        closable.close()
    pipe.close()


# a producer's records consumed by hand, keyed batches numbered across the tests
_BATCHES = itertools.count()


def consume(agent: Agent, times: np.ndarray, acks: np.ndarray) -> None:
    """Receive the records out of src and their children out of sink (keyed, rule 6):
    raises AckBehindHead if a min time had passed them."""
    child = child_acks(acks, operator=1, child_index=np.zeros(len(acks), np.uint64))
    first = AckBatch.concat([AckBatch.from_columns(1, times, child, 1),
                             AckBatch.from_columns(0, times, acks, -1)])
    batch = next(_BATCHES)
    agent.send_batch(BatchKey("consumer", batch, "src", 0), first)
    agent.send_batch(BatchKey("consumer", batch, "sink", 0),
                     AckBatch.from_columns(1, times, child, -1))


def segment(svc: Any, name: str) -> dict[str, Any]:
    """A tracker service's status of one segment."""
    return next(s for s in svc.status()["segments"] if s["segment"] == name)


def wait_for(check: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def stop_producer(producer: Any, successor: Any, agent: Any, ref: Any) -> None:
    """Kill a producer process (by its pid) if it still runs, close its successor
    front, the agent and the ref's cached agent."""
    from lowtide.spark.tracking.transport import connect

    if producer.poll() is None:
        producer.kill()
        producer.wait()
    if successor is not None:
        successor.close()
    agent.close()
    connect(ref).close()


def wait_for_min(agent: Agent, segment: int, above: int, timeout_s: float = 20) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = int(agent.status()["segments"][segment]["min_time"])
        if got > above:
            return got
        time.sleep(0.05)
    raise AssertionError(f"segment {segment} stayed at or below {above}")
