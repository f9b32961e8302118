"""End to end, key ranges from declared fronts (rule 15): four Front producers feed two
key ranges; front 3's clock runs 15 s behind. The ingest segment and the steps after
it are split alike: the other range's windows come out while front 3's range waits, a
task fails once after its acks were sent, and every window equals a batch
recomputation of what the fronts wrote, none emitted twice.

* the ingest log: ``read_log(fronts=...)`` and the window's ``front_ranges=`` (fronts
  0, 1 -> range 0; 2, 3 -> range 1);
* any Spark source (``read_stream``, here Parquet files as a Kafka topic would be
  read, one producer per partition): the rows carry their front in ``front``, fronts
  declared with ``read_stream(fronts=...)``, the default map ``front % 2``;
* a real Kafka topic of four partitions on the suite's broker, one ``Front`` and Kafka
  producer per partition, Spark's Kafka source with ``front`` = the partition."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import lowtide
from lowtide.core.time import TimeGrid
from lowtide.spark.operators.window_state import window_starts
from lowtide.spark.sources.files_producer import FilesProducerConfig
from lowtide.spark.sources.front import Front
from lowtide.spark.sources.ingest import IngestReader
from tests.spark.helpers import fail_once, parse_log_record, published
from tests.spark.sources.helpers import kafka_labelled, needs_kafka_connector

# ~1-1.5 min each under load: `make test-all` runs them; key ranges through steps and
# after a generator are in make test (tests/spark/operators/test_key_ranges_e2e.py)
pytestmark = [pytest.mark.spark, pytest.mark.slow]

GRID = TimeGrid(delta_ms=10)
SIZE = 50  # slots: 500 ms windows
LAG_MS = 15_000
RANGES = {0: 0, 1: 0, 2: 1, 3: 1}


class LaggingClock:
    """Wall time ``lag_ms`` behind, never before its start: the front's records and
    heartbeats trail the others' by ``lag_ms``."""

    def __init__(self, lag_ms: int) -> None:
        self.lag_ms, self.start_ms = lag_ms, time.time_ns() // 1_000_000

    def now_ms(self) -> int:
        return max(self.start_ms, time.time_ns() // 1_000_000 - self.lag_ms)


def produce(fronts: list, stop: threading.Event) -> list[threading.Thread]:  # type: ignore[type-arg]
    def run(front) -> None:  # type: ignore[no-untyped-def]
        i = 0
        while not stop.wait(0.02):
            front.send([f"{front.front}:{i + k}".encode() for k in range(3)])
            i += 3

    threads = [threading.Thread(target=run, args=(f,), daemon=True) for f in fronts]
    for t in threads:
        t.start()
    return threads


def start_slots(starts: pd.Series) -> pd.Series:
    ms = (pd.to_datetime(starts, utc=True) - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(1, "ms")
    return ms.astype("int64") // GRID.delta_ms


def batch_windows(ingest: Path) -> pd.DataFrame:
    parts = []
    for f in RANGES:
        r = IngestReader(ingest, f)
        times, _ = r.read(0, r.end_offset())
        parts.append(pd.DataFrame({"front": f, "slot": np.asarray(times, np.int64)}))
    rows = pd.concat(parts, ignore_index=True)
    starts = window_starts(rows["slot"].to_numpy(), SIZE, SIZE)[:, 0]
    return rows.assign(start=starts).groupby(["front", "start"]).size().rename("n")


def test_log_fronts_feed_key_ranges_by_a_stated_map(spark, tmp_path: Path) -> None:
    ingest, out, ckpt = tmp_path / "ingest", tmp_path / "out", tmp_path / "ckpt"
    pipe = lowtide.Pipeline(spark, "log-ranges", grid=GRID, stuck_after_ms=60_000)
    after = fail_once(lambda b, p: b % 5 == 3)  # after the source's and the map's acks
    stream = (pipe.read_log(str(ingest), fronts=list(RANGES))
              .map(parse_log_record, "front int, offset long, size int", name="parse")
              .transform(lambda df: df.mapInArrow(after, df.schema))
              .window("500 milliseconds", key="front", key_ranges=2, front_ranges=RANGES,
                      name="win")
              .count())
    graph = stream.graph()
    assert [graph.ranges_of(graph.index(s)) for s in ("ingest", "parse", "win")] == [2, 2, 2]
    assert graph.fronts_of(graph.index("ingest")) == {f: {r} for f, r in RANGES.items()}
    stop, threads, fronts = threading.Event(), [], []
    query = None
    try:
        pipe.start_tracker(graph)
        fronts = [pipe.front(f, fsync="never", clock=LaggingClock(LAG_MS) if f == 3 else None)
                  for f in RANGES]
        threads = produce(fronts, stop)
        query = stream.write_parquet(str(out), checkpoint=str(ckpt),
                                     trigger="200 milliseconds")
        ahead, doc = watch(pipe, query, out, lambda d: d["front"] < 2)
        final = finish(stop, threads, fronts, query)
        fronts = []
    finally:
        stop.set()
        for f in fronts:
            f.close()
        if query is not None:
            query.stop()
        pipe.close()
    assert ahead, "no window of range 0 came out before range 1 reached it"
    ranged = {s["segment"]: s["key_ranges"] for s in doc["segments"] if s.get("key_ranges")}
    assert set(ranged) == {"ingest", "parse", "win"}
    assert ranged["win"][0] > ranged["win"][1], "the lagging range is not behind"
    assert_equals_batch(out, "front", batch_windows(ingest), final)


def watch(pipe: lowtide.Pipeline, query: Any, out: Path, fast: Callable[[Any], Any]
          ) -> tuple[list[int], dict[str, Any]]:
    """Once Spark is warm, until range 0 and then the sink pass a time ahead of now:
    the ends of ``fast`` windows written before range 1 reached them, and the
    tracker's status (what `lowtide status`, the metrics and the web view show)."""
    start = GRID.slot_of(time.time_ns() // 1_000_000)
    query.wait_for_min_time(start + 8 * SIZE, timeout_s=240)
    # windows of range 0 ending after now come out once range 0 passes them, while
    # range 1 is still LAG_MS behind
    now = GRID.slot_of(time.time_ns() // 1_000_000)
    query.wait_for_min_time(now + 4 * SIZE, segment="win#0", timeout_s=240)
    query.wait_for_min_time(now + 4 * SIZE, timeout_s=240)
    assert not query.stuck()
    agent = pipe.tracker.agent
    ahead = []
    for f in published(out):
        lagging = agent.min_time_at("win#1", (out / f).stat().st_mtime_ns // 1_000_000)
        got = pq.read_table(out / f).to_pandas()
        ends = start_slots(got[fast(got)]["window_start"]) + SIZE
        ahead += [int(e) for e in ends if e > lagging]
    return ahead, agent.status()


def finish(stop: threading.Event, threads: list[threading.Thread], fronts: list[Front],
           query: Any) -> int:
    """Stop producing, end the fronts, wait for the sink: their last heartbeat."""
    stop.set()
    for t in threads:
        t.join()
    final = min(f.close() for f in fronts)
    query.wait_for_min_time(final, timeout_s=240)
    return final


def assert_equals_batch(out: Path, key: str, expected: pd.Series, final: int) -> None:
    results = pd.concat([pq.read_table(out / f).to_pandas() for f in published(out)])
    results["start"] = start_slots(results["window_start"])
    got = results.set_index([key, "start"])["count"].sort_index()
    assert got.index.is_unique, "a window was emitted twice"
    np.testing.assert_array_equal(got.to_numpy(), expected.loc[got.index].to_numpy())
    done = expected[expected.index.get_level_values("start") + SIZE <= final]
    assert set(done.index) <= set(got.index), "a complete window was not emitted"


def test_read_stream_fronts_feed_key_ranges_by_front_mod_n(spark, tmp_path: Path) -> None:
    files = tmp_path / "in"
    files.mkdir()
    pipe = lowtide.Pipeline(spark, "files-ranges", grid=GRID, stuck_after_ms=60_000)
    df = spark.readStream.schema("front int, seq long, k long, lt_time long, lt_ack long")\
        .parquet(str(files))
    after = fail_once(lambda b, p: b == 3)  # after the entry's acks, in its task
    stream = (pipe.read_stream(df, fronts=list(RANGES))
              .transform(lambda d: d.mapInArrow(after, d.schema))
              .window("500 milliseconds", key="k", key_ranges=2, name="win").count())
    graph = stream.graph()
    assert graph.fronts_of(graph.index("ingest")) == {f: {f % 2} for f in RANGES}

    def produce(stop: threading.Event, written: list[pd.DataFrame]) -> Producing:
        fronts = [Front(None, f, pipe.tracker_ref, clock=LaggingClock(LAG_MS) if f == 3
                        else None) for f in RANGES]
        return fronts, write_files(fronts, FilesProducerConfig(files), stop, written), []

    ranged_run(pipe, stream, tmp_path, lambda d: d["k"] // 10 % 2 == 0, produce)


def write_files(fronts: list[Front], config: FilesProducerConfig, stop: threading.Event,
                written: list[pd.DataFrame]) -> list[threading.Thread]:
    """A file of 20 rows per front every 500 ms (Spark's file source lists the folder
    at every batch: few files); keys ``front * 10 + seq % 2``."""
    lock = threading.Lock()

    def run(front: Front) -> None:
        producer, seq = config.build(front), 0
        while not stop.wait(0.5):
            s = np.arange(seq, seq + 20, dtype=np.int64)
            rows = pd.DataFrame({"front": np.full(20, front.front, np.int32), "seq": s,
                                 "k": front.front * 10 + s % 2})
            labelled = producer.send(rows)
            with lock:
                written.append(rows.assign(lt_time=labelled.times))
            seq += 20

    threads = [threading.Thread(target=run, args=(f,), daemon=True) for f in fronts]
    for t in threads:
        t.start()
    return threads


def test_kafka_partitions_feed_key_ranges(spark, kafka_broker, kafka_topic,
                                          tmp_path: Path) -> None:
    from lowtide.spark.sources.kafka_producer import KafkaProducerConfig

    needs_kafka_connector(spark)
    topic = kafka_topic(len(RANGES))
    pipe = lowtide.Pipeline(spark, "kafka-ranges", grid=GRID, stuck_after_ms=60_000)
    df = kafka_labelled(spark, kafka_broker.bootstrap, topic, extra=("partition",))
    df = df.withColumnRenamed("partition", "front")
    after = fail_once(lambda b, p: b == 3)  # after the entry's acks, in its task
    stream = (pipe.read_stream(df, fronts=list(RANGES))
              .transform(lambda d: d.mapInArrow(after, d.schema))
              .window("500 milliseconds", key="k", key_ranges=2, name="win").count())

    def produce(stop: threading.Event, written: list[pd.DataFrame]) -> Producing:
        fronts = [Front(None, f, pipe.tracker_ref, heartbeat_ms=20,
                        clock=LaggingClock(LAG_MS) if f == 3 else None) for f in RANGES]
        producers = [KafkaProducerConfig(topic, kafka_broker.bootstrap, partition=f.front)
                     .build(f) for f in fronts]
        return fronts, send_keyed(producers, stop, written), producers

    ranged_run(pipe, stream, tmp_path, lambda d: d["k"].str[1].astype(int) % 2 == 0, produce)


Producing = tuple[list[Front], list[threading.Thread], list[Any]]


def ranged_run(pipe: lowtide.Pipeline, stream: Any, tmp_path: Path,
               fast: Callable[[Any], Any],
               produce: Callable[[threading.Event, list[pd.DataFrame]], Producing]) -> None:
    """Start the tracker, the producers (``produce``: their fronts, threads and what
    else to close) and the query; check range 0 comes out first, then every window
    equals the batch recomputation of what was written."""
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    stop, threads, fronts, others = threading.Event(), [], [], []
    written: list[pd.DataFrame] = []
    query = None
    try:
        pipe.start_tracker(stream.graph())
        fronts, threads, others = produce(stop, written)
        query = stream.write_parquet(str(out), checkpoint=str(ckpt),
                                     trigger="300 milliseconds")
        ahead, _ = watch(pipe, query, out, fast)
        final = finish(stop, threads, fronts, query)
        fronts = []
    finally:
        stop.set()
        for closable in (*others, *fronts):
            closable.close()
        if query is not None:
            query.stop()
        pipe.close()
    assert ahead, "no window of range 0 came out before range 1 reached it"
    rows = pd.concat(written, ignore_index=True)
    starts = window_starts(rows["lt_time"].to_numpy(), SIZE, SIZE)[:, 0]
    assert_equals_batch(out, "k", rows.assign(start=starts).groupby(["k", "start"]).size(),
                        final)


def send_keyed(producers: list[Any], stop: threading.Event, written: list[pd.DataFrame]
               ) -> list[threading.Thread]:
    """10 records per partition every 200 ms; keys ``f<front>-<seq % 2>``: each key
    comes from one front, so from one key range."""
    lock = threading.Lock()

    def run(producer: Any) -> None:
        f, seq = producer.front.front, 0
        while not stop.wait(0.2):
            rows = pd.DataFrame({"k": [f"f{f}-{s % 2}" for s in range(seq, seq + 10)],
                                 "v": np.arange(seq, seq + 10, dtype=np.int64)})
            labelled = producer.send(rows)
            with lock:
                written.append(rows.assign(lt_time=labelled.times))
            seq += 10

    threads = [threading.Thread(target=run, args=(p,), daemon=True) for p in producers]
    for t in threads:
        t.start()
    return threads
