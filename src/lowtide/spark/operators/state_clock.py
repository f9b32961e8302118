"""The state clock: the acks of an exact stateful step, on which windows, joins and a
user's own keyed state (``stream.stateful``) are built.

A stateful step has three segments: its inbound segment ``S_in`` (named after the
step), its state segment ``S_in.state`` and its outbound segment (named after the next
receiver). Gearpump's state clock, exact (rule 7): pending state, state that will
still produce an output, keeps one *hold* open in ``S_in.state`` at the time of that
output, so the outbound segment's min time (bounded by the state segment's) cannot
pass an output that is not emitted yet. Per task, :class:`StateClock` collects:

* every input row: its receive-ack out of ``S_in``, at the row's time;
* a new pending output: its hold, sent into ``S_in.state`` at the output's time;
* an emitted output: its rows, children of the hold, sent into the outbound segment
  at the hold's time, and the hold's receive-ack, in the same batch (children first);

and sends them as ONE keyed batch ``(query id, batch id, S_in, partition)`` when the
task closes (rule 6).

Completeness is asked at the batch's timestamp (``timerValues.
getCurrentProcessingTimeInMs()``), the same in every attempt of a task, so every
attempt decides the same (rule 5): :meth:`StateClock.complete_below` is ``S_in``'s min
time *at that timestamp*, which the tracker answers once its clock has passed it. A
pending output at time ``t`` may be emitted once that min time is above ``t``: every
row below it was received in an earlier batch, whose state is committed.

Caveat: the tracker's min time history is kept in memory (10 minutes). A task retried
across a tracker restart, or more than 10 minutes after its batch started, may decide
"not complete" where its first attempt emitted; the output is then emitted by a later
batch, but the first attempt's applied acks and the retry's rows disagree and the
tracker reports the outbound segment stuck.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from lowtide.core.acks import child_acks
from lowtide.spark.tracking.column import (
    ID_MASK,
    AckAccumulator,
    ack_ids,
    as_i64,
    pack,
    slots_of,
)
from lowtide.spark.tracking.transport import TrackerRef

STATE_SUFFIX = ".state"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def state_segment(name: str) -> str:
    return name + STATE_SUFFIX


class StatefulStep:
    """A step description (a dataclass with a ``name``) whose step has a state segment."""

    name: str

    def segments(self) -> list[str]:
        return [self.name, state_segment(self.name)]


def key_hash(value: Any) -> int:
    """A deterministic 64-bit hash of a key value (Python's hash() is salted)."""
    text = f"{type(value).__name__}:{value}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def holds_under(op_id: int, parent: int, starts: np.ndarray) -> np.ndarray:
    """The holds at ``starts`` of the key whose :func:`key_hash` is ``parent``."""
    parents = np.full(len(starts), parent, np.uint64)
    return child_acks(parents, op_id, np.asarray(starts, np.int64).astype(np.uint64))


def range_parent(parent: int, key_range: int) -> int:
    """What the holds of one key range of a bucket descend from (rule 15: a range's
    holds are its own, whatever the bucket's other ranges emit)."""
    return key_hash((parent, key_range))


def hold_as_i64(hold: int) -> int:
    """A hold as a Spark long (the state store keeps signed 64-bit values)."""
    return int(as_i64(np.array([hold], np.uint64))[0])


def use_rocksdb(spark: Any) -> None:
    """Stateful steps keep their state in RocksDB (transformWithState needs it)."""
    if spark.conf.get("spark.sql.streaming.stateStore.providerClass", "") != ROCKSDB:
        spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)


def check_keys(step: str, keys: tuple[str, ...], fields: dict[str, str]) -> None:
    """Each key of ``step`` (e.g. "window 'w'") is a column Spark can group by;
    ``fields``: the input's columns (name -> simpleString)."""
    for k in keys:
        if k not in fields:
            raise ValueError(f"{step}: no key column {k!r} (columns: {', '.join(fields)})")
        if fields[k].startswith("map<"):
            raise ValueError(f"{step}: key column {k!r} ({fields[k]}) is a map, which Spark "
                             "cannot group by")


def insert_keys(res: Any, names: tuple[str, ...], values: tuple[Any, ...]) -> None:
    """Put a group's key columns first in its output rows ``res`` (a pandas DataFrame;
    object columns, so that Spark types them from the output schema, timestamps as
    timestamps)."""
    insert_key_rows(res, names, [values] * len(res))


def insert_key_rows(res: Any, names: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    """:func:`insert_keys` with each output row's own key values (a bucket's rows)."""
    import datetime

    import pandas as pd

    for i, name in enumerate(names):
        series = pd.Series([r[i] for r in rows], dtype=object)
        if any(isinstance(r[i], datetime.datetime | np.datetime64) for r in rows):
            series = pd.to_datetime(series)
        res.insert(i, name, series)


class StateClock:
    """One task's acks of a stateful step; see the module docstring. Built in the
    processor's ``init`` on the executor."""

    def __init__(self, ref: TrackerRef, in_segment: str, out_segment: str, op_id: int) -> None:
        graph = ref.graph
        self.ref = ref
        self.in_segment = in_segment
        self.op_id = op_id
        self.in_idx = graph.index(in_segment)
        self.state_idx = graph.index(state_segment(in_segment))
        self.out_idx = graph.index(out_segment)
        self.acc = AckAccumulator()
        # batch ms -> min time of S_in (key None) or of one of its key ranges
        self._complete: tuple[int, dict[int | None, int]] = (-1, {})

    def complete_below(self, now_ms: int, key_ranges: list[int | None]
                       ) -> dict[int | None, int]:
        """``S_in``'s min time (range None) or its key ranges' (rule 15) at the batch
        timestamp ``now_ms``: the same in every attempt (asked once per batch; the ranges
        not asked yet go together, one round trip's wait for all of them)."""
        if self._complete[0] != now_ms:
            self._complete = (now_ms, {})
        known = self._complete[1]
        ask = [r for r in key_ranges if r not in known]
        if ask:
            from lowtide.spark.tracking.transport import connect

            agent: Any = connect(self.ref)
            names = [self.in_segment if r is None else
                     self.ref.graph.range_name(self.in_idx, r) for r in ask]
            known.update(zip(ask, map(int, agent.min_times_at(names, now_ms)), strict=True))
        return {r: known[r] for r in key_ranges}

    def receive(self, packed: np.ndarray, now_ms: int, key_range: int | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
        """Receive rows out of ``S_in`` (of one key range of it): (their slots, their
        ack ids)."""
        times = slots_of(packed, self.ref.grid.slot_of(now_ms))
        ids = ack_ids(packed)
        cell = self.in_idx if key_range is None else self.ref.graph.cell(self.in_idx, key_range)
        self.acc.add(cell, times, ids, -1)
        return times, ids

    def open_hold(self, slot: int, hold: int) -> None:
        """A pending output at ``slot``: its hold into the state segment."""
        self.open_holds(np.array([slot], np.int64), np.array([hold], np.uint64))

    def open_holds(self, slots: np.ndarray, holds: np.ndarray) -> None:
        """:meth:`open_hold` of each (slot, hold)."""
        self.acc.add(self.state_idx, np.asarray(slots, np.int64), holds, +1)

    def emit(self, slot: int, hold: int, rows: int, now_ms: int) -> np.ndarray:
        """The tracking column of ``rows`` output rows at ``slot``, children of
        ``hold``: sent into the outbound segment, and the hold released."""
        return self.emit_slots(np.array([slot], np.int64), np.array([hold], np.uint64),
                               np.array([rows], np.int64), now_ms)

    def emit_slots(self, slots: np.ndarray, holds: np.ndarray, counts: np.ndarray,
                   now_ms: int) -> np.ndarray:
        """:meth:`emit` of each (slot, hold, rows), ``slots`` ascending: the tracking
        column of all their output rows, slot by slot."""
        parent = np.repeat(holds, counts)
        index = np.arange(len(parent)) - np.repeat(np.cumsum(counts) - counts, counts)
        packed = self.send(np.repeat(np.asarray(slots, np.int64), counts), parent,
                           index.astype(np.uint64), now_ms)
        self.acc.add(self.state_idx, np.asarray(slots, np.int64), holds, -1)
        return packed

    def send(self, slots: np.ndarray, holds: np.ndarray, index: np.ndarray,
             now_ms: int) -> np.ndarray:
        """Output rows at ``slots``, child ``index`` of ``holds``, sent into the
        outbound segment (the holds stay open): their tracking column."""
        child = np.maximum(ID_MASK & child_acks(holds, self.op_id, index),
                           np.uint64(1))  # pack() never makes an id of 0
        self.acc.add(self.out_idx, slots, child, +1)
        return pack(slots, child, self.ref.grid.slot_of(now_ms))

    def close(self) -> None:
        """Send this task's batch and wait for the tracker's confirmation (rule 6)."""
        from pyspark import TaskContext

        from lowtide.spark.sources.log_source import send_task_batch

        tc = TaskContext.get()
        send_task_batch(self.ref, self.in_segment, tc.partitionId() if tc is not None else 0,
                        self.acc)


def next_poll_ms(now_ms: int, poll_ms: int) -> int:
    """When a step with pending outputs looks again (a processing-time timer)."""
    return (now_ms // poll_ms + 1) * poll_ms
