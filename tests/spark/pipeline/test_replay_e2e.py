"""Replay by time, end to end: a step loses rows once, the sink's window is reported
stuck with the log offsets to replay, one call replays them, and the output then holds
every logged record exactly once (a batch recomputation); a replay of a time range into
a fresh output equals the recomputation of that range."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import lowtide
from lowtide.bench.chaos.replay_fault import drop_once, send_rounds
from lowtide.core.time import TimeGrid
from lowtide.spark.pipeline.replay import ReplayRefused
from lowtide.spark.sources.ingest import IngestReader

pytestmark = pytest.mark.spark

GRID = TimeGrid(delta_ms=10)
SCHEMA = "front int, offset long, size int"


def parse(b: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch({"front": b["front"], "offset": b["offset"],
                            "size": pc.binary_length(b["payload"])})


def logged(ingest: Path, lo: int = 0, hi: int = 1 << 62) -> set[tuple[int, int, int, int]]:
    """The batch recomputation: (front, offset, size, slot) of every logged record with a
    time in [lo, hi)."""
    out = set()
    for f in (0, 1):
        r = IngestReader(ingest, f)
        times, payloads = r.read(0, r.end_offset())
        for i, (t, p) in enumerate(zip(times.tolist(), payloads.to_pylist(), strict=True)):
            if lo <= t < hi:
                out.add((f, i, len(p), int(t)))
    return out


def rows_of(folder: Path) -> list[tuple[int, int, int, int]]:
    files = sorted(folder.glob("part-*.parquet"))
    t = pa.concat_tables([pq.read_table(f, columns=["front", "offset", "size", "lt_time"])
                          for f in files])
    return list(zip(*(t[c].to_pylist() for c in t.column_names), strict=True))


def test_loss_replayed_completes_windows_exactly_once(spark, tmp_path: Path) -> None:
    ingest, out = tmp_path / "ingest", tmp_path / "out"
    pipe = lowtide.Pipeline(spark, "replay", grid=GRID, stuck_after_ms=3_000)
    stream = (pipe.read_log(str(ingest), fronts=[0, 1])
              .map(parse, SCHEMA, name="parse")
              .transform(lambda d: d.mapInArrow(drop_once(str(tmp_path / "dropped")), d.schema)))
    try:
        pipe.start_tracker(stream.graph())
        fronts = [pipe.front(f, fsync="never") for f in (0, 1)]
        query = stream.write_parquet(str(out), checkpoint=str(tmp_path / "ckpt"),
                                     keep_tracking_columns=True, trigger="200 milliseconds")
        final = send_rounds(fronts, rounds=6)
        deadline = time.monotonic() + 120
        # a loss at the sink stays; a window that is only slow (a loaded machine) goes
        while not (found := [x for x in pipe.losses() if x.segment == "sink"]):
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, f"no loss reported: {pipe.status().stuck}"
            time.sleep(0.3)
        text = found[0].describe(GRID)
        assert "item(s) missing; replay front" in text and "offsets [" in text, text
        with pytest.raises(ReplayRefused, match="promised only up to"):
            pipe.replay((final + 100) * 10, (final + 200) * 10, str(tmp_path / "early"))
        repaired = pipe.repair(timeout_s=180)
        assert repaired.rows == sum(x.missing for x in repaired.losses) > 0
        query.wait_for_min_time(final, timeout_s=120)
        deadline = time.monotonic() + 30  # the stuck report is refreshed on its own clock
        while pipe.status().stuck:
            assert time.monotonic() < deadline, pipe.status().stuck
            time.sleep(0.2)
        assert pipe.repair().rows == 0  # nothing stuck any more: nothing to do
        times = sorted(t for *_row, t in logged(ingest))
        lo, hi = times[len(times) // 2], final
        replayed = pipe.replay(lo * GRID.delta_ms, hi * GRID.delta_ms, str(tmp_path / "fresh"))
    finally:
        pipe.close()
    got = rows_of(out)
    assert len(got) == len(set(got)), "a row was written twice"
    assert set(got) == logged(ingest)
    assert (replayed.from_slot, replayed.to_slot) == (lo, hi)
    fresh = rows_of(tmp_path / "fresh")
    assert len(fresh) == len(set(fresh)) and set(fresh) == logged(ingest, lo, hi)
