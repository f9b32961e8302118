"""The fault kind "rows lost in a step, replayed" (``lowtide bench chaos --spark``, and
the replay part of ``lowtide bench recovery``): two fronts write an ingest log; a query
reads it, and an untracked step after the source drops some rows in one task; the
tracker reports the sink's windows stuck; ``pipe.repair()`` replays their time range
and completes them. Ground truth: every record the fronts logged.

* ``premature``: the sink's min time announced while a logged record below it was not in
  the output, or a row written twice;
* ``lost``: logged records not in the output at the end;
* ``false_loss_reports``: stuck windows the tracker reported with more items missing
  than were lost there (rows of a batch that was only slow), seen while polling.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lowtide.bench.chaos.run import Result
from lowtide.spark import Pipeline
from lowtide.spark.sources import IngestReader

TRIGGER = "300 milliseconds"
STUCK_AFTER_MS = 3_000


def drop_once(marker: str) -> Any:
    """An untracked 1:1 ``mapInArrow`` function that, in the first task with rows to
    claim ``marker`` (a file every worker sees), drops the rows whose ``offset`` is 1
    modulo 4: rows the tracked step before it sent on, lost there."""

    def run(batches):  # type: ignore[no-untyped-def]
        import pyarrow.compute as pc

        for b in batches:
            if b.num_rows:
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    yield b
                    continue
                yield b.filter(pc.not_equal(pc.bit_wise_and(b["offset"], 3), 1))
            else:
                yield b

    return run


@dataclass
class ReplayRun:
    """What one run logged, wrote and was told."""

    logged: dict[tuple[int, int], int] = field(default_factory=dict)  # (front, offset) -> slot
    written: list[tuple[int, int]] = field(default_factory=list)  # rows in the output
    by_query: set[tuple[int, int]] = field(default_factory=set)  # those the query wrote
    #: (segment, window start, missing) of every stuck window seen while polling
    reports: set[tuple[str, int, int]] = field(default_factory=set)
    claimed: int = 0  # the sink's min time at the end
    repaired_rows: int = 0
    repair_s: float = 0.0

    def false_loss_reports(self) -> int:
        """Reports of more missing rows in a window than were really lost there (only
        the sink loses rows here)."""
        lost = Counter(t for key, t in self.logged.items() if key not in self.by_query)
        return sum(1 for segment, start, missing in self.reports
                   if missing > (lost.get(start, 0) if segment == "sink" else 0))

    def equals_batch(self) -> bool:
        return len(self.written) == len(set(self.written)) and set(self.written) == set(
            self.logged)


def _rows(folder: Path, pattern: str = "part-*.parquet") -> list[tuple[int, int]]:
    import pyarrow.parquet as pq

    out: list[tuple[int, int]] = []
    for path in sorted(folder.glob(pattern)):
        t = pq.read_table(path, columns=["front", "offset"]).to_pydict()
        out += list(zip(t["front"], t["offset"], strict=True))
    return out


def _logged(ingest: Path) -> dict[tuple[int, int], int]:
    out = {}
    for f in (0, 1):
        reader = IngestReader(str(ingest), f)
        times, _payloads = reader.read(0, reader.end_offset())
        out.update({(f, i): int(t) for i, t in enumerate(times.tolist())})
    return out


def send_rounds(fronts: list[Any], rounds: int) -> int:
    """``rounds`` sends of 5 records per front, 50 ms apart, then the fronts closed;
    returns the smallest last heartbeat (every record is below it)."""
    for i in range(rounds):
        for front in fronts:
            front.send([b"r" * (i + k) for k in range(5)])
        time.sleep(0.05)
    time.sleep(0.03)  # the clock passes the last label before the final heartbeat
    return min(front.close() for front in fronts)


def lost_and_replayed(spark: Any, tmp: Path, timeout_s: float = 300.0) -> ReplayRun:
    ingest, out, run = tmp / "ingest", tmp / "out", ReplayRun()
    pipe = Pipeline(spark, "chaos-replay", stuck_after_ms=STUCK_AFTER_MS)
    stream = (pipe.read_log(str(ingest), fronts=[0, 1])
              .transform(lambda d: d.mapInArrow(drop_once(str(tmp / "dropped")), d.schema)))
    try:
        pipe.start_tracker(stream.graph())
        fronts = [pipe.front(f, fsync="never") for f in (0, 1)]
        query = stream.write_parquet(str(out), checkpoint=str(tmp / "ckpt"), trigger=TRIGGER,
                                     keep_tracking_columns=True)
        with _sampling(pipe, run.reports):
            final = send_rounds(fronts, rounds=8)
            deadline = time.monotonic() + timeout_s
            while not [x for x in pipe.losses() if x.segment == "sink"]:
                if time.monotonic() > deadline or query.exception() is not None:
                    raise RuntimeError(f"no loss reported at the sink: {pipe.status().stuck}")
                time.sleep(0.3)
            started = time.monotonic()
            run.repaired_rows = pipe.repair(timeout_s=timeout_s).rows
            run.repair_s = time.monotonic() - started
        run.claimed = query.wait_for_min_time(final, timeout_s=timeout_s)
    finally:
        pipe.close()
    run.logged, run.written = _logged(ingest), _rows(out)
    run.by_query = set(run.written) - set(_rows(out, "part-replay-*.parquet"))
    return run


@contextmanager
def _sampling(pipe: Any, into: set[tuple[str, int, int]]) -> Iterator[None]:
    """Every stuck window with missing items the tracker reports while the block runs."""
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            with suppress(Exception):  # the pipeline closing under it
                into.update((w["segment"], int(w["window_start"]), int(w["missing"]))
                            for w in pipe.tracker.status()["stuck_detail"] if w["missing"])

    thread = threading.Thread(target=sample, daemon=True, name="lowtide-bench-sampler")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def result_of(run: ReplayRun) -> Result:
    """The run as a chaos scenario's result."""
    result = Result("rows lost in a step, replayed", faults=1)
    have = set(run.written)
    early = [k for k, t in run.logged.items() if t < run.claimed and k not in have]
    if early:
        result.premature.append(f"min time {run.claimed} announced, {len(early)} records "
                                "below it not in the output")
    twice = len(run.written) - len(have)
    if twice:
        result.premature.append(f"{twice} rows written twice")
    result.lost = len(set(run.logged) - have)
    result.notes.append(f"{run.repaired_rows} rows replayed in {run.repair_s:.1f} s; "
                        f"{run.false_loss_reports()} false loss reports")
    return result


__all__ = ["ReplayRun", "drop_once", "lost_and_replayed", "result_of", "send_rounds"]
