"""Keyed state in global time order, on the state clock: a user's own exact stateful
step (``stream.stateful``), and the runtime joins are built on.

::

    def running(key, rows, total):          # one key's rows of one complete slot
        total = (total or 0) + len(rows)
        return total, pandas.DataFrame({"n": [total]})

    counts = stream.stateful(running, "n long", key="user", name="running")

The contract: for each key, ``fn(key, rows, state) -> (state, out)`` is called once
per slot (``delta_ms`` of global time) that has rows of the key, in ascending slot
order, once the step's inbound segment is complete below that slot; ``rows`` (a
pandas DataFrame of the stream's columns, tracking columns left out) are ALL the
key's rows of the slot, in a fixed order (by ack id). ``state`` is what the previous
call returned for the key (None at first; return None to drop it); it lives in the
state store and survives restarts from the checkpoint. ``out`` (a DataFrame with the
columns of ``schema``, or None) are output rows at that slot, after the key columns.
So the output equals a batch fold over the key's rows sorted by slot, whatever the
micro-batches, lags and retries were; ``fn`` must be deterministic (Spark re-runs
tasks). Until a slot's call has run, its rows are pending state: a hold at the slot
keeps the min time of everything downstream at or below it (rule 7).

How it runs: ``groupBy(lt_group).transformWithStateInPandas`` with ``lt_group`` the
keys' JSON (:func:`key_json`: never a null grouping key), or, for a step that is
vectorised over keys (a join), ``pmod(xxhash64(keys), buckets)``: one call per group
(a key or a bucket of keys) and batch. A group keeps its rows in ONE state value
(Arrow IPC), each row with its slot, its ack id and its *wake*: the slot of the hold
it keeps open (its own slot when it arrives; -1 once it only waits to be looked back
at). A hold is open in the state
segment at every slot some row wakes at (one hold per (group, slot), opened when
the slot's first row arrives). Each call (:func:`step_group`) hands ALL the group's
rows to the :class:`SlotLogic` at once with :meth:`.StateClock.complete_below`
(``done``); the logic resolves every wake below ``done`` (its outputs at slots below
``done``, the rows' new wakes at or above ``done``, or -1) and returns the rows to
keep; then, in slot order, each released hold's outputs are sent as its children and
the hold is released, in the same batch. Every output at slot ``t`` has a hold open
at or below ``t`` until then (the logic's part of the bargain: a pair at its later
row's slot, an outer row at the wake its row opened).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from lowtide.spark.operators.state_clock import (
    StateClock,
    check_keys,
    from_ipc,
    hold_as_i64,
    holds_under,
    insert_keys,
    key_hash,
    next_poll_ms,
    state_segment,
    to_ipc,
    use_rocksdb,
)
from lowtide.spark.tracking.column import TRACK_COL, TRACKING_COLS, as_u64
from lowtide.spark.tracking.transport import TrackerRef

# the runtime's columns of a group's rows (a Spark column starting with "_" is renamed
# on its way into transformWithStateInPandas, hence the lt_ prefix)
SLOT_COL = "lt_slot"  # the row's slot
ID_COL = "lt_id"  # its ack id (a fixed order within a slot)
WAKE_COL = "lt_wake"  # the slot of the hold it keeps open, -1 for none
RUNTIME_COLS = (SLOT_COL, ID_COL, WAKE_COL)
AT_COL = "lt_at"  # an output row's slot (a logic's output only)
# what the runtime groups by: a join's bucket of keys, or the exact key as JSON (never
# a null key: PySpark 4.2 hands a null grouping key's rows out one per call and mixed
# another key's rows into its state in our tests)
GROUP_COL = "lt_group"


class UserState(Protocol):
    """A group's own value (``stream.stateful``'s ``state``), kept by the processor."""

    def get_state(self) -> Any: ...

    def set_state(self, value: Any) -> None: ...


class SlotLogic(Protocol):
    """A group's step: ``rows`` (sorted by slot, then ack id) are all the group's kept
    and new rows, with :data:`RUNTIME_COLS`; every wake below ``done`` must be resolved.
    Returns (output rows with :data:`AT_COL`, each below ``done``, or None; the rows to
    keep, each wake -1 or at least ``done``)."""

    def run(self, key: tuple[Any, ...], rows: Any, done: int, user: UserState
            ) -> tuple[Any, Any]: ...


@dataclass(frozen=True)
class FoldLogic:
    """A user's ``fn(key, rows, state) -> (state, out)``: see the module docstring."""

    fn: Callable[[Any, Any, Any], tuple[Any, Any]]
    name: str

    def run(self, key: tuple[Any, ...], rows: Any, done: int, user: UserState
            ) -> tuple[Any, Any]:
        import pandas as pd

        slots = rows[SLOT_COL].to_numpy()
        data = rows.drop(columns=list(RUNTIME_COLS))
        out = []
        for s in np.unique(slots[slots < done]):
            res = self.fn(key, data[slots == s].reset_index(drop=True), user.get_state())
            if not (isinstance(res, tuple) and len(res) == 2):
                raise ValueError(f"stateful {self.name!r}: fn must return (state, rows or None)")
            user.set_state(res[0])
            if res[1] is not None and len(res[1]):
                out.append(res[1].reset_index(drop=True).assign(**{AT_COL: int(s)}))
        return (pd.concat(out, ignore_index=True) if out else None), rows[slots >= done]


@dataclass(frozen=True)
class StatefulSpec:
    """A keyed step of a :class:`lowtide.spark.pipeline.stream.Stream` (``stateful``,
    or a join's): ``buckets`` > 0 groups the keys into that many buckets."""

    name: str
    keys: tuple[str, ...]
    logic: SlotLogic
    schema: str  # DDL of the output columns after the keys
    poll_ms: int = 100
    buckets: int = 0

    def segments(self) -> list[str]:
        return [self.name, state_segment(self.name)]


@dataclass
class GroupStep:
    """What one call of a group does (:func:`step_group`)."""

    out: Any  # output rows, sorted by AT_COL (None: none)
    kept: Any  # the rows to keep (None: none)
    opens: np.ndarray  # slots whose holds open now
    releases: np.ndarray  # slots whose holds are released now, ascending
    counts: np.ndarray  # output rows at each released slot
    waiting: bool = field(default=False)  # holds still open after this call


def wakes_of(rows: Any) -> np.ndarray:
    """The slots of the holds ``rows`` keep open (ascending, unique)."""
    if rows is None or not len(rows):
        return np.zeros(0, np.int64)
    w = rows[WAKE_COL].to_numpy(np.int64)
    return np.unique(w[w >= 0])


def step_group(logic: SlotLogic, key: tuple[Any, ...], kept: Any, new: Any, done: int,
               user: UserState) -> GroupStep:
    """One call of a group: ``kept`` its rows so far, ``new`` the rows that arrived
    (with :data:`RUNTIME_COLS`, wake = slot), ``done`` the inbound segment's min time
    at the batch. Pure: the processor and the tests drive it."""
    import pandas as pd

    before = wakes_of(kept)
    parts = [p for p in (kept, new) if p is not None and len(p)]
    rows = None if not parts else parts[0] if len(parts) == 1 else pd.concat(
        parts, ignore_index=True)
    out = None
    if rows is not None:
        order = np.lexsort((rows[ID_COL].to_numpy(), rows[SLOT_COL].to_numpy()))
        rows = rows.iloc[order].reset_index(drop=True)
        w = rows[WAKE_COL].to_numpy()
        if ((w >= 0) & (w < done)).any():
            out, rows = logic.run(key, rows, done, user)
            _check(out, rows, done)
    after = wakes_of(rows)
    at = np.zeros(0, np.int64) if out is None else out[AT_COL].to_numpy(np.int64)
    if out is not None and len(at):
        out = out.iloc[np.argsort(at, kind="stable")].reset_index(drop=True)
        at = np.sort(at)
    times, n = np.unique(at, return_counts=True)
    arriving = wakes_of(new)
    opens = np.setdiff1d(np.union1d(np.union1d(arriving, after), times), before)
    releases = np.setdiff1d(np.union1d(before, opens), after)
    counts = np.zeros(len(releases), np.int64)
    counts[np.searchsorted(releases, times)] = n
    kept_rows = rows if rows is not None and len(rows) else None
    return GroupStep(out, kept_rows, opens, releases, counts, bool(len(after)))


def _check(out: Any, rows: Any, done: int) -> None:
    """Fail closed on a logic that breaks its contract (:class:`SlotLogic`)."""
    if out is not None and len(out) and int(out[AT_COL].max()) >= done:
        raise RuntimeError(f"an output at slot {int(out[AT_COL].max())} >= {done}, "
                           "which the inbound segment has not completed")
    w = rows[WAKE_COL].to_numpy() if rows is not None else np.zeros(0)
    if ((w >= 0) & (w < done)).any():
        raise RuntimeError(f"a wake below {done} left unresolved")


@dataclass(frozen=True)
class KeyedRuntime:
    """What the processor needs on the executors (pickled with it)."""

    spec: StatefulSpec
    ref: TrackerRef
    out_segment: str
    op_id: int
    key_types: tuple[str, ...]

    def output_schema(self) -> str:
        cols = [f"`{k}` {t}" for k, t in zip(self.spec.keys, self.key_types, strict=True)]
        return ", ".join([*cols, self.spec.schema, f"{TRACK_COL} long"])


def processor_class() -> type:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class KeyedProcessor(StatefulProcessor):  # type: ignore[misc]
        def __init__(self, rt: KeyedRuntime) -> None:
            self.rt = rt

        def init(self, handle: Any) -> None:
            from pyspark import TaskContext

            rt = self.rt
            self.handle = handle
            self.live = TaskContext.get() is not None
            self.rows = handle.getValueState("rows", "data binary")
            self.user = handle.getValueState("user", "data binary")
            self.parent = handle.getValueState("parent", "key_hash long")
            self.clock = StateClock(rt.ref, rt.spec.name, rt.out_segment, rt.op_id)

        # UserState, for the logic
        def get_state(self) -> Any:
            v = self.user.get()
            return None if v is None else pickle.loads(bytes(v[0]))

        def set_state(self, value: Any) -> None:
            if value is None:
                self.user.clear()
            else:
                self.user.update((pickle.dumps(value),))

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            import pandas as pd

            now = int(timerValues.getCurrentProcessingTimeInMs())
            frames = [df for df in rows if len(df)]
            new = None
            if frames:
                df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
                times, ids = self.clock.receive(df[TRACK_COL].to_numpy(np.int64), now)
                drop = [c for c in (*TRACKING_COLS, GROUP_COL) if c in df.columns]
                new = df.drop(columns=drop).assign(**{
                    SLOT_COL: times, ID_COL: ids.astype(np.int64), WAKE_COL: times})
            yield from self._run(key, new, now)

        def handleExpiredTimer(self, key: Any, timerValues: Any,
                               expiredTimerInfo: Any) -> Iterator[Any]:
            yield from self._run(key, None, int(timerValues.getCurrentProcessingTimeInMs()))

        def _run(self, key: Any, new: Any, now: int) -> Iterator[Any]:
            """One call of the group: :func:`step_group`, then its acks and outputs."""
            rt = self.rt
            v = self.rows.get()
            kept = None if v is None else from_ipc([v[0]])
            if new is None and not len(wakes_of(kept)):
                return
            # the key as the rows have it (Spark's key is the group column here)
            values = tuple(key) if rt.spec.buckets else key_values(
                new if new is not None else kept, rt.spec.keys)
            step = step_group(rt.spec.logic, values, kept, new,
                              self.clock.complete_below(now), self)
            parent = self._hold_parent(key)
            if len(step.opens):
                self.clock.open_holds(step.opens, holds_under(rt.op_id, parent, step.opens))
            packed = self.clock.emit_slots(step.releases,
                                           holds_under(rt.op_id, parent, step.releases),
                                           step.counts, now)
            if new is not None or len(step.releases):
                if step.kept is None:  # no row, so no hold is open: the group is gone
                    self.rows.clear()
                    self.parent.clear()
                else:
                    self.rows.update((to_ipc(step.kept),))
            if step.waiting:
                self.handle.registerTimer(next_poll_ms(now, rt.spec.poll_ms))
            if step.out is not None and len(step.out):
                res = step.out.drop(columns=[AT_COL])
                if not rt.spec.buckets:
                    insert_keys(res, rt.spec.keys, values)
                res[TRACK_COL] = packed
                yield res

        def _hold_parent(self, key: Any) -> int:
            """The key's hash its holds descend from, kept from the group's first call:
            Spark hands the same key as ``(3,)`` or ``(3.0,)``, ``None`` or ``nan``,
            depending on the path (rows or timer) and on nulls in the batch, so a hold
            recomputed at its release would differ from the one opened (rule 1)."""
            v = self.parent.get()
            if v is not None:
                return int(as_u64(np.array([v[0]], np.int64))[0])
            parent = key_hash(tuple(key))
            self.parent.update((hold_as_i64(parent),))
            return parent

        def close(self) -> None:
            if self.live:
                self.clock.close()

    return KeyedProcessor


def key_values(rows: Any, keys: tuple[str, ...]) -> tuple[Any, ...]:
    """A group's key values, from its first row (Python scalars, None for null)."""
    import pandas as pd

    def scalar(v: Any) -> Any:
        if v is None or v is pd.NaT or (isinstance(v, float) and v != v):  # NaN
            return None
        return v.item() if isinstance(v, np.generic) else v

    first = rows.iloc[0]
    return tuple(scalar(first[k]) for k in keys)


def key_json(keys: tuple[str, ...], types: dict[str, str], *, null_if_null: bool) -> Any:
    """The keys as one exact string, as Spark compares them (JSON of their struct; NaN
    equal to NaN, -0.0 made 0.0 by adding 0.0); ``null_if_null``: null when a key is
    null (a join's: SQL's null matches nothing), else a null key is a key like any
    other."""
    from pyspark.sql import functions as F

    cols = [F.col(f"`{k}`") + F.lit(0.0) if types[k] in ("float", "double")
            else F.col(f"`{k}`") for k in keys]
    text = F.to_json(F.struct(*[c.alias(f"k{i}") for i, c in enumerate(cols)]))
    if not null_if_null:
        return text
    any_null = F.greatest(*[F.col(f"`{k}`").isNull() for k in keys]) if len(keys) > 1 \
        else F.col(f"`{keys[0]}`").isNull()
    return F.when(any_null, F.lit(None)).otherwise(text)


def build_keyed(df: Any, spec: StatefulSpec, ref: TrackerRef, out_segment: str,
                op_id: int) -> Any:
    """The DataFrame plan of a keyed stateful step: ``groupBy(keys)`` (or the keys'
    bucket) ``.transformWithStateInPandas``. Unknown key columns raise here, before
    the query starts."""
    from pyspark.sql import functions as F

    use_rocksdb(df.sparkSession)
    fields = {f.name: f.dataType.simpleString() for f in df.schema.fields
              if f.name not in TRACKING_COLS}
    check_keys(f"stateful {spec.name!r}", spec.keys, fields)
    taken = sorted(set(fields) & {*RUNTIME_COLS, AT_COL, GROUP_COL})
    if taken:
        raise ValueError(f"stateful {spec.name!r}: column {taken[0]!r} is a name lowtide "
                         "uses: rename it (with_column / select)")
    rt = KeyedRuntime(spec, ref, out_segment, op_id, tuple(fields[k] for k in spec.keys))
    if spec.buckets:
        keys = [F.col(f"`{k}`") for k in spec.keys]
        df = df.withColumn(GROUP_COL, F.pmod(F.xxhash64(*keys), F.lit(spec.buckets)))
    else:
        df = df.withColumn(GROUP_COL, key_json(spec.keys, fields, null_if_null=False))
    return df.groupBy(GROUP_COL).transformWithStateInPandas(
        statefulProcessor=processor_class()(rt), outputStructType=rt.output_schema(),
        outputMode="Append", timeMode="ProcessingTime",
    )
