"""Replay by time, and a loss repaired (docs/operating.md, "Replay by time"): a query
reads an ingest log into Parquet files; a bad step after its first tracked step loses
some rows once; a time range of the log is replayed into a fresh folder; the tracker
reports the windows that lost rows, with the log offsets to replay, and one call
completes them.

Two producers write the log through ``lowtide.Front``. Run it with ``python
examples/replay_repair.py``; the suite runs it (tests/test_examples.py) and it checks
the replay and the repaired output against a batch pass over the log: every logged
record once.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

import lowtide
from lowtide.bench.chaos.replay_fault import drop_once, send_rounds
from lowtide.spark.sources.ingest import IngestReader

SCHEMA = "front int, offset long, size int"


def parse(b: pa.RecordBatch) -> pa.RecordBatch:
    return pa.record_batch({"front": b["front"], "offset": b["offset"],
                            "size": pc.binary_length(b["payload"])})


def loses_rows_once(marker: Path) -> Callable[[Any], Any]:
    """A bad step (a bug, a bad deploy): in the first task with rows, it drops every
    fourth of them, after the tracked step before it sent them on. ``marker`` says it
    did."""
    return lambda df: df.mapInArrow(drop_once(str(marker)), df.schema)


def produce(pipe: Any, marker: Path) -> int:
    """Two producers send six rounds of records 50 ms apart and close their fronts;
    returns the fronts' promise (every record is below it) once the bad step has lost
    its rows (so the replay, which runs the same steps, loses none)."""
    fronts = [pipe.front(f) for f in (0, 1)]
    promised = send_rounds(fronts, rounds=6)
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert time.monotonic() < deadline, "the query read nothing"
        time.sleep(0.1)
    return promised


def wait_for_a_loss(pipe: Any, query: Any) -> None:
    """The tracker reports a window stuck ``stuck_after_ms`` after its bound passed."""
    deadline = time.monotonic() + 300
    while not pipe.losses():
        assert query.exception() is None, query.exception()
        assert time.monotonic() < deadline, f"no loss reported: {pipe.status().stuck}"
        time.sleep(0.3)


def main(spark: Any, work: Path) -> pd.DataFrame:
    # examples/replay_repair.py (replay)
    with lowtide.Pipeline(spark, "clicks", stuck_after_ms=3_000) as pipe:
        stream = (pipe.read_log(str(work / "ingest"), fronts=[0, 1])
                  .map(parse, SCHEMA, name="parse")
                  .transform(loses_rows_once(work / "lost")))    # for the loss below
        query = stream.write_parquet(str(work / "clicks"), checkpoint=str(work / "ckpt"),
                                     keep_tracking_columns=True)
        began = datetime.now(UTC)
        promised = produce(pipe, work / "lost")   # the slot the closed fronts promise
        done = pipe.replay(from_time=began, to_time=promised * pipe.grid.delta_ms,
                           path=str(work / "clicks-replay"))      # a fresh, empty folder
        print(done.offsets)   # {front: (first offset, end offset)} that were replayed
        # the end of the part

        wait_for_a_loss(pipe, query)
        # examples/replay_repair.py (repair)
        for loss in pipe.losses():        # the stuck windows with missing items
            print(loss.describe(pipe.grid))
        repaired = pipe.repair()          # one call: replay those ranges, complete the windows
        print(repaired.rows, "rows written for", repaired.losses)
        # the end of the example

        assert repaired.rows == sum(loss.missing for loss in repaired.losses) > 0
        query.wait_for_min_time(promised, timeout_s=300)   # the windows completed
    log = logged(work / "ingest")
    got = pd.read_parquet(work / "clicks")
    assert not got.duplicated(["front", "offset"]).any(), "a row written twice"
    assert rows(got) == rows(log)
    replayed = pd.read_parquet(work / "clicks-replay")
    wanted = log[(log["lt_time"] >= done.from_slot) & (log["lt_time"] < done.to_slot)]
    assert len(wanted) > 0 and len(replayed) == len(wanted)
    assert rows(replayed) == rows(wanted)
    return got


def logged(log: Path) -> pd.DataFrame:
    """The batch pass: every record in the log, as the query's rows."""
    parts = []
    for f in (0, 1):
        reader = IngestReader(log, f)
        times, payload = reader.read(0, reader.end_offset())
        parts.append(pd.DataFrame({"front": f, "offset": range(len(times)),
                                   "size": [len(p) for p in payload.to_pylist()],
                                   "lt_time": times}))
    return pd.concat(parts, ignore_index=True)


def rows(df: pd.DataFrame) -> set[tuple[int, int, int, int]]:
    return set(zip(df["front"], df["offset"], df["size"], df["lt_time"], strict=True))


if __name__ == "__main__":
    from lowtide.spark import SessionConfig

    with tempfile.TemporaryDirectory() as tmp:
        print(main(SessionConfig().build(), Path(tmp)).to_string(max_rows=20))
