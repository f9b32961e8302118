"""Rows in time order: ``stream.foreach_complete(fn)`` calls ``fn(df, t_from, t_to)``
once per completed range of global time, ranges in ascending order, with every row of
``[t_from, t_to)`` sorted by (``lt_time``, ``lt_ack``); :func:`ordered_writer` is such
an ``fn`` that appends each range to a Parquet folder or a Delta table.

::

    def publish(df, t_from, t_to):     # a batch DataFrame, UTC datetimes
        df.write.mode("append").parquet("/out/ordered")

    query = stream.foreach_complete(publish, checkpoint="/ckpt/q")

How (the barrier of rule 13): the query's ``foreachBatch`` stages each micro-batch's
rows (with their labels) as Parquet under ``<checkpoint>/complete/staged/b<batch>``,
overwritten if the batch runs again, and only then acks them as received by the sink.
A thread follows the sink segment's min time ``m``: no row below ``m`` is in flight or
will come, and every row below it is staged. It reads the staged rows of
``[released, m)``, calls ``fn``, then records ``m`` (written aside and renamed in:
``<checkpoint>/complete/released.json``) and deletes the staged batches it has
passed. A range without rows is not called: the next call's ``t_from`` is the last
call's ``t_to``, so the ranges a reader sees are contiguous.

Retries and restarts: a retried task or batch stages the same rows again (the same
folder); a restarted query (same checkpoint) starts from the recorded ``released``,
so no range is repeated or skipped. One window is left, as for ``foreachBatch``: a
crash after ``fn`` returned and before its range was recorded calls ``fn`` again with
the same range and rows: make ``fn`` idempotent by ``t_from`` (what
:func:`ordered_writer` does).
"""

from __future__ import annotations

import bisect
import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from lowtide.spark.tracking.column import ACK_COL, TIME_COL
from lowtide.spark.tracking.transport import TrackerRef, connect

log = logging.getLogger("lowtide.spark.sinks")
#: one releaser at a time per state dir: a stopped query's thread may still be in a
#: release when the restarted query's thread starts
_RELEASING: dict[str, threading.Lock] = {}
_RELEASING_LOCK = threading.Lock()
RANGE_FILE = "_lt_slots.json"  # the slots (lt_time) a staged batch's rows have
ORDERED_MANIFEST = "_lowtide_ordered.json"  # an ordered Parquet folder's completeness


def _at(slot: int, ref: TrackerRef) -> datetime:
    return datetime.fromtimestamp(slot * ref.grid.delta_ms / 1000, UTC)


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    """Write ``doc`` aside and rename it in: a reader sees the old or the new one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


@dataclass(frozen=True)
class Staged:
    """A staged micro-batch: its folder and the slots its rows have (ascending)."""

    path: Path
    slots: tuple[int, ...]

    def has_rows(self, start: int, end: int) -> bool:
        """Has it rows in ``[start, end)``?"""
        i = bisect.bisect_left(self.slots, start)
        return i < len(self.slots) and self.slots[i] < end


class CompleteRanges:
    """``foreach_complete``'s two halves: :meth:`stage` (the query's ``foreachBatch``
    function) and the thread that calls ``fn`` per completed range (:meth:`start`)."""

    def __init__(self, fn: Callable[[Any, datetime, datetime], Any], state_dir: str) -> None:
        self.fn = fn
        self.dir = Path(state_dir)
        self.staged_dir = self.dir / "staged"
        self.staged_dir.mkdir(parents=True, exist_ok=True)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def stage(self, df: Any, batch_id: int) -> None:
        """Stage a micro-batch's rows (with ``lt_time``, ``lt_ack``) before its acks,
        with the slots they have (a range is called only if it has rows)."""
        path = self.staged_dir / f"b{batch_id:012d}"
        if (path / RANGE_FILE).exists():
            return  # a batch run again after a restart: the same rows, staged already
        slots = sorted(int(r[0]) for r in df.select(TIME_COL).distinct().collect())
        if not slots:
            return  # no rows
        aside = self.staged_dir / f"tmp-{uuid.uuid4().hex}"
        df.write.parquet(str(aside))
        _write_json(aside / RANGE_FILE, {"slots": slots})
        os.replace(aside, path)  # whole or not at all: the thread may be reading

    def released(self) -> int | None:
        """The end of the last range handed to ``fn`` (a slot), None before the first."""
        path = self.dir / "released.json"
        return int(json.loads(path.read_text())["released"]) if path.exists() else None

    def start(self, ref: TrackerRef, segment: str, active: Callable[[], bool]) -> None:
        """Follow ``segment``'s min time on a thread while ``active()``."""
        self._thread = threading.Thread(target=self._follow, args=(ref, segment, active),
                                        daemon=True, name=f"lowtide-complete-{segment}")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _follow(self, ref: TrackerRef, segment: str, active: Callable[[], bool]) -> None:
        agent: Any = connect(ref)
        sub = agent.subscribe(segment)
        try:
            while not self._stop.is_set() and active():
                try:
                    m = sub.next_update(0.2).time
                except TimeoutError:
                    continue
                self.release(ref, m)
        except Exception as exc:  # fn failed, or the tracker closed under a stopping query
            self.error = exc
            if active():
                line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                log.error("foreach_complete stopped: %s (its range is called again when "
                          "the query restarts)", line)
        finally:
            sub.close()

    def release(self, ref: TrackerRef, complete_below: int) -> bool:
        """Hand the rows of ``[released, complete_below)`` to ``fn`` if there are any;
        True if ``fn`` was called."""
        with _RELEASING_LOCK:
            lock = _RELEASING.setdefault(str(self.dir.resolve()), threading.Lock())
        with lock:
            return self._release(ref, complete_below)

    def _release(self, ref: TrackerRef, complete_below: int) -> bool:
        staged = self._staged()
        start = self.released()
        if start is None:  # the first range: every row below complete_below is staged
            start = min((s.slots[0] for s in staged), default=complete_below)
        staged = [s for s in staged if s.has_rows(start, complete_below)]
        if complete_below <= start or not staged:
            return False
        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        spark = SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
        rows = (spark.read.parquet(*[str(s.path) for s in staged])
                .where((F.col(TIME_COL) >= start) & (F.col(TIME_COL) < complete_below))
                .orderBy(TIME_COL, ACK_COL))
        self.fn(rows, _at(start, ref), _at(complete_below, ref))
        _write_json(self.dir / "released.json", {"released": complete_below})
        for s in self._staged():
            if s.slots[-1] < complete_below:
                shutil.rmtree(s.path, ignore_errors=True)
        return True

    def _staged(self) -> list[Staged]:
        out = []
        for path in sorted(self.staged_dir.glob("b*")):  # tmp-*: being staged
            doc = json.loads((path / RANGE_FILE).read_text())
            out.append(Staged(path, tuple(doc["slots"])))
        return out


def ordered_writer(path: str, format: str = "parquet") -> Callable[[Any, datetime, datetime],
                                                                    None]:
    """An ``fn`` for ``foreach_complete`` that writes each range's rows in time order:
    Parquet, one folder per range (``<t_from ms>-<t_to ms>``, one file, rows sorted;
    rewritten whole if the range comes again) and ``_lowtide_ordered.json`` with
    ``complete_below_ms``; Delta, one append per range, idempotent by
    ``txnVersion`` = ``t_from`` in ms, with ``{"complete_below_ms": ...}`` as the
    commit's ``userMetadata``. A reader of either knows every row before
    ``complete_below_ms`` is there, in order."""
    if format not in ("parquet", "delta"):
        raise ValueError(f"ordered_writer: format {format!r}: use 'parquet' or 'delta'")
    app_id = f"lowtide-ordered:{os.path.abspath(path)}"

    def write(df: Any, t_from: datetime, t_to: datetime) -> None:
        lo, hi = int(t_from.timestamp() * 1000), int(t_to.timestamp() * 1000)
        one = df.coalesce(1).sortWithinPartitions(TIME_COL, ACK_COL)
        meta = {"complete_below_ms": hi}
        if format == "delta":
            (one.write.format("delta").mode("append").option("txnAppId", app_id)
             .option("txnVersion", lo).option("userMetadata", json.dumps(meta)).save(path))
            return
        one.write.mode("overwrite").parquet(os.path.join(path, f"{lo:015d}-{hi:015d}"))
        _write_json(Path(path) / ORDERED_MANIFEST, meta)

    return write
