"""The fault kind "listeners added late to a finished input" (``lowtide bench chaos
--spark``): an exact window over a log whose two fronts finished before the query
started, in a session whose listener registrations are held back until every running
query ran out of batches (a loaded driver: Py4J and the listener bus late). Such a
query can run every batch it has before a listener added after ``start()`` hears of
one; the window's hold must still be released and every window emitted.

Ground truth: the records the fronts wrote, counted per window of the output.

* ``premature``: the sink's min time passed a window whose count in the output is
  short;
* ``lost``: records not counted in the output at the end, or in a window the sink
  never announced complete (a hold left standing at the first window: all of them).
"""

from __future__ import annotations

import contextlib
import glob
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from lowtide.bench.chaos.run import Result
from lowtide.core.time import TimeGrid
from lowtide.spark import Pipeline
from lowtide.spark.sources import IngestReader

LATE_LISTENER = "listeners added late to a finished input"
ROUNDS, PER_ROUND = 5, 4  # records each front writes: ROUNDS sends of PER_ROUND
WINDOW_MS = 200


def ran_out(query: Any) -> bool:
    """Whether a Spark query ended its batches: its watermark reached the last
    timestamp, in the year 9999 (every front finished), or it failed."""
    if query.exception() is not None:
        return True
    marks = [p["eventTime"].get("watermark") for p in query.recentProgress]
    return any(m is not None and datetime.fromisoformat(m).year == 9999 for m in marks)


@contextlib.contextmanager
def listeners_added_late(wait_s: float = 90.0) -> Iterator[None]:
    """While open, the session adds a listener only once every running query ran out
    of batches (or after ``wait_s``): the race between a short query and a listener
    added after its start, at its widest."""
    from pyspark.sql.streaming.query import StreamingQueryManager

    add = StreamingQueryManager.addListener

    def late_add(self: Any, listener: Any) -> None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and not all(ran_out(q) for q in self.active):
            time.sleep(0.1)
        add(self, listener)

    StreamingQueryManager.addListener = late_add  # type: ignore[method-assign]
    try:
        yield
    finally:
        StreamingQueryManager.addListener = add  # type: ignore[method-assign]


def counts_of(out: Path) -> dict[int, int]:
    """Records per window start (ms) in the output's Parquet files."""
    counts: dict[int, int] = {}
    for f in glob.glob(str(out / "*.parquet")):
        t = pq.read_table(f, columns=["window_start", "n"])
        starts = t["window_start"].cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64())
        for start, n in zip(starts.to_pylist(), t["n"].to_pylist(), strict=True):
            counts[start] = counts.get(start, 0) + n
    return counts


def written_of(log: Path, grid: TimeGrid, fronts: int) -> dict[int, int]:
    """Records per window start (ms) in the fronts' ingest log."""
    written: dict[int, int] = {}
    for f in range(fronts):
        reader = IngestReader(log, f)
        for slot in reader.read(0, reader.end_offset())[0].tolist():
            start = grid.slot_start_ms(int(slot)) // WINDOW_MS * WINDOW_MS
            written[start] = written.get(start, 0) + 1
    return written


def counting_window(pipe: Pipeline, log: Path) -> Any:
    """The scenario's query: the log's records counted per window of WINDOW_MS."""
    return (pipe.read_log(str(log))
            .map(lambda b: pa.record_batch({"user": pa.array(["u"] * b.num_rows)}),
                 "user string", name="users")
            .window(f"{WINDOW_MS} milliseconds", key="user", name="win").agg(n="count"))


def send_rounds(fronts: list[Any], rounds: int) -> None:
    """Each front sends PER_ROUND records a round, 50 ms apart."""
    for _ in range(rounds):
        for f in fronts:
            f.send([b"x"] * PER_ROUND)
        time.sleep(0.05)


def late_listener_run(spark: Any, tmp: Path) -> Result:
    """Write the input, close its fronts, then start the window query with listeners
    held back; wait until the sink is complete past the input's end."""
    result = Result(LATE_LISTENER, faults=1)
    log, out = tmp / "log", tmp / "out"
    pipe = Pipeline(spark, "chaos-late-listener", stuck_after_ms=120_000)
    stream = counting_window(pipe, log)
    query = None
    claimed = 0
    try:
        pipe.start_tracker(stream.graph())
        fronts = [pipe.front(f, fsync="never", heartbeat_ms=10) for f in (0, 1)]
        send_rounds(fronts, ROUNDS)
        last = min(f.close() for f in fronts)
        with listeners_added_late():
            query = stream.write_parquet(str(out), checkpoint=str(tmp / "ckpt"),
                                         trigger=f"{WINDOW_MS} milliseconds")
        try:
            query.wait_for_min_time(last, timeout_s=120)
        except TimeoutError as stuck:
            result.notes.append(str(stuck))
        claimed = query.min_time("sink")
    finally:
        if query is not None:
            query.stop()
        pipe.close()
    written = written_of(log, pipe.grid, fronts=2)
    have = counts_of(out)
    end_ms = pipe.grid.slot_start_ms(claimed)
    short = [s for s, n in written.items() if s + WINDOW_MS <= end_ms and have.get(s, 0) < n]
    if short:
        result.premature.append(f"min time {claimed} announced, {len(short)} windows below "
                                "it short in the output")
    # records not in the output, or in a window never announced complete (they wait
    # for good: a hold left standing)
    result.lost = max(sum(written.values()) - sum(have.values()),
                      sum(n for s, n in written.items() if s + WINDOW_MS > end_ms))
    return result
