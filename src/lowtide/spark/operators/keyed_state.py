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

How it runs: ``groupBy(keys).transformWithStateInPandas``. A slot's rows are kept
(Arrow IPC, MapState) with a hold opened into the state segment at the slot when its
first rows arrive; when :meth:`.StateClock.complete_below` is above the slot, the step
runs, its outputs are sent as children of the hold at the slot, and the hold is
released, in the same batch. A :class:`SlotLogic` may keep processed rows for
``keep_slots`` more slots (a join looks back at them) and ask to be called again at a
later slot (``wakes``: a hold is opened there at once; a left outer join decides
there that a row has no match).
"""

from __future__ import annotations

import heapq
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from lowtide.spark.operators.state_clock import (
    StateClock,
    check_keys,
    from_ipc,
    hold_ack,
    hold_as_i64,
    insert_keys,
    next_poll_ms,
    state_segment,
    to_ipc,
    use_rocksdb,
)
from lowtide.spark.tracking.column import TRACK_COL, TRACKING_COLS
from lowtide.spark.tracking.transport import TrackerRef


class History(Protocol):
    """What a step sees besides its slot's rows (the processor, for one key)."""

    def kept(self, lo: int, hi: int) -> list[tuple[int, Any]]:
        """The processed rows still kept of slots ``lo .. hi`` (inclusive): (slot,
        DataFrame) in slot order."""

    def get_state(self) -> Any: ...

    def set_state(self, value: Any) -> None: ...


class SlotLogic(Protocol):
    """One key's step at one complete slot: (output rows or None, wake slots)."""

    keep_slots: int

    def step(self, key: tuple[Any, ...], slot: int, rows: Any, seen: History
             ) -> tuple[Any, list[int]]: ...


@dataclass(frozen=True)
class FoldLogic:
    """A user's ``fn(key, rows, state) -> (state, out)``: see the module docstring."""

    fn: Callable[[Any, Any, Any], tuple[Any, Any]]
    name: str
    keep_slots: int = 0

    def step(self, key: tuple[Any, ...], slot: int, rows: Any, seen: History
             ) -> tuple[Any, list[int]]:
        res = self.fn(key, rows, seen.get_state())
        if not (isinstance(res, tuple) and len(res) == 2):
            raise ValueError(f"stateful {self.name!r}: fn must return (state, rows or None)")
        seen.set_state(res[0])
        return res[1], []


@dataclass(frozen=True)
class StatefulSpec:
    """A ``stream.stateful`` step of a :class:`lowtide.spark.pipeline.stream.Stream`."""

    name: str
    keys: tuple[str, ...]
    logic: SlotLogic
    schema: str  # DDL of the output columns after the keys
    poll_ms: int = 100

    def segments(self) -> list[str]:
        return [self.name, state_segment(self.name)]


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


# per slot of a key: its hold (0 once processed), how many row parts it keeps
SLOT_SCHEMA = "hold long, parts int"


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
            self.slots = handle.getMapState("slots", "slot long", SLOT_SCHEMA)
            self.rows = handle.getMapState("rows", "slot long, part int", "data binary")
            self.user = handle.getValueState("user", "data binary")
            self.clock = StateClock(rt.ref, rt.spec.name, rt.out_segment, rt.op_id)

        # the key's slots, read from the state store once per call (each read is a
        # round trip to the JVM): slot -> (hold, parts), and the rows decoded so far
        def _load(self) -> None:
            self._entries = {int(k[0]): (int(v[0]), int(v[1]))
                             for k, v in self.slots.iterator()}
            self._frames: dict[int, Any] = {}

        def _rows_of(self, slot: int) -> Any:
            if slot not in self._frames:
                parts = self._entries[slot][1]
                self._frames[slot] = from_ipc([self.rows.getValue((slot, p))[0]
                                               for p in range(parts)])
            return self._frames[slot]

        def _set(self, slot: int, hold: int, parts: int) -> None:
            self._entries[slot] = (hold, parts)
            self.slots.updateValue((slot,), (hold, parts))

        # History, for the logic
        def kept(self, lo: int, hi: int) -> list[tuple[int, Any]]:
            return [(s, self._rows_of(s)) for s in sorted(self._entries)
                    if lo <= s <= hi and self._entries[s][0] == 0 and self._entries[s][1] > 0]

        def get_state(self) -> Any:
            v = self.user.get() if self.user.exists() else None
            return None if v is None else pickle.loads(bytes(v[0]))

        def set_state(self, value: Any) -> None:
            if value is None:
                self.user.clear()
            else:
                self.user.update((pickle.dumps(value),))

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            import pandas as pd

            self._load()
            frames = [df for df in rows if len(df)]
            if frames:
                df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
                now_ms = int(timerValues.getCurrentProcessingTimeInMs())
                times, ids = self.clock.receive(df[TRACK_COL].to_numpy(np.int64), now_ms)
                order = np.lexsort((ids, times))  # a fixed order within a slot: by ack id
                df, times = df.iloc[order].reset_index(drop=True), times[order]
                data = df.drop(columns=[c for c in TRACKING_COLS if c in df.columns])
                bounds = np.flatnonzero(np.diff(times)) + 1
                for lo, hi in zip([0, *bounds], [*bounds, len(times)], strict=True):
                    self._keep(key, int(times[lo]), data.iloc[lo:hi])
            yield from self._run(key, timerValues)

        def handleExpiredTimer(self, key: Any, timerValues: Any,
                               expiredTimerInfo: Any) -> Iterator[Any]:
            self._load()
            yield from self._run(key, timerValues)

        def _open(self, key: Any, slot: int) -> tuple[int, int]:
            """The slot's entry; a new one opens its hold."""
            if slot in self._entries:
                return self._entries[slot]
            hold = hold_ack(self.rt.op_id, key, slot)
            self.clock.open_hold(slot, hold)
            self._set(slot, hold_as_i64(hold), 0)
            return hold_as_i64(hold), 0

        def _keep(self, key: Any, slot: int, rows: Any) -> None:
            hold, parts = self._open(key, slot)
            self.rows.updateValue((slot, parts), (to_ipc(rows.reset_index(drop=True)),))
            self._set(slot, hold, parts + 1)

        def _run(self, key: Any, timerValues: Any) -> Iterator[Any]:
            """Step every pending slot below the complete time, in slot order."""
            now = int(timerValues.getCurrentProcessingTimeInMs())
            if not any(hold != 0 for hold, _ in self._entries.values()):
                return
            done = self.clock.complete_below(now)
            ready = [s for s, (hold, _) in self._entries.items() if hold != 0 and s < done]
            heapq.heapify(ready)
            out: list[Any] = []
            while ready:
                slot = heapq.heappop(ready)
                res = self._step(key, slot, now, ready, done)
                if res is not None:
                    out.append(res)
            self._expire(done)
            if any(hold != 0 for hold, _ in self._entries.values()):
                self.handle.registerTimer(next_poll_ms(now, self.rt.spec.poll_ms))
            if out:
                import pandas as pd

                yield pd.concat(out, ignore_index=True)

        def _step(self, key: Any, slot: int, now: int, ready: list[int], done: int) -> Any:
            import pandas as pd

            rt = self.rt
            hold, parts = self._entries[slot]
            rows = self._rows_of(slot)
            res, wakes = rt.spec.logic.step(tuple(key), slot, rows, self)
            for w in wakes:
                if w not in self._entries:
                    self._open(key, w)
                    if w < done:
                        heapq.heappush(ready, w)
            res = pd.DataFrame() if res is None else res.reset_index(drop=True)
            u_hold = int(np.array([hold], np.int64).view(np.uint64)[0])
            packed = self.clock.emit(slot, u_hold, len(res), now)
            if rt.spec.logic.keep_slots > 0 and parts > 0:
                self._set(slot, 0, parts)  # processed, kept for later steps
            else:
                self._drop(slot, parts)
            if not len(res):
                return None
            insert_keys(res, rt.spec.keys, tuple(key))
            res[TRACK_COL] = packed
            return res

        def _expire(self, done: int) -> None:
            """Drop processed slots no later step can look back at: every later step
            is at a slot >= ``done``."""
            keep = self.rt.spec.logic.keep_slots
            for slot, (hold, parts) in list(self._entries.items()):
                if hold == 0 and slot + keep < done:
                    self._drop(slot, parts)

        def _drop(self, slot: int, parts: int) -> None:
            del self._entries[slot]
            self._frames.pop(slot, None)
            self.slots.removeKey((slot,))
            for p in range(parts):
                self.rows.removeKey((slot, p))

        def close(self) -> None:
            if self.live:
                self.clock.close()

    return KeyedProcessor


def build_keyed(df: Any, spec: StatefulSpec, ref: TrackerRef, out_segment: str,
                op_id: int) -> Any:
    """The DataFrame plan of a keyed stateful step: ``groupBy(keys)
    .transformWithStateInPandas``. Unknown key columns raise here, before the query
    starts."""
    use_rocksdb(df.sparkSession)
    fields = {f.name: f.dataType.simpleString() for f in df.schema.fields
              if f.name not in TRACKING_COLS}
    check_keys(f"stateful {spec.name!r}", spec.keys, fields)
    rt = KeyedRuntime(spec, ref, out_segment, op_id, tuple(fields[k] for k in spec.keys))
    grouped = df.groupBy(*[f"`{k}`" for k in spec.keys])
    return grouped.transformWithStateInPandas(
        statefulProcessor=processor_class()(rt), outputStructType=rt.output_schema(),
        outputMode="Append", timeMode="ProcessingTime",
    )
