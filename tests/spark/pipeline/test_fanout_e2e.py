"""End to end, fan-out to two sinks: one ingest log read by two queries of one
pipeline on one tracker, each with its own ingest segment the fronts send every record
into (rule 11). Both sinks complete, and their exact windows and rows equal a batch
recomputation of what the fronts logged, under a lagging front (its clock 300 ms
behind) and a task failure injected in each branch after its tracked step."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import lowtide
from lowtide.core.time import TimeGrid
from lowtide.service.clock import wall_ms
from lowtide.spark.sources.ingest import IngestReader
from tests.spark.helpers import fail_once
from tests.spark.operators.helpers import STUCK_MS, read_results

pytestmark = pytest.mark.spark

GRID = TimeGrid(delta_ms=10)
WINDOW_SLOTS = 20  # "200 milliseconds" on GRID
SCHEMA = "front int, offset long, user string, amount long"

try:  # the workers cannot import this test module: ship its functions by value
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
except ImportError:  # pragma: no cover
    pass


def parse(b: pa.RecordBatch) -> pa.RecordBatch:
    offset = b["offset"]
    return pa.record_batch({
        "front": b["front"], "offset": offset,
        "user": pc.cast(pc.bit_wise_and(offset, 3), pa.string()),
        "amount": pc.bit_wise_and(offset, 7)})


def big(b: pa.RecordBatch) -> pa.Array:
    return pc.greater(b["amount"], 4)


class Lagging:
    """A front's clock 300 ms behind the wall: its records arrive late for their time."""

    def now_ms(self) -> int:
        return wall_ms() - 300


def failing_once(marker: Path) -> Any:
    """An untracked step failing the first attempt of the branch's first task with rows
    (Spark runs no Python for an empty partition, and a branch started late may read
    everything in its first batch); ``marker`` says it did."""

    def where(batch_id: int, partition: int) -> bool:
        if marker.exists():
            return False
        marker.touch()
        return True

    failing = fail_once(where)
    return lambda df: df.mapInArrow(failing, df.schema)


def logged(log: Path) -> pd.DataFrame:
    """Every record the fronts logged, with its slot: the batch recomputation's input."""
    parts = []
    for f in (0, 1):
        r = IngestReader(log, f)
        times, _ = r.read(0, r.end_offset())
        offsets = np.arange(len(times))
        parts.append(pd.DataFrame({"front": f, "offset": offsets, "slot": times,
                                   "user": (offsets & 3).astype(str),
                                   "amount": offsets & 7}))
    return pd.concat(parts, ignore_index=True)


def test_one_log_two_sinks_both_exact(spark, tmp_path: Path) -> None:
    log = tmp_path / "log"
    pipe = lowtide.Pipeline(spark, "fanout", grid=GRID, stuck_after_ms=STUCK_MS)
    windows = (pipe.read_log(str(log), name="in_win").map(parse, SCHEMA, name="parse_win")
               .transform(failing_once(tmp_path / "failed_win"), name="fail_win")
               .window("200 milliseconds", key="user", name="win").agg(n="count"))
    rows = (pipe.read_log(str(log), name="in_big").map(parse, SCHEMA, name="parse_big")
            .filter(big, name="big")
            .transform(failing_once(tmp_path / "failed_big"), name="fail_big"))
    queries = []
    try:
        pipe.start_tracker(pipe.plan((windows, "win_out"), (rows, "big_out")).graph)
        # the laggard first: a front registered alone lets its segments' min time run
        lagging = pipe.front(1, fsync="never", heartbeat_ms=10, clock=Lagging())
        fronts = [pipe.front(0, fsync="never", heartbeat_ms=10), lagging]
        assert fronts[0].segments == ("in_win", "in_big")
        for out, stream in (("win_out", windows), ("big_out", rows)):
            queries.append(stream.write_parquet(
                str(tmp_path / out), checkpoint=str(tmp_path / f"ckpt_{out}"), name=out,
                trigger="200 milliseconds"))
        for _ in range(12):
            for f in fronts:
                f.send([b"x"] * 5)
            time.sleep(0.05)
        time.sleep(0.03)  # let the clock pass the last label before the final heartbeat
        last = min(f.close() for f in fronts)
        final = queries[0].wait_for_min_time(last, timeout_s=120)  # the windows' sink
        queries[1].wait_for_min_time(last, timeout_s=120)
        assert not pipe.status().stuck
    finally:
        pipe.close()
    assert (tmp_path / "failed_win").exists() and (tmp_path / "failed_big").exists()
    records = logged(log)
    assert len(records) == 2 * 12 * 5
    expected = records.assign(start=records["slot"] // WINDOW_SLOTS * WINDOW_SLOTS)
    expected = expected.groupby(["user", "start"]).size()
    # every window the sink's min time passed is there; a later one only if complete
    done = expected[expected.index.get_level_values("start") + WINDOW_SLOTS <= final]
    got = read_results(tmp_path / "win_out")
    starts = pd.to_datetime(got["window_start"], utc=True).map(lambda t: t.value // 1_000_000)
    got = got.assign(start=starts // GRID.delta_ms).set_index(["user", "start"])["n"]
    assert not got.index.duplicated().any(), "a window was emitted twice"
    assert set(done.index) <= set(got.index) and len(done) >= 4
    assert got.to_dict() == expected[got.index].to_dict()
    kept = read_results(tmp_path / "big_out")
    want = records[records["amount"] > 4]
    assert sorted(zip(kept["front"], kept["offset"], strict=True)) == sorted(
        zip(want["front"], want["offset"], strict=True))
