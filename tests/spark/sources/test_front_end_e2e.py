"""Issue 33 point 9 end to end: a finished input completes every window.

Two clock fronts (one 300 ms behind) send into an ingest log while a sliding-window
count runs; then every front closes with ``unregister=True``, the issue's case. Before,
their last heartbeat was the slot of their last records, so the windows holding the
newest records were never emitted and nothing reported them. Now the input ends: the
sink reaches the end and the output is every window of a batch recomputation over all
the records the fronts logged, the last ones included, each once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import lowtide
from lowtide.core.time import TimeGrid
from lowtide.spark.sources.ingest import IngestReader
from tests.spark.operators.helpers import read_results, start_slots

pytestmark = pytest.mark.spark

GRID = TimeGrid(delta_ms=10)
SIZE, SLIDE = 40, 20  # slots: windows of 400 ms sliding by 200 ms


class Behind:
    """A clock ``lag_ms`` behind the wall clock."""

    def __init__(self, lag_ms: int) -> None:
        self.lag_ms = lag_ms

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 - self.lag_ms


def parse(b: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch({"front": b["front"], "offset": b["offset"]})


def send(front: Any, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        front.send([b"x", b"y"])
        time.sleep(0.03)


def logged(ingest: Path) -> pd.DataFrame:
    parts = []
    for f in (0, 1):
        reader = IngestReader(ingest, f)
        times, _ = reader.read(0, reader.end_offset())
        parts.append(pd.DataFrame({"front": f, "slot": np.asarray(times, np.int64)}))
    return pd.concat(parts, ignore_index=True)


def batch_windows(rows: pd.DataFrame) -> dict[tuple[int, int], int]:
    """(front, window start slot) -> records, over every record."""
    out: dict[tuple[int, int], int] = {}
    for k in range(SIZE // SLIDE):
        starts = rows["slot"] // SLIDE * SLIDE - k * SLIDE
        for (f, s), n in rows.assign(start=starts).groupby(["front", "start"]).size().items():
            out[(int(f), int(s))] = out.get((int(f), int(s)), 0) + int(n)
    return out


def test_every_front_closing_completes_every_window(spark, tmp_path: Path) -> None:
    ingest = tmp_path / "ingest"
    pipe = lowtide.Pipeline(spark, "ending", grid=GRID)
    stream = (pipe.read_log(str(ingest)).map(parse, "front int, offset long", name="parse")
              .window(SIZE * GRID.delta_ms, slide=SLIDE * GRID.delta_ms, key="front")
              .agg(n="count"))
    query = None
    try:
        pipe.start_tracker(stream.graph())
        late = pipe.front(1, fsync="never", clock=Behind(300))  # first: it holds the log
        fronts = [pipe.front(0, fsync="never"), late]
        query = stream.write_parquet(str(tmp_path / "out"), checkpoint=str(tmp_path / "ckpt"),
                                     trigger="200 milliseconds")
        threads = [threading.Thread(target=send, args=(f, 2.0)) for f in fronts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        last = min(f.close(unregister=True) for f in fronts)  # the input's end
        assert GRID.at_end(last)
        query.wait_for_min_time(last, timeout_s=120)
        assert not query.stuck() and not pipe.status().open_ends
    finally:
        if query is not None:
            query.stop()
        pipe.close()
    results = read_results(tmp_path / "out")
    got = list(zip(results["front"].astype(int), start_slots(results).astype(int),
                   strict=True))
    assert len(got) == len(set(got)), "a window written twice"
    expected = batch_windows(logged(ingest))
    assert dict(zip(got, results["n"].astype(int), strict=True)) == expected
    newest = int(logged(ingest)["slot"].max())
    assert any(s <= newest < s + SIZE for _f, s in got)  # the windows of the last records
