"""A live query, PySpark style: the first visit of each user, then no other visit of
theirs within 500 ms (``dropDuplicates`` within a time range, exact), written with
``writeStream``, watched through the query handle in timestamps.

Producers write visits into an ingest log through ``lowtide.Front`` (labelled with
the front's clock); one of them is slow. Run it with ``python examples/first_visits.py``;
the suite runs it (tests/test_examples.py) and it checks its output against a batch
pass over the log.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

import lowtide
from lowtide.spark.sources.ingest import IngestReader

WITHIN_MS = 500


def visits(front: Any, stop: threading.Event, pause_s: float) -> None:
    """A producer: a visit of one of its five users every ``pause_s``."""
    i = 0
    while not stop.wait(pause_s):
        front.send([f"{'ab'[front.front]}{i * 7 % 5}".encode()])
        i += 1


def main(spark: Any, work: Path) -> pd.DataFrame:
    stop = threading.Event()
    # examples/first_visits.py
    with lowtide.Pipeline(spark, "visits") as pipe:
        first = (pipe.read_log(str(work / "log"))
                 .selectExpr("CAST(payload AS STRING) AS user", "front", "offset")
                 .dropDuplicates(["user"], within=f"{WITHIN_MS} milliseconds"))
        pipe.start_tracker(first.graph())
        producers = [threading.Thread(target=visits, args=(pipe.front(f), stop, pause))
                     for f, pause in ((0, 0.02), (1, 0.2))]        # front 1 is slow
        for p in producers:
            p.start()
        query = (first.writeStream.format("parquet")
                 .option("checkpointLocation", str(work / "checkpoint"))
                 .trigger(processingTime="200 milliseconds").queryName("first_visits")
                 .start(str(work / "out")))
        until = datetime.now(tz=UTC)
        complete = query.wait_until_complete(until, timeout_s=180)  # a timestamp
        print(query.name, query.isActive, query.status["completeBelow"], query.stuck())
        query.stop()
        stop.set()
        for p in producers:
            p.join()
        got = pd.read_parquet(work / "out")
    # the end of the example

    kept = set(zip(got["front"], got["offset"], strict=True))
    assert len(kept) == len(got), "a visit kept twice"
    expected = first_rows(work / "log", pipe.grid.delta_ms)
    below = {k for k, ms in expected.items() if ms < complete.timestamp() * 1000 - 10}
    assert below <= kept <= set(expected), (len(below - kept), len(kept - set(expected)))
    return got


def first_rows(log: Path, delta_ms: int) -> dict[tuple[int, int], int]:
    """(front, offset) -> slot start ms of each visit a batch pass keeps: per user in
    time order, a visit more than WITHIN_MS after the last kept one (a user's visits
    come from one front, never two in a slot: the ack order within a slot, which
    decides ties, does not matter here)."""
    rows = []
    for f in (0, 1):
        reader = IngestReader(log, f)
        times, payload = reader.read(0, reader.end_offset())
        rows += [(int(t), f, o, p.decode()) for o, (t, p) in
                 enumerate(zip(times.tolist(), payload.to_pylist(), strict=True))]
    last: dict[str, int] = {}
    kept = {}
    for t, f, o, user in sorted(rows):
        if user not in last or (t - last[user]) * delta_ms > WITHIN_MS:
            kept[(f, o)] = t * delta_ms
            last[user] = t
    return kept


if __name__ == "__main__":
    from lowtide.spark import SessionConfig

    with tempfile.TemporaryDirectory() as tmp:
        print(main(SessionConfig().build(), Path(sys.argv[1] if len(sys.argv) > 1 else tmp)))
