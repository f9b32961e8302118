"""Any Spark source as a tracked entry (``Pipeline.read_stream``): records labelled by
fronts, written as files or Delta commits while the query runs, read by Spark's own
sources; exact windows over them equal a batch recomputation, under an injected task
failure; a DataFrame that cannot be an entry is a one-line error where it is
described."""

from __future__ import annotations

import contextlib
import io
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lowtide
from lowtide.core.acks import root_acks
from lowtide.core.messages import AckBatch
from lowtide.core.time import TimeGrid
from lowtide.spark.sources.read_stream import NotLabelled
from tests.spark.helpers import fail_once

pytestmark = pytest.mark.spark

GRID = TimeGrid(delta_ms=10)
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


def run_entry(spark: Any, tmp: Path, source_df: Any, write: Any) -> tuple[Any, list]:
    """Produce while the query runs, then wait until the sink is complete through the
    fronts' last heartbeat; returns (results, written rows)."""
    pipe = lowtide.Pipeline(spark, "entry", grid=GRID, stuck_after_ms=60_000)
    stream = exact_windows(pipe, source_df)
    assert stream.segment_names() == ["ingest", "win", "win.state", "sink"]
    pipe.start_tracker(stream.graph())
    fronts = LabelFronts(pipe.tracker.agent, "ingest", {0: 0, 1: 30})  # front 1 lags 300 ms
    query = stream.write_parquet(str(tmp / "out"), checkpoint=str(tmp / "ckpt"),
                                 trigger="300 milliseconds")
    try:
        written = produce(fronts, write, rounds=4, every_s=0.3)
        # heartbeat past the window of the last label: every window is then complete
        last_end = (max(int(w["lt_time"].max()) for w in written) // SIZE + 1) * SIZE
        while fronts.heartbeat() < last_end:
            time.sleep(0.05)
        query.wait_for_min_time(last_end, timeout_s=180)
        assert not query.stuck()
    finally:
        query.stop()
        pipe.close()
    return results_of(tmp / "out"), written


def test_file_source_entry_equals_batch(spark, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 3).parquet(str(folder))
    results, written = run_entry(spark, tmp_path, df, parquet_files(folder))
    assert len(written) == 8 and len(results) >= 6
    assert_equal_to_batch(results, written)


def has_delta(spark: Any) -> bool:
    return "DeltaSparkSessionExtension" in spark.conf.get("spark.sql.extensions", "")


NEEDS_DELTA = ("the shared Spark session has no Delta Lake: give tests/conftest.py's session "
               "SessionConfig(delta=True, kafka=True)'s spark.jars and extensions")


def delta_appends(spark: Any, path: Path) -> Any:
    """A writer of one Delta commit per call."""

    def write(rows: pd.DataFrame) -> None:
        spark.createDataFrame(rows, SCHEMA).write.format("delta").mode("append").save(str(path))

    return write


def test_delta_source_entry_equals_batch(spark, tmp_path: Path) -> None:
    if not has_delta(spark):
        pytest.skip(NEEDS_DELTA)
    table = tmp_path / "table"
    spark.createDataFrame([], SCHEMA).write.format("delta").save(str(table))
    df = spark.readStream.format("delta").option("maxFilesPerTrigger", 2).load(str(table))
    results, written = run_entry(spark, tmp_path, df, delta_appends(spark, table))
    assert_equal_to_batch(results, written)


def test_entry_errors_are_one_line_where_described(spark, tmp_path: Path) -> None:
    pipe = lowtide.Pipeline(spark, "errors", grid=GRID)
    batch = spark.createDataFrame([], SCHEMA)
    with pytest.raises(NotLabelled, match="streaming DataFrame"):
        pipe.read_stream(batch)
    stream = spark.readStream.schema("k string, v long").parquet(str(tmp_path))
    with pytest.raises(NotLabelled, match="no column 'lt_time'"):
        pipe.read_stream(stream)
    text = spark.readStream.schema("lt_time string, lt_ack long").parquet(str(tmp_path))
    with pytest.raises(NotLabelled, match="'lt_time' is string"):
        pipe.read_stream(text)
    renamed = spark.readStream.schema("t long, a long, k string").parquet(str(tmp_path))
    assert pipe.read_stream(renamed, time="t", ack="a").segment_names() == ["ingest", "sink"]


def keep_all(b: Any) -> Any:
    return np.ones(b.num_rows, bool)


def test_the_entry_shares_its_task_with_the_tracked_steps_after_it(spark,
                                                                   tmp_path: Path) -> None:
    """The rows cross to Python once: the entry, a map and a filter are one
    ``mapInArrow`` (the tracked Kafka bench paid for a second one before)."""
    pipe = lowtide.Pipeline(spark, "fused", grid=GRID)
    df = spark.readStream.schema("lt_time long, lt_ack long, k string, v long").parquet(
        str(tmp_path))
    stream = pipe.read_stream(df).map(lambda b: b, name="same").filter(keep_all, name="all")
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            pipe.build(stream).df.explain()
    finally:
        pipe.close()
    assert out.getvalue().count("MapInArrow") == 1, out.getvalue()


def test_fronts_listed_with_the_pipeline_are_declared_when_its_tracker_starts(
        spark, tmp_path: Path) -> None:
    """Issue 29 point 1: ``read_stream(df, fronts=[...])`` and ``read_log(path,
    fronts=...)`` declare their producers' fronts before any query runs, so the ingest
    segment waits for one that starts late; ``pipe.status()`` shows them waiting."""
    pipe = lowtide.Pipeline(spark, "declared", grid=GRID)
    df = spark.readStream.schema(SCHEMA).parquet(str(tmp_path))
    with pytest.raises(ValueError, match="at least one front id"):
        pipe.read_stream(df, fronts=[])
    stream = pipe.read_stream(df, fronts=[3, 4], retire_after_ms=600_000)
    try:
        pipe.start_tracker(stream.graph())
        declared = pipe.tracker.status()["fronts_declared"]
        assert declared == {"3": ["ingest", -1, declared["3"][2]], "4": declared["4"]}
        assert declared["3"][2] > 0  # retired by deadline, in tracker time
        status = pipe.status()
        assert set(status.waiting_fronts) == {"3", "4"}
        assert "declared, not registered" in status.render(GRID.delta_ms)
    finally:
        pipe.close()
    logs = lowtide.Pipeline(spark, "declared-log", grid=GRID)
    stream = logs.read_log(str(tmp_path / "log"), fronts="0-1")
    try:
        logs.start_tracker(stream.graph())
        assert set(logs.tracker.status()["fronts_declared"]) == {"0", "1"}
    finally:
        logs.close()
