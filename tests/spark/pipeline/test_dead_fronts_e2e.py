"""End to end (issue 34 point 2): three Front producers feed the ingest log; one of
them stops for good without unregistering (its producer died). With
``dead_fronts="retire"`` the tracker retires it after ``front_timeout``: the sink's min
time goes on with the two others, and what the sink published equals a batch
recomputation over everything the three fronts logged (the dead front's rows
included): nothing lost, nothing twice, and no min time ahead of the published
files (never premature)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lowtide
from lowtide.core.time import TimeGrid
from lowtide.spark.sources.ingest import IngestReader
from tests.spark.helpers import Watcher, premature, published
from tests.spark.helpers import parse_log_record as parse

pytestmark = pytest.mark.spark

GRID = TimeGrid(delta_ms=10)
FRONTS = (0, 1, 2)
DEAD = 2


class Producers:
    """Fronts sending a few records every 20 ms, each from its own thread."""

    def __init__(self, fronts: list[Any]) -> None:
        self.fronts = {f.front: f for f in fronts}
        self._stops = {f: threading.Event() for f in self.fronts}
        self._threads = {f: threading.Thread(target=self._run, args=(f,), daemon=True)
                         for f in self.fronts}
        for t in self._threads.values():
            t.start()

    def _run(self, f: int) -> None:
        i = 0
        while not self._stops[f].wait(0.02):
            self.fronts[f].send([f"{f}:{i + k}".encode() for k in range(3)])
            i += 3

    def end(self, f: int) -> int:
        """Stop ``f`` sending and heartbeating, without unregistering it (as a producer
        that died); returns its last heartbeat."""
        self.silence(f)
        time.sleep(0.03)  # the clock passes its last label before the last heartbeat
        return int(self.fronts[f].close(end=False))  # a pause: ending would promise all

    def silence(self, *fronts: int) -> None:
        for f in fronts:
            self._stops[f].set()
        for f in fronts:
            self._threads[f].join()


def logged_times(ingest: Path) -> dict[tuple[int, int], int]:
    out: dict[tuple[int, int], int] = {}
    for f in FRONTS:
        r = IngestReader(ingest, f)
        times, _ = r.read(0, r.end_offset())
        out.update({(f, i): int(t) for i, t in enumerate(times.tolist())})
    return out


def test_retire_lets_the_others_complete_equal_to_a_batch_recomputation(
    spark: Any, tmp_path: Path
) -> None:
    ingest, out, ckpt = tmp_path / "ingest", tmp_path / "out", str(tmp_path / "ckpt")
    pipe = lowtide.Pipeline(spark, "dead-front", grid=GRID, front_timeout="5 seconds",
                            dead_fronts="retire")
    stream = pipe.read_log(str(ingest)).map(parse, "front int, offset long, size int",
                                             name="parse")
    producers = watcher = query = None
    try:
        pipe.start_tracker(stream.graph())
        producers = Producers([pipe.front(f, fsync="never") for f in FRONTS])
        watcher = Watcher(pipe.tracker.agent, "sink", lambda: published(out)).start()
        query = stream.write_parquet(str(out), checkpoint=ckpt, trigger="100 milliseconds",
                                     keep_tracking_columns=True)
        watcher.wait_for(GRID.slot_of(time.time_ns() // 1_000_000), 90, query.query)
        dead_at = producers.end(DEAD)  # it dies; the others go on
        watcher.wait_for(dead_at + 700, 120, query.query)  # 7 s past it: only if retired
        status = pipe.status()
        assert any(e.startswith(f"front {DEAD} retired at ") for e in status.front_events)
        assert str(DEAD) not in status.fronts
        live = [f for f in FRONTS if f != DEAD]
        # every live front stops sending before any pauses: a front still sending
        # labels rows past the first pause, which the min time then never passes
        producers.silence(*live)
        final = min(producers.end(f) for f in live)
        producers = None
        watcher.wait_for(final, 60, query.query)
        assert not pipe.status().stuck
    finally:
        if producers is not None:
            for f in FRONTS:
                producers.end(f)
        if query is not None:
            query.stop()
        if watcher is not None:
            watcher.stop()
        pipe.close()
    logged = logged_times(ingest)
    files = {n: pq.read_table(out / n, columns=["front", "offset"]) for n in published(out)}
    table = pa.concat_tables(files.values())
    keys = list(zip(table["front"].to_pylist(), table["offset"].to_pylist(), strict=True))
    assert len(keys) == len(set(keys)), "duplicates"
    assert set(keys) == set(logged), "the output is not the batch recomputation"
    assert any(f == DEAD for f, _o in keys)
    # NEVER PREMATURE: no min time ahead of the published files
    assert not premature(watcher.seen, files, logged)
