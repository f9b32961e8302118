"""A speculative window's changelog step on the driver, in the sink's ``foreachBatch``
(rule 13): Spark aggregates, the driver versions. An exact window's results come from
the same step with another logic (:mod:`.window_driver`).

::

    rows, received and stamped by their senders            (window_input)
         .groupBy(keys, window).agg(...)   in update mode   (window_plan, in the JVM)
         --> each batch: the (key, window)s whose values changed, one row each
    foreachBatch, on the driver: ChangelogLogic over every key  (this module)
         --> tombstone of the last version, the new version; the final once complete
         --> the sink's own function, then its acks

Where the window is the query's last step, the rows Spark's update mode hands on per
micro-batch (one per changed (key, window): a few, whatever the input rows) are
collected to the driver, and the changelog is computed there by the same logic the
keyed runtime runs (:class:`.speculative_plan.ChangelogLogic`, all keys one bucket).
The query then has one stateful operator, Spark's, and no second shuffle: the keyed
step's per-batch cost (its stage, its state server round trips, its planning) is gone.

Its state (every open (key, window)'s latest values and the version last shown, and
the slots of its open holds) is a small file per micro-batch in the checkpoint
(:class:`ChangelogStore`): a batch reads the state the batch before it left, so a batch
run again after a restart reads the same state, the same batch timestamp (the offset
log's) and the same min times, and emits the same rows with the same acks (rules 5
and 6).

The min times (``S_in``'s, or each of its key ranges': :mod:`.window_driver`) are read
once the batch's changed rows are collected, so once its tasks have received their
rows, and written down (``done-<batch>``) before they are used; a batch run again uses
those. A window they complete comes out in this very batch: every row below them was
received by a task of this batch or an earlier one (no later batch has run), so it is
in the changed rows this step has seen. Read at the batch's start instead, a window
whose last rows this batch received would wait for the next batch.

Its acks (holds opened in ``S_in.state``, versions and tombstones sent into the sink's
segment as children of their slots' holds, holds released) go as one keyed batch
``(query, batch, S_in, DRIVER_PARTITION)`` and are confirmed before the sink's function
sees a row; then the sink acks their receipt as any sink does.

A checkpoint that already ran the keyed step (written before this plan, or by a window
with steps after it) keeps it: the plan is chosen once per checkpoint
(:func:`ChangelogStore.usable`).
"""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from lowtide.spark.collect import Collector
from lowtide.spark.operators.joins import KEY_COL
from lowtide.spark.operators.slot_logic import (
    Ranges,
    key_in_two_ranges,
    range_order,
    step_ranges,
    two_ranges,
)
from lowtide.spark.operators.state_clock import StateClock, key_hash, range_parent
from lowtide.spark.operators.state_processor import (
    NoParts,
    early_acks,
    emit_acks,
    tracked_rows,
)
from lowtide.spark.sinks.foreach import (
    OnFailure,
    TrackedForeachBatch,
    query_id,
    send_sink_acks,
)
from lowtide.spark.sinks.parquet import ParquetSink
from lowtide.spark.tracking.column import TRACK_COL
from lowtide.spark.tracking.key_ranges import RANGE_HI, RANGE_LO
from lowtide.spark.tracking.transport import HOLD_WAIT_S, TrackerRef

#: the partition of the driver step's ack batch: no task of ``S_in`` has it
DRIVER_PARTITION = (1 << 31) - 1
DONE_PREFIX = "done-"  # the min times a batch stepped with

#: range -> (the slots of its open holds, the logic's state); range None: a window
#: without key ranges
State = Ranges
SinkFn = Callable[[Any, int], Any]


def batch_timestamp_ms(checkpoint: str, batch_id: int) -> int:
    """Spark's timestamp of micro-batch ``batch_id`` (its offset log entry's
    ``batchTimestampMs``): what ``current_timestamp()`` and a stateful processor's
    processing time are in that batch, the same when it runs again."""
    lines = (Path(checkpoint) / "offsets" / str(batch_id)).read_text().splitlines()
    return int(json.loads(lines[1])["batchTimestampMs"])


class ChangelogStore:
    """The driver step's state after each micro-batch: ``<checkpoint>/lowtide/
    changelog-<window>/<batch id>``, written whole (a temporary file renamed). A batch
    reads the newest state below its own id; once a batch has written its state, the
    states below the one it read are never read again and are removed."""

    def __init__(self, checkpoint: str, window: str) -> None:
        self.dir = Path(checkpoint) / "lowtide" / f"changelog-{window}"

    @staticmethod
    def usable(checkpoint: str, window: str) -> bool:
        """May the query of ``checkpoint`` run the step on the driver: a new checkpoint
        (no batch planned yet), or one whose batches it already ran? (Created here for
        a new one, so that its restarts keep the plan.)"""
        store = ChangelogStore(checkpoint, window)
        if store.dir.is_dir():
            return True
        offsets = Path(checkpoint) / "offsets"
        if offsets.is_dir() and any(p.name.isdigit() for p in offsets.iterdir()):
            return False
        store.dir.mkdir(parents=True, exist_ok=True)
        return True

    def _ids(self) -> list[int]:
        return sorted(int(p.name) for p in self.dir.iterdir() if p.name.isdigit())

    def load(self, batch_id: int) -> tuple[int, State]:
        """(the batch whose state this is, -1 for none; the state before ``batch_id``)."""
        below = [i for i in self._ids() if i < batch_id]
        if not below:
            return -1, {}
        state = pickle.loads((self.dir / str(below[-1])).read_bytes())
        if state is None or isinstance(state, tuple):  # written before key ranges
            return below[-1], {} if state is None else {None: state}
        return below[-1], state

    def save(self, batch_id: int, state: State, read: int) -> None:
        """Batch ``batch_id``'s state, which read ``read``'s: the states below that, and
        the min times of the batches before this one (committed), are read no more."""
        self._write(str(batch_id), state)
        for i in self._ids():
            if i < read:
                (self.dir / str(i)).unlink(missing_ok=True)
        for p in self.dir.glob(f"{DONE_PREFIX}*"):
            if int(p.name.removeprefix(DONE_PREFIX)) < batch_id:
                p.unlink(missing_ok=True)

    def done(self, batch_id: int, ask: Callable[[], dict[int | None, int]]
             ) -> dict[int | None, int]:
        """The min times batch ``batch_id`` steps with: ``ask()``'s the first time the
        batch runs, written down before they are used, and the same ones whenever it
        runs again (rule 5; a min time read once stays a true one)."""
        path = self.dir / f"{DONE_PREFIX}{batch_id}"
        if path.exists():
            done: dict[int | None, int] = pickle.loads(path.read_bytes())
            return done
        done = ask()
        self._write(path.name, done)
        return done

    def _write(self, name: str, value: Any) -> None:
        tmp = self.dir / f".{name}.tmp"
        tmp.write_bytes(pickle.dumps(value))
        os.replace(tmp, self.dir / name)


@dataclass(frozen=True)
class DriverChangelog:
    """The driver step of window ``window`` (its inbound segment): ``logic`` is a
    :class:`.speculative_plan.ChangelogLogic` over every key (a speculative window's
    changelog) or a :class:`.window_finals.WindowFinals` (an exact window's results,
    :mod:`.window_driver`); ``schema``: the output's DDL (keys, window, aggregates,
    the changelog's columns if any, and ``lt_track``)."""

    window: str
    logic: Any
    schema: str
    ref: TrackerRef
    out_segment: str
    op_id: int
    checkpoint: str
    eager: bool = False
    key_ranges: int = 0  # how many key ranges ``S_in`` is split into (rule 15)

    def step(self, new: Any, state: State, done: dict[int | None, int], now_ms: int,
             clock: StateClock) -> tuple[State, list[Any]]:
        """One batch: its changed rows ``new`` (None: none) over ``state``, with the
        min times ``done`` (of ``S_in``, or of each of its key ranges); the state after
        it and the output frames (with ``lt_track``), the acks in ``clock``."""
        kept, steps = step_ranges(self.logic, (), state, self._by_range(new), done,
                                  NoParts(), now_ms, self.eager)
        # a window's ranges keep columns (:class:`.window_finals.WindowFinals`): their keys
        twice = key_in_two_ranges({r: (w, dict.fromkeys(s[KEY_COL])) for r, (w, s)
                                   in kept.items()}) if self.key_ranges else None
        if twice is not None:
            raise two_ranges(f"window {self.window!r}", twice[0], twice[1], self.key_ranges)
        base, frames = key_hash(("lowtide driver changelog", self.window)), list[Any]()
        for r, s in steps:
            parent = base if r is None else range_parent(base, r)
            packed = emit_acks(clock, self.op_id, parent, s, now_ms)
            frames += tracked_rows(s, packed, early_acks(clock, self.op_id, parent, s, now_ms))
        return kept, frames

    def ranges(self) -> list[int | None]:
        """The min times a batch steps with: ``S_in``'s, or each of its key ranges'."""
        return list(range(self.key_ranges)) if self.key_ranges else [None]

    def _by_range(self, new: Any) -> dict[int | None, Any]:
        """A batch's changed rows by key range (a window without: range None); a
        (key, window) whose rows came from two ranges is refused."""
        if new is None or not len(new):
            return {}
        if not self.key_ranges:
            return {None: new}
        lo, hi = new[RANGE_LO].to_numpy(np.int64), new[RANGE_HI].to_numpy(np.int64)
        if (lo != hi).any():
            i = int(np.flatnonzero(lo != hi)[0])
            raise two_ranges(f"window {self.window!r}", new[KEY_COL].iloc[i],
                             [int(lo[i]), int(hi[i])], self.key_ranges)
        return {r: new[lo == r].reset_index(drop=True)
                for r in sorted(np.unique(lo).tolist(), key=range_order)}

    def wrap(self, sink: SinkFn, *, wait_s: float = HOLD_WAIT_S,
             on_failure: OnFailure | None = None) -> SinkFn:
        """The query's ``foreachBatch`` function: this step, then ``sink`` (a tracked
        sink's function; the null sink acks the rows' tracking column, no Spark job)."""
        store = ChangelogStore(self.checkpoint, self.window)
        collector: Collector | None = None  # the first batch's: every batch has its schema

        def run(df: Any, batch_id: int) -> None:
            nonlocal collector
            import pandas as pd

            from lowtide.service.clock import wall_ms

            query = query_id(df.sparkSession.sparkContext)
            read, state = store.load(batch_id)
            clock = StateClock(self.ref, self.window, self.out_segment, self.op_id)
            now_ms = batch_timestamp_ms(self.checkpoint, batch_id)
            # not toPandas: a third of its CPU (lowtide.spark.collect), and no warning
            # with the JVM's stack trace when a task failed for good
            collector = collector or Collector.of(df)
            changed = collector(df)
            # read once this batch's tasks are done: every row received below them is
            # in this batch's changed rows or an earlier one's (no later batch ran)
            done = store.done(batch_id, lambda: clock.complete_below(wall_ms(), self.ranges()))
            state, frames = self.step(changed, state, done, now_ms, clock)
            acks = clock.acc.build(self.ref.grid.window_slots)
            if len(acks):
                send_sink_acks(self.ref, self.window, query, batch_id, acks, wait_s=wait_s,
                               on_failure=on_failure, what=f"window {self.window!r}",
                               partition=DRIVER_PARTITION)
            store.save(batch_id, state, read)
            rows = pd.concat(frames, ignore_index=True)[self._names] if frames else None
            if isinstance(sink, TrackedForeachBatch) and sink.fn is None:  # the null sink
                packed = np.zeros(0, np.int64) if rows is None else rows[TRACK_COL].to_numpy()
                sink.receive_packed(packed, query, batch_id)
            elif isinstance(sink, ParquetSink):  # written here: no Spark job for a few rows
                sink.write_local(None if rows is None else self._arrow(rows), query, batch_id)
            else:
                sink(df.sparkSession.createDataFrame([] if rows is None else rows,
                                                     self._struct), batch_id)

        return run

    @cached_property
    def _struct(self) -> Any:
        from pyspark.sql.types import _parse_datatype_string

        return _parse_datatype_string(self.schema)

    def _arrow(self, rows: Any) -> Any:
        """``rows`` as the Arrow record batch Spark would hand a task."""
        import pyarrow as pa

        batch = pa.RecordBatch.from_pandas(rows, schema=self._arrow_schema,
                                           preserve_index=False)
        return batch.replace_schema_metadata(None)  # no pandas index in the files

    @cached_property
    def _arrow_schema(self) -> Any:
        """The output's Arrow schema (timestamps in the session's time zone, UTC:
        :mod:`lowtide.spark.session`)."""
        from pyspark.sql.pandas.types import to_arrow_schema

        return to_arrow_schema(self._struct, timezone="UTC")

    @cached_property
    def _names(self) -> list[str]:
        return [f.name for f in self._struct.fields]
