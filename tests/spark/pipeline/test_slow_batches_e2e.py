"""End to end (issue 34 point 3): batches four times slower than ``stuck_after_ms`` are
not a loss. Front producers write to the ingest log while every batch of the query
takes 4 s (its map sleeps): the records written meanwhile are past their bound and
not yet received, for up to two batches. The driver tells the tracker which batch
runs, so the tracker says "waiting for query ... batch N", never "missing"; and the
output equals everything logged (nothing was lost)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import lowtide
from lowtide.core.time import TimeGrid
from lowtide.spark.sources.ingest import IngestReader
from tests.spark.helpers import Watcher, published

pytestmark = pytest.mark.spark

GRID = TimeGrid(delta_ms=10)
STUCK_AFTER_MS = 1_000
BATCH_S = 4.0


def slow_parse(b: pa.RecordBatch) -> pa.RecordBatch:
    time.sleep(BATCH_S)
    return pa.record_batch({"front": b["front"], "offset": b["offset"],
                            "size": pc.binary_length(b["payload"])})


class Sampler:
    """Polls the pipeline's status: every stuck line and every waiting line seen."""

    def __init__(self, pipe: Any) -> None:
        self.pipe, self.stuck, self.waiting = pipe, set[str](), set[str]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            status = self.pipe.status()
            self.stuck.update(status.stuck)
            self.waiting.update(status.waiting)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.slow  # ~27 s; slow batches by default: chaos "slow batch" (tests/bench/test_chaos.py)
def test_slow_batches_are_waiting_never_missing(spark: Any, tmp_path: Path) -> None:
    ingest, out, ckpt = tmp_path / "ingest", tmp_path / "out", str(tmp_path / "ckpt")
    pipe = lowtide.Pipeline(spark, "slow", grid=GRID, stuck_after_ms=STUCK_AFTER_MS)
    # one Arrow batch per task, so one sleep per batch
    stream = pipe.read_log(str(ingest), max_records_per_batch=5_000).map(
        slow_parse, "front int, offset long, size int", name="parse")
    fronts = watcher = query = sampler = None
    stop = threading.Event()
    try:
        pipe.start_tracker(stream.graph())
        fronts = [pipe.front(f, fsync="never") for f in (0, 1)]
        threads = [threading.Thread(target=produce, args=(f, stop), daemon=True)
                   for f in fronts]
        for t in threads:
            t.start()
        watcher = Watcher(pipe.tracker.agent, "sink", lambda: published(out)).start()
        query = stream.write_parquet(str(out), checkpoint=ckpt, trigger="100 milliseconds",
                                     keep_tracking_columns=True)
        watcher.wait_for(GRID.slot_of(time.time_ns() // 1_000_000), 180, query.query)
        sampler = Sampler(pipe)
        start = GRID.slot_of(time.time_ns() // 1_000_000)
        watcher.wait_for(start + 1_200, 180, query.query)  # three slow batches or more
        stop.set()
        for t in threads:
            t.join()
        final = min(f.close() for f in fronts)
        fronts = None
        watcher.wait_for(final, 120, query.query)
        sampler.stop()
    finally:
        stop.set()
        if sampler is not None:
            sampler.stop()
        if fronts is not None:
            for f in fronts:
                f.close()
        if query is not None:
            query.stop()
        if watcher is not None:
            watcher.stop()
        pipe.close()
    assert sampler.stuck == set(), "a slow batch was reported as a loss"
    assert any("waiting for query " in w for w in sampler.waiting), sampler.waiting
    logged: set[tuple[int, int]] = set()
    for f in (0, 1):
        r = IngestReader(ingest, f)
        logged.update((f, i) for i in range(r.end_offset()))
    table = pa.concat_tables(pq.read_table(out / n, columns=["front", "offset"])
                             for n in published(out))
    keys = set(zip(table["front"].to_pylist(), table["offset"].to_pylist(), strict=True))
    assert keys == logged and len(keys) == table.num_rows  # nothing lost, nothing twice


def produce(front: Any, stop: threading.Event) -> None:
    i = 0
    while not stop.wait(0.05):
        front.send([f"{front.front}:{i + k}".encode() for k in range(3)])
        i += 3
