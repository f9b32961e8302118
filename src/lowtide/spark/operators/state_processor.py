"""The one ``transformWithStateInPandas`` processor of every exact stateful step
(:mod:`.keyed_state`), the named record it keeps per group, and the plan that runs it
(:func:`build_keyed`). What a step does with
its rows is its slot logic (:mod:`.slot_logic`); this module only moves rows, state
and acks between Spark, the logic and the state clock (:mod:`.state_clock`).

Imported on the executors, and by the driver when it plans a step: it subclasses
PySpark's ``StatefulProcessor``.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StructField,
    StructType,
)

from lowtide.spark.operators.keyed_state import (
    GROUP_COL,
    KeyedRuntime,
    StatefulSpec,
    key_json,
    key_values,
)
from lowtide.spark.operators.slot_logic import (
    AT_COL,
    CHILD_COL,
    ID_COL,
    RUNTIME_COLS,
    SLOT_COL,
    GroupStep,
    Ranges,
    key_in_two_ranges,
    range_order,
    step_ranges,
    two_ranges,
)
from lowtide.spark.operators.state_clock import (
    StateClock,
    check_keys,
    hold_as_i64,
    holds_under,
    insert_keys,
    key_hash,
    next_poll_ms,
    range_parent,
    use_rocksdb,
)
from lowtide.spark.tracking.column import TRACK_COL, TRACKING_COLS, as_u64
from lowtide.spark.tracking.key_ranges import RANGE_COL, row_ranges
from lowtide.spark.tracking.transport import TrackerRef


def _struct(**fields: Any) -> StructType:
    return StructType([StructField(n, t) for n, t in fields.items()])


# the store's schemas: a GroupRecord per group, a logic's row parts per (group, tag,
# index). Typed, not DDL: PySpark asks the JVM to parse a DDL schema, a round trip per
# schema in every task (six a task, 7 ms of a quiet machine's 75)
RECORD_SCHEMA = _struct(parent=LongType(), wakes=ArrayType(LongType()), timer_ms=LongType(),
                        key=BinaryType(), data=BinaryType())
PART_KEY_SCHEMA = _struct(tag=LongType(), part=IntegerType())
PART_SCHEMA = _struct(rows=BinaryType())


@dataclass(frozen=True)
class GroupRecord:
    """A group's state in the store, one value per group."""

    parent: int  # the key hash its holds descend from, fixed at its first call (rule 5)
    key: tuple[Any, ...]  # the key as its rows have it (a bucket: Spark's key)
    wakes: np.ndarray  # the slots of its open holds, ascending
    timer_ms: int  # the processing-time timer it registered last (-1: none)
    data: bytes  # the slot logic's state, pickled (read only when the logic steps)

    def to_row(self) -> tuple[Any, ...]:
        return (hold_as_i64(self.parent), [int(w) for w in self.wakes], self.timer_ms,
                pickle.dumps(self.key), self.data)

    @classmethod
    def of_row(cls, row: tuple[Any, ...]) -> GroupRecord:
        parent = int(as_u64(np.array([row[0]], np.int64))[0])
        return cls(parent, pickle.loads(bytes(row[3])), np.asarray(row[1], np.int64),
                   int(row[2]), bytes(row[4]))


class NoParts:
    """The row parts of a step whose logic keeps none (``StatefulSpec.row_parts``)."""

    def read(self, tag: int, count: int) -> list[Any]:
        raise RuntimeError("a logic declared without row parts read some")

    def write(self, step: GroupStep) -> None:
        if step.appends or step.drops:
            raise RuntimeError("a logic declared without row parts kept some")


class StoredParts:
    """A group's row parts (:class:`.slot_logic.RowParts`) in the state store."""

    def __init__(self, state: Any) -> None:
        self.state = state

    def read(self, tag: int, count: int) -> list[Any]:
        return [pickle.loads(bytes(self.state.getValue((tag, i))[0])) for i in range(count)]

    def write(self, step: GroupStep) -> None:
        for tag, i, rows in step.appends:
            self.state.updateValue((tag, i), (pickle.dumps(rows),))
        for tag, count in step.drops:
            for i in range(count):
                self.state.removeKey((tag, i))


def spark_key(key: Any) -> tuple[Any, ...]:
    """Spark's grouping key as plain Python values (a bucket may come as numpy's)."""
    return tuple(k.item() if isinstance(k, np.generic) else k for k in key)


class SlotProcessor(StatefulProcessor):  # type: ignore[misc]
    """Every stateful step's processor: receive rows, step the group's logic, turn its
    wakes into holds and its outputs into tracked rows (see :mod:`.keyed_state`)."""

    def __init__(self, rt: KeyedRuntime) -> None:
        self.rt = rt

    def init(self, handle: Any) -> None:
        from pyspark import TaskContext

        rt = self.rt
        self.handle = handle
        self.live = TaskContext.get() is not None
        self.record = handle.getValueState("group", RECORD_SCHEMA)
        # each state variable is a round trip to the JVM in every task (its schema,
        # its column family): one a task's logic has no use for is not declared
        self.parts: StoredParts | NoParts = NoParts()
        if rt.spec.row_parts:
            self.parts = StoredParts(handle.getMapState("parts", PART_KEY_SCHEMA,
                                                        PART_SCHEMA))
        self.clock = StateClock(rt.ref, rt.spec.name, rt.out_segment, rt.op_id)
        # (batch ms, the groups whose rows' call stepped them in this batch)
        self._stepped: tuple[int, set[Any]] = (-1, set())

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        import pandas as pd

        now = int(timerValues.getCurrentProcessingTimeInMs())
        frames = [df for df in rows if len(df)]
        df = None if not frames else pd.concat(frames, ignore_index=True) \
            if len(frames) > 1 else frames[0]
        if self._stepped[0] != now:  # a new batch: a new set, added to in place
            self._stepped = (now, set())
        self._stepped[1].add(spark_key(key))
        yield from self._run(key, {} if df is None else self._arrived(df, now), now)

    def handleExpiredTimer(self, key: Any, timerValues: Any,
                           expiredTimerInfo: Any) -> Iterator[Any]:
        now = int(timerValues.getCurrentProcessingTimeInMs())
        if not self.rt.spec.eager and self._stepped[0] == now \
                and spark_key(key) in self._stepped[1]:
            return  # its rows' call of this batch stepped it: every wake is >= done now
        yield from self._run(key, {}, now)

    def _arrived(self, df: Any, now: int) -> dict[int | None, Any]:
        """Receive a group's rows out of the inbound segment: range -> its new rows
        (None: a group without key ranges), with :data:`SLOT_COL` and :data:`ID_COL`."""
        spec, graph = self.rt.spec, self.rt.ref.graph
        if not spec.key_ranges:
            return {None: df.drop(columns=[GROUP_COL]) if spec.received
                    else self._receive(df, now)}
        of = row_ranges(graph, graph.index(spec.name), df[RANGE_COL].to_numpy(np.int64))
        return {r: self._receive(df[of == r].reset_index(drop=True), now, r)
                for r in np.unique(of).tolist()}

    def _receive(self, df: Any, now: int, key_range: int | None = None) -> Any:
        """Receive ``df`` out of the inbound segment (its ``key_range``): its columns
        with :data:`SLOT_COL` and :data:`ID_COL`."""
        times, ids = self.clock.receive(df[TRACK_COL].to_numpy(np.int64), now, key_range)
        drop = [c for c in (*TRACKING_COLS, GROUP_COL) if c in df.columns]
        return df.drop(columns=drop).assign(**{SLOT_COL: times, ID_COL: ids.astype(np.int64)})

    def _run(self, key: Any, new: dict[int | None, Any], now: int) -> Iterator[Any]:
        """One call of a group: step each of its ranges (:func:`.step_ranges`; a group
        without key ranges is one range, None) that got rows or has a wake complete.
        With key ranges (rule 15) the keys of each range of a bucket are stepped with
        that range's min time, with holds of their own, so that a range still open
        keeps its holds whatever the other ranges emit; the record keeps every range's
        wakes and the group's one timer."""
        stored = self.record.get()
        rec = None if stored is None else GroupRecord.of_row(stored)
        if not new and (rec is None or not len(rec.wakes)):
            return
        if rec is None:
            rec = self._new_record(key, new)
        ranges = self._ranges(rec)
        done = self.clock.complete_below(now, sorted({*ranges, *new}, key=range_order))
        ranges, steps = step_ranges(self.rt.spec.logic, rec.key, ranges, new, done, self.parts,
                                    now, self.rt.spec.eager)
        if not steps:  # a timer call with nothing complete: the record is read only
            self._poll(rec.timer_ms, now)
            return
        self._check_ranges(ranges)
        sent = []
        for r, step in steps:
            parent = rec.parent if r is None else range_parent(rec.parent, r)
            sent.append((step, self._acks(parent, step, now), self._early(parent, step, now)))
            self.parts.write(step)
        wakes = np.unique(np.concatenate([np.zeros(0, np.int64),
                                          *[w for w, _ in ranges.values()]]))
        timer = self._poll(rec.timer_ms, now) if len(wakes) else -1
        if ranges:
            data = ranges[None][1] if None in ranges else ranges
            self.record.update(GroupRecord(rec.parent, rec.key, wakes, timer,
                                           pickle.dumps(data)).to_row())
        else:
            self.record.clear()
        for step, packed, early in sent:
            yield from self._rows(rec, step, packed, early)

    def _new_record(self, key: Any, new: dict[int | None, Any]) -> GroupRecord:
        """The record of a group's first call: its key hash, its key as its rows have
        it (a bucket: Spark's key), no wakes, no state."""
        spec, skey = self.rt.spec, spark_key(key)
        values = skey if spec.buckets else key_values(next(iter(new.values())), spec.keys)
        return GroupRecord(key_hash(skey), values, np.zeros(0, np.int64), -1,
                           pickle.dumps({} if spec.key_ranges else None))

    def _ranges(self, rec: GroupRecord) -> Ranges:
        """A record's ranges: with key ranges its ``data`` is them; without, ``data`` is
        the logic's state, range None."""
        data = pickle.loads(rec.data)
        if self.rt.spec.key_ranges:
            return dict(data)
        return {} if data is None else {None: (rec.wakes, data)}

    def _check_ranges(self, ranges: Ranges) -> None:
        """A key with rows of two key ranges would be emitted before one of them is
        complete: refused (the fronts must partition the keys)."""
        spec = self.rt.spec
        twice = key_in_two_ranges(ranges) if spec.key_ranges else None
        if twice is not None:
            raise two_ranges(f"{spec.what} {spec.name!r}", twice[0], twice[1],
                             spec.key_ranges)

    def _rows(self, rec: GroupRecord, step: GroupStep, packed: np.ndarray,
              early: np.ndarray | None) -> Iterator[Any]:
        """A step's output rows, then its provisional ones, with their tracking column."""
        for res in tracked_rows(step, packed, early):
            if not self.rt.spec.buckets:
                insert_keys(res, self.rt.spec.keys, rec.key)
            yield res

    def _acks(self, parent: int, step: GroupStep, now: int) -> np.ndarray:
        return emit_acks(self.clock, self.rt.op_id, parent, step, now)

    def _early(self, parent: int, step: GroupStep, now: int) -> np.ndarray | None:
        return early_acks(self.clock, self.rt.op_id, parent, step, now)

    def _poll(self, registered_ms: int, now: int) -> int:
        """The timer of a group with open holds: the next poll, registered unless it is
        already (a call earlier in this poll period registered it)."""
        at = next_poll_ms(now, self.rt.spec.poll_ms)
        if at != registered_ms:
            self.handle.registerTimer(at)
        return at

    def close(self) -> None:
        if self.live:
            self.clock.close()


def emit_acks(clock: StateClock, op_id: int, parent: int, step: GroupStep,
              now: int) -> np.ndarray:
    """Open a step's new holds, send its outputs as children of their slots' holds and
    release the holds that are gone; the outputs' tracking column."""
    if len(step.opens):
        clock.open_holds(step.opens, holds_under(op_id, parent, step.opens))
    return clock.emit_slots(step.releases, holds_under(op_id, parent, step.releases),
                            step.counts, now)


def early_acks(clock: StateClock, op_id: int, parent: int, step: GroupStep,
               now: int) -> np.ndarray | None:
    """Send a step's provisional rows as children of their slots' holds, which stay
    open (rule 13); their tracking column."""
    if step.early is None:
        return None
    at = step.early[AT_COL].to_numpy(np.int64)
    return clock.send(at, holds_under(op_id, parent, at),
                      step.early[CHILD_COL].to_numpy(np.uint64), now)


def tracked_rows(step: GroupStep, packed: np.ndarray, early: np.ndarray | None
                 ) -> Iterator[Any]:
    """A step's output rows, then its provisional ones, each frame with its tracking
    column and without the logic's own columns."""
    for rows, track in ((step.out, packed), (step.early, early)):
        if rows is not None and len(rows):
            res = rows.drop(columns=[c for c in (AT_COL, CHILD_COL) if c in rows.columns])
            res[TRACK_COL] = track
            yield res


def build_keyed(df: Any, spec: StatefulSpec, ref: TrackerRef, out_segment: str,
                op_id: int, labels: list[int] | None = None) -> Any:
    """The DataFrame plan of a keyed stateful step: ``groupBy(keys)`` (or the keys'
    bucket, named ``labels[bucket]`` if given) ``.transformWithStateInPandas``. Unknown
    key columns raise here, before the query starts."""
    from pyspark.sql import functions as F

    use_rocksdb(df.sparkSession)
    fields = {f.name: f.dataType.simpleString() for f in df.schema.fields
              if f.name not in TRACKING_COLS}
    check_keys(f"{spec.what} {spec.name!r}", spec.keys, fields)
    taken = sorted(set(fields) & {*RUNTIME_COLS, AT_COL, GROUP_COL}
                   - ({SLOT_COL} if spec.received else set()))
    if taken:
        raise ValueError(f"{spec.what} {spec.name!r}: column {taken[0]!r} is a name lowtide "
                         "uses: rename it (with_column / select)")
    rt = KeyedRuntime(spec, ref, out_segment, op_id, tuple(fields[k] for k in spec.keys))
    if spec.buckets:
        keys = [F.col(f"`{k}`") for k in spec.keys]
        bucket = F.pmod(F.xxhash64(*keys), F.lit(spec.buckets))
        if labels is not None:
            named = F.array(*[F.lit(b).cast("long") for b in labels])  # as hashed
            bucket = F.element_at(named, bucket.cast("int") + 1)
        df = df.withColumn(GROUP_COL, bucket)
    else:
        df = df.withColumn(GROUP_COL, key_json(spec.keys, fields, null_if_null=False))
    return df.groupBy(GROUP_COL).transformWithStateInPandas(
        statefulProcessor=SlotProcessor(rt), outputStructType=rt.output_schema(),
        outputMode="Append", timeMode="ProcessingTime",
    )
