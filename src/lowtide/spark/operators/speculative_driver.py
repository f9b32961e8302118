"""A speculative window's changelog step on the driver, in the sink's ``foreachBatch``
(rule 13): Spark aggregates, the driver versions.

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
log's) and the same min time at that timestamp, and emits the same rows with the same
acks (rules 5 and 6). Its acks (holds opened in ``S_in.state``, versions and tombstones
sent into the sink's segment as children of their slots' holds, holds released) go as
one keyed batch ``(query, batch, S_in, DRIVER_PARTITION)`` and are confirmed before the
sink's function sees a row; then the sink acks their receipt as any sink does.

A checkpoint that already ran the keyed step (written before this plan, or by a window
with steps after it) keeps it: the plan is chosen once per checkpoint
(:func:`ChangelogStore.usable`).
"""

from __future__ import annotations

import json
import os
import pickle
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from lowtide.spark.operators.slot_logic import step_ranges
from lowtide.spark.operators.state_clock import StateClock, key_hash
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
from lowtide.spark.tracking.column import TRACK_COL
from lowtide.spark.tracking.transport import HOLD_WAIT_S, TrackerRef

#: the partition of the driver step's ack batch: no task of ``S_in`` has it
DRIVER_PARTITION = (1 << 31) - 1

#: (the slots of the open holds, the logic's state), or None: nothing open
State = tuple[np.ndarray, Any] | None
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
            return -1, None
        state: State = pickle.loads((self.dir / str(below[-1])).read_bytes())
        return below[-1], state

    def save(self, batch_id: int, state: State, read: int) -> None:
        tmp = self.dir / f".{batch_id}.tmp"
        tmp.write_bytes(pickle.dumps(state))
        os.replace(tmp, self.dir / str(batch_id))
        for i in self._ids():
            if i < read:
                (self.dir / str(i)).unlink(missing_ok=True)


@dataclass(frozen=True)
class DriverChangelog:
    """The changelog step of speculative window ``window`` (its inbound segment) on
    the driver; ``logic``: a :class:`.speculative_plan.ChangelogLogic` over every key;
    ``schema``: the changelog's DDL (keys, window, aggregates, changelog columns and
    ``lt_track``)."""

    window: str
    logic: Any
    schema: str
    ref: TrackerRef
    out_segment: str
    op_id: int
    checkpoint: str
    eager: bool = False

    def step(self, new: Any, state: State, now_ms: int, clock: StateClock
             ) -> tuple[State, list[Any]]:
        """One batch: its changed rows ``new`` (None: none) over ``state``; the state
        after it and the changelog's frames (with ``lt_track``), the acks in ``clock``."""
        done = clock.complete_below(now_ms, [None])
        rows = {None: new} if new is not None and len(new) else {}
        kept, steps = step_ranges(self.logic, (), {} if state is None else {None: state},
                                  rows, done, NoParts(), now_ms, self.eager)
        parent, frames = key_hash(("lowtide driver changelog", self.window)), []
        for _, s in steps:
            packed = emit_acks(clock, self.op_id, parent, s, now_ms)
            frames += tracked_rows(s, packed, early_acks(clock, self.op_id, parent, s, now_ms))
        return kept.get(None), frames

    def wrap(self, sink: SinkFn, *, wait_s: float = HOLD_WAIT_S,
             on_failure: OnFailure | None = None) -> SinkFn:
        """The query's ``foreachBatch`` function: this step, then ``sink`` (a tracked
        sink's function; the null sink acks the rows' tracking column, no Spark job)."""
        store = ChangelogStore(self.checkpoint, self.window)

        def run(df: Any, batch_id: int) -> None:
            import pandas as pd

            query = query_id(df.sparkSession.sparkContext)
            read, state = store.load(batch_id)
            clock = StateClock(self.ref, self.window, self.out_segment, self.op_id)
            now_ms = batch_timestamp_ms(self.checkpoint, batch_id)
            with warnings.catch_warnings():
                # a task that failed for good, or a stop inside the batch, fails
                # toPandas, and PySpark would print the JVM's stack trace as a warning
                # first: the error itself goes on to the query, in one line
                warnings.simplefilter("ignore", UserWarning)
                changed = df.toPandas()
            state, frames = self.step(changed, state, now_ms, clock)
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
            else:
                sink(df.sparkSession.createDataFrame([] if rows is None else rows,
                                                     self._struct), batch_id)

        return run

    @cached_property
    def _struct(self) -> Any:
        from pyspark.sql.types import _parse_datatype_string

        return _parse_datatype_string(self.schema)

    @cached_property
    def _names(self) -> list[str]:
        return [f.name for f in self._struct.fields]
