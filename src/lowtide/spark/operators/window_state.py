"""The exact window's runtime: the ``transformWithStateInPandas`` processor that
holds a (key, window) on the state clock (:mod:`.state_clock`) and emits it once its
inbound segment is complete, and the DataFrame plan of a window step. The description
and its rules are in :mod:`.windows`."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.spark.operators.keyed_state import GROUP_COL, key_json, key_values
from lowtide.spark.operators.state_clock import (
    StateClock,
    check_keys,
    from_ipc,
    hold_ack,
    hold_as_i64,
    insert_keys,
    next_poll_ms,
    to_ipc,
    use_rocksdb,
)
from lowtide.spark.operators.window_aggs import (
    TypedAgg,
    bind_aggs,
    helper_columns,
    input_columns,
    merge,
    partial,
    result_series,
    results,
)
from lowtide.spark.operators.windows import WindowSpec
from lowtide.spark.tracking.column import TRACK_COL, TRACKING_COLS
from lowtide.spark.tracking.transport import TrackerRef

# ------------------------------------------------------------------ windows


def window_starts(times: np.ndarray, size: int, slide: int) -> np.ndarray:
    """(rows, size // slide) start slots of the windows each row belongs to."""
    base = (times // slide) * slide
    return base[:, None] - slide * np.arange(size // slide, dtype=np.int64)[None, :]


# ------------------------------------------------------------------ runtime


@dataclass(frozen=True)
class WindowRuntime:
    """What the processor needs on the executors (pickled with it)."""

    spec: WindowSpec
    ref: TrackerRef
    out_segment: str
    op_id: int
    key_types: tuple[str, ...]  # DDL types of the key columns
    aggs: tuple[TypedAgg, ...]  # bound to the input's types (agg)
    data_cols: tuple[str, ...]  # the user's columns (apply: what fn sees)

    @property
    def in_segment(self) -> str:
        return self.spec.name

    @property
    def size(self) -> int:
        return self.spec.size_ms // self.ref.grid.delta_ms

    @property
    def slide(self) -> int:
        return self.spec.slide_ms // self.ref.grid.delta_ms

    def output_schema(self) -> str:
        s = self.spec
        cols = [f"`{k}` {t}" for k, t in zip(s.keys, self.key_types, strict=True)]
        cols += ["window_start timestamp", "window_end timestamp"]
        cols += [f"`{a.agg.out}` {a.out_type()}" for a in self.aggs]
        if s.fn_schema:
            cols.append(s.fn_schema)
        return ", ".join([*cols, f"{TRACK_COL} long"])


# per (key, window): its hold, the parts of its rows kept for apply, the aggregates'
# partial states (pickled: see window_aggs)
STATE_SCHEMA = "hold long, parts int, aggs binary"


def processor_class() -> type:
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class WindowProcessor(StatefulProcessor):  # type: ignore[misc]
        def __init__(self, rt: WindowRuntime) -> None:
            self.rt = rt

        def init(self, handle: Any) -> None:
            from pyspark import TaskContext

            self.handle = handle
            self.live = TaskContext.get() is not None
            self.state = handle.getMapState("win", "start long", STATE_SCHEMA)
            # the key as its rows have it (Spark's key is its JSON: see build_window)
            self.key = handle.getValueState("key", "data binary")
            self.rows = (handle.getMapState("rows", "start long, part int", "data binary")
                         if self.rt.spec.fn is not None else None)
            rt = self.rt
            self.clock = StateClock(rt.ref, rt.in_segment, rt.out_segment, rt.op_id)

        # -------------------------------------------------- input
        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            import pandas as pd

            frames = [df for df in rows if len(df)]
            if frames:
                df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
                # the batch's timestamp: the same reference in every attempt
                now_ms = int(timerValues.getCurrentProcessingTimeInMs())
                times, ids = self.clock.receive(df[TRACK_COL].to_numpy(np.int64), now_ms)
                if not self.key.exists():
                    self.key.update((pickle.dumps(key_values(df, self.rt.spec.keys)),))
                self._absorb(key, df.drop(columns=[GROUP_COL]), times, ids)
            yield from self._emit(key, timerValues)

        def handleExpiredTimer(self, key: Any, timerValues: Any,
                               expiredTimerInfo: Any) -> Iterator[Any]:
            yield from self._emit(key, timerValues)

        def _absorb(self, kv: Any, df: Any, times: np.ndarray, ids: np.ndarray) -> None:
            rt = self.rt
            starts = window_starts(times, rt.size, rt.slide)
            for j in range(starts.shape[1]):
                col = starts[:, j]
                for start in np.unique(col).tolist():
                    mine = col == start
                    self._add_window(kv, int(start), df[mine], times[mine], ids[mine])

        def _add_window(self, kv: Any, start: int, sel: Any, times: np.ndarray,
                        ids: np.ndarray) -> None:
            """Open the (key, window)'s hold if it is new; fold the rows in."""
            rt = self.rt
            k = (start,)
            if self.state.containsKey(k):
                v = list(self.state.getValue(k))
            else:
                hold = hold_ack(rt.op_id, kv, start)
                self.clock.open_hold(start + rt.size - 1, hold)
                v = [hold_as_i64(hold), 0, None]
            if rt.aggs:
                part = partial(rt.aggs, sel, times, ids)
                old = None if v[2] is None else pickle.loads(bytes(v[2]))
                v[2] = pickle.dumps(part if old is None else merge(rt.aggs, old, part))
            if self.rows is not None:
                self.rows.updateValue((start, int(v[1])), (to_ipc(sel[list(rt.data_cols)]),))
                v[1] += 1
            self.state.updateValue(k, tuple(v))

        # -------------------------------------------------- output
        def _emit(self, kv: Any, timerValues: Any) -> Iterator[Any]:
            import pandas as pd

            rt = self.rt
            now = int(timerValues.getCurrentProcessingTimeInMs())
            starts = sorted(int(k[0]) for k in self.state.keys())  # noqa: SIM118 (MapState)
            if not starts:
                return
            values = pickle.loads(bytes(self.key.get()[0]))
            done_below = self.clock.complete_below(now)
            ready = [s for s in starts if s + rt.size <= done_below]
            if len(ready) < len(starts):
                self.handle.registerTimer(next_poll_ms(now, rt.spec.poll_ms))
            if not ready:
                return
            delta = rt.ref.grid.delta_ms
            out: list[Any] = []
            for start in ready:
                v = self.state.getValue((start,))
                hold = int(np.array([v[0]], np.int64).view(np.uint64)[0])
                end = start + rt.size
                res = self._results(v, start)
                m = len(res)
                packed = self.clock.emit(end - 1, hold, m, now)
                insert_keys(res, rt.spec.keys, values)
                for i, ms in enumerate((start * delta, end * delta)):
                    res.insert(len(values) + i, ("window_start", "window_end")[i],
                               pd.to_datetime(pd.Series([ms] * m), unit="ms", utc=True))
                res[TRACK_COL] = packed
                out.append(res)
                self.state.removeKey((start,))
                if self.rows is not None:
                    for p in range(int(v[1])):
                        self.rows.removeKey((start, p))
            if len(ready) == len(starts):  # no window left: the key is gone
                self.key.clear()
            yield pd.concat(out, ignore_index=True)

        def _results(self, v: Any, start: int) -> Any:
            """The window's result rows (without keys and bounds)."""
            import pandas as pd

            rt = self.rt
            if rt.spec.fn is None:
                values = results(rt.aggs, pickle.loads(bytes(v[2])))
                return pd.DataFrame(result_series(rt.aggs, values, 1))
            assert self.rows is not None
            parts = [self.rows.getValue((start, p))[0] for p in range(int(v[1]))]
            pdf = from_ipc(parts)
            pdf = pd.DataFrame() if pdf is None else pdf
            res = rt.spec.fn(pdf)
            res = res if isinstance(res, pd.DataFrame) else pd.DataFrame([res])
            return res.reset_index(drop=True)

        def close(self) -> None:
            if self.live:
                self.clock.close()

    return WindowProcessor


def build_window(df: Any, spec: WindowSpec, ref: TrackerRef, out_segment: str,
                 op_id: int) -> Any:
    """The DataFrame plan of a window step: groupBy(the keys' JSON)
    .transformWithStateInPandas.
    Unknown columns and unsupported types raise here, before the query starts."""
    use_rocksdb(df.sparkSession)
    fields = {f.name: f.dataType.simpleString() for f in df.schema.fields
              if f.name not in TRACKING_COLS}
    check_keys(f"window {spec.name!r}", spec.keys, fields)
    aggs, columns = bind_aggs(spec.name, spec.aggs, fields)
    rt = WindowRuntime(spec, ref, out_segment, op_id, tuple(fields[k] for k in spec.keys),
                       aggs, tuple(fields))
    proc = processor_class()(rt)
    prepared = input_columns(df, columns, fields)
    if spec.fn is None:  # the processor reads only these: fewer columns cross to pandas
        prepared = prepared.select(*[f"`{c}`" for c in [*spec.keys, *helper_columns(columns)]],
                                   TRACK_COL)
    # grouped by the keys' JSON: PySpark 4.2 mixes a nullable long key's groups
    grouped = prepared.withColumn(GROUP_COL, key_json(spec.keys, fields, null_if_null=False)
                                  ).groupBy(GROUP_COL)
    return grouped.transformWithStateInPandas(
        statefulProcessor=proc, outputStructType=rt.output_schema(), outputMode="Append",
        timeMode="ProcessingTime",
    )
