"""The exact window as a slot logic (:mod:`.slot_logic`) on the keyed runtime
(:mod:`.keyed_state`), and the DataFrame plan of a window step. The description and
its rules are in :mod:`.windows`, the typed aggregates in :mod:`.window_aggs`.

A key's state is its open windows, each a :class:`Pane` (its bounds, the aggregates'
partial states, for ``apply`` how many parts of rows it stored); a pane's wake, where
its hold sits, is its last slot ``end - 1``. A call folds the new rows into their
panes (one partial per (pane, call), merged into the pane's; for ``apply`` the rows
appended as one part tagged with the pane's start, written once, not with the state)
and emits every pane whose ``end`` is at or below ``done``, one row per pane
(``apply``: ``fn``'s rows) at slot ``end - 1``.

Worked example (size 10 slots, ``count``): rows at slots 3, 7 and 12 arrive with
``done = 2``: panes ``[0, 10)`` (2 rows) and ``[10, 20)`` (1), wakes ``[9, 19]``. A
timer call with ``done = 15``: out ``(window_start 0, n 2)`` at slot 9, wakes
``[19]``.

Session windows (their bounds move as rows arrive, panes merge) change only how rows
are folded into panes (:meth:`WindowLogic._absorb`): a merged pane's new ``end`` moves
its wake, and the runtime moves the hold.

A window with ``key_ranges`` (rule 15) runs on buckets (one per shuffle partition, so
one call per task and batch): :class:`BucketWindows` steps the keys of one key range
of a bucket, all with that range's min time; the runtime keeps each range's wakes and
holds apart (:meth:`.state_processor.SlotProcessor._run`). A bucket's rows are grouped by
key once, here; the runtime finds a key with rows of two ranges in the ranges' kept
keys after the step (:func:`.slot_logic.key_in_two_ranges`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from lowtide.spark.operators.keyed_state import (
    StatefulSpec,
    bucket_labels,
    key_groups,
    shuffle_buckets,
)
from lowtide.spark.operators.slot_logic import AT_COL, ID_COL, SLOT_COL, LogicStep, RowParts
from lowtide.spark.operators.state_clock import check_keys, hold_as_i64, insert_keys, key_hash
from lowtide.spark.operators.window_aggs import (
    TypedAgg,
    bind_aggs,
    helper_columns,
    input_columns,
    merge,
    partial,
    result_columns,
    results,
)
from lowtide.spark.operators.windows import WindowSpec
from lowtide.spark.tracking.column import TRACK_COL, TRACKING_COLS
from lowtide.spark.tracking.key_ranges import RANGE_COL, require_front
from lowtide.spark.tracking.transport import TrackerRef


def window_starts(times: np.ndarray, size: int, slide: int) -> np.ndarray:
    """(rows, size // slide) start slots of the windows each row belongs to."""
    base = (times // slide) * slide
    return base[:, None] - slide * np.arange(size // slide, dtype=np.int64)[None, :]


@dataclass(frozen=True)
class Pane:
    """One open (key, window): ``[start, end)`` in slots, its hold at ``end - 1``."""

    start: int
    end: int
    aggs: list[Any] | None = None  # the aggregates' partial states (agg)
    parts: int = 0  # apply: how many parts of its rows (with SLOT_COL, ID_COL) it has


@dataclass(frozen=True)
class WindowLogic:
    """Tumbling and sliding windows (``size`` and ``slide`` in slots) over one key;
    ``aggs`` (agg) or ``fn`` (apply, over ``data_cols``). State: ``{start: Pane}``."""

    size: int
    slide: int
    delta_ms: int
    aggs: tuple[TypedAgg, ...] = ()
    fn: Any = None
    data_cols: tuple[str, ...] = ()

    def step(self, key: tuple[Any, ...], state: dict[int, Pane] | None, new: Any, done: int,
             parts: RowParts, now_ms: int = 0) -> LogicStep:
        panes = dict(state or {})
        appends: list[tuple[int, int, Any]] = []
        if new is not None and len(new):
            self._absorb(panes, new, appends)
        ready = [panes.pop(s) for s in sorted(s for s, p in panes.items() if p.end <= done)]
        out = self._results(ready, parts, appends) if ready else None
        wakes = np.array(sorted(p.end - 1 for p in panes.values()), np.int64)
        fresh = [a[0] for a in appends]
        stored = [(p.start, p.parts - fresh.count(p.start)) for p in ready]
        return LogicStep(panes or None, out, wakes, tuple(a for a in appends if a[0] in panes),
                         tuple(d for d in stored if d[1]))

    def _absorb(self, panes: dict[int, Pane], new: Any, appends: list[tuple[int, int, Any]]
                ) -> None:
        """Fold ``new`` rows into their panes (new panes for new windows); ``apply``:
        their rows into ``appends``."""
        times = new[SLOT_COL].to_numpy(np.int64)
        ids = new[ID_COL].to_numpy(np.int64)
        starts = window_starts(times, self.size, self.slide)
        for j in range(starts.shape[1]):
            col = starts[:, j]
            for start in np.unique(col).tolist():
                mine = col == start
                whole = bool(mine.all())
                rows = new if whole else new[mine]
                pane = panes.get(start) or Pane(start, start + self.size)
                if self.aggs:
                    part = partial(self.aggs, rows, times if whole else times[mine],
                                   ids if whole else ids[mine])
                    pane = replace(pane, aggs=part if pane.aggs is None else merge(
                        self.aggs, pane.aggs, part))
                if self.fn is not None:
                    appends.append((start, pane.parts, rows[[*self.data_cols, SLOT_COL,
                                                             ID_COL]]))
                    pane = replace(pane, parts=pane.parts + 1)
                panes[start] = pane

    def _results(self, panes: list[Pane], parts: RowParts,
                 appends: list[tuple[int, int, Any]]) -> Any:
        """The output rows of complete ``panes`` (ascending): the window's bounds, its
        aggregates or ``fn``'s rows, :data:`AT_COL`."""
        import pandas as pd

        if self.fn is None:
            res = pd.DataFrame(result_columns(self.aggs, [results(self.aggs, p.aggs or [])
                                                          for p in panes]))
            counts = np.ones(len(panes), np.int64)
        else:
            outs = [self._apply(p, parts, [a[2] for a in appends if a[0] == p.start])
                    for p in panes]
            counts = np.array([len(o) for o in outs], np.int64)
            # as objects: pandas leaves an all-null column out of the dtype it picks, so a
            # window's null beside another's long would make the longs floats (rounded
            # above 2^53)
            res = pd.concat([o.astype(object) for o in outs], ignore_index=True) \
                if len(outs) > 1 else pd.concat(outs, ignore_index=True)
        bounds = {}
        for name, at in (("window_start", [p.start for p in panes]),
                         ("window_end", [p.end for p in panes])):
            ms = np.repeat(np.array(at, np.int64) * self.delta_ms, counts)
            bounds[name] = pd.to_datetime(pd.Series(ms), unit="ms", utc=True)
        res = pd.concat([pd.DataFrame(bounds), res], axis=1)
        res[AT_COL] = np.repeat(np.array([p.end - 1 for p in panes], np.int64), counts)
        return res

    def _apply(self, pane: Pane, parts: RowParts, fresh: list[Any]) -> Any:
        """``fn``'s rows for one window: its rows (stored parts, then ``fresh`` ones of
        this call) in (slot, ack id) order."""
        import pandas as pd

        rows = pd.concat([*parts.read(pane.start, pane.parts - len(fresh)), *fresh],
                         ignore_index=True)
        order = np.lexsort((rows[ID_COL].to_numpy(), rows[SLOT_COL].to_numpy()))
        rows = rows.iloc[order].drop(columns=[SLOT_COL, ID_COL]).reset_index(drop=True)
        res = self.fn(rows)
        res = res if isinstance(res, pd.DataFrame) else pd.DataFrame([res])
        return res.reset_index(drop=True)


class KeyParts:
    """One key's row parts inside its bucket's (:class:`.slot_logic.RowParts`): its
    tags mixed with the key, so that the keys of a bucket never share a part."""

    def __init__(self, parts: RowParts, key: tuple[Any, ...]) -> None:
        self.parts, self.key = parts, key

    def tag(self, tag: int) -> int:
        return hold_as_i64(key_hash((self.key, tag)))

    def read(self, tag: int, count: int) -> list[Any]:
        return self.parts.read(self.tag(tag), count)


@dataclass(frozen=True)
class BucketWindows:
    """A :class:`WindowLogic` over a bucket of keys that share one ``done`` (the keys
    of one key range): state ``{key: its panes}``; each key with new rows or a pane
    at or below ``done`` is stepped, its outputs get its key columns."""

    window: WindowLogic
    keys: tuple[str, ...]

    def step(self, key: tuple[Any, ...], state: dict[tuple[Any, ...], Any] | None, new: Any,
             done: int, parts: RowParts, now_ms: int = 0) -> LogicStep:
        import pandas as pd

        panes = dict(state or {})
        rows = {}
        if new is not None and len(new):
            found, at = key_groups(new, self.keys)
            rows = {k: new.iloc[i].reset_index(drop=True) for k, i in zip(found, at,
                                                                         strict=True)}
        outs, appends, drops = [], [], []
        for k in sorted(set(panes) | set(rows), key=lambda k: key_hash(k)):
            mine = panes.get(k)
            if k not in rows and min(p.end for p in (mine or {}).values()) > done:
                continue  # nothing new, nothing complete: its panes stay as they are
            own = KeyParts(parts, k)
            res = self.window.step(k, mine, rows.get(k), done, own, now_ms)
            if res.state is None:
                panes.pop(k, None)
            else:
                panes[k] = res.state
            if res.out is not None and len(res.out):
                insert_keys(res.out, self.keys, k)
                outs.append(res.out.astype(object))
            appends += [(own.tag(t), i, r) for t, i, r in res.appends]
            drops += [(own.tag(t), n) for t, n in res.drops]
        out = None if not outs else outs[0] if len(outs) == 1 else pd.concat(
            outs, ignore_index=True)
        wakes = np.array(sorted({p.end - 1 for ps in panes.values() for p in ps.values()}),
                         np.int64)
        return LogicStep(panes or None, out, wakes, tuple(appends), tuple(drops))


def output_schema(spec: WindowSpec, aggs: tuple[TypedAgg, ...]) -> str:
    """The DDL of a window's output columns after its keys."""
    cols = ["window_start timestamp", "window_end timestamp"]
    cols += [f"`{a.agg.out}` {a.out_type()}" for a in aggs]
    if spec.fn_schema:
        cols.append(spec.fn_schema)
    return ", ".join(cols)


def build_window(df: Any, spec: WindowSpec, ref: TrackerRef, out_segment: str,
                 op_id: int, checkpoint: str | None = None) -> Any:
    """The DataFrame plan of a window step: a keyed step (:func:`.build_keyed`) whose
    logic is a :class:`WindowLogic` (with ``key_ranges``: a :class:`BucketWindows` per
    range, over a bucket per shuffle partition of the query whose ``checkpoint`` it is).
    Unknown columns and unsupported types raise here, before the query starts."""
    fields = {f.name: f.dataType.simpleString() for f in df.schema.fields
              if f.name not in TRACKING_COLS}
    check_keys(f"window {spec.name!r}", spec.keys, fields)
    aggs, columns = bind_aggs(spec.name, spec.aggs, fields)
    delta = ref.grid.delta_ms
    logic = WindowLogic(spec.size_ms // delta, spec.slide_ms // delta, delta, aggs, spec.fn,
                        tuple(fields))
    if spec.key_ranges:
        require_front(f"window {spec.name!r}", fields)
    prepared = input_columns(df, columns, fields)
    if spec.fn is None:  # the logic reads only these: fewer columns cross to pandas
        ranged = [RANGE_COL] if spec.key_ranges and RANGE_COL not in spec.keys else []
        prepared = prepared.select(*[f"`{c}`" for c in [*spec.keys, *helper_columns(columns),
                                                          *ranged]], TRACK_COL)
    from lowtide.spark.operators.state_processor import build_keyed  # pyspark's processor

    if not spec.key_ranges:
        return build_keyed(prepared, StatefulSpec(
            spec.name, spec.keys, logic, output_schema(spec, aggs), spec.poll_ms,
            what="window"), ref, out_segment, op_id)
    spark = df.sparkSession
    check_layout(spec.name, checkpoint)
    buckets = shuffle_buckets(spark, checkpoint)
    keyed = StatefulSpec(spec.name, spec.keys, BucketWindows(logic, spec.keys),
                         output_schema(spec, aggs), spec.poll_ms, buckets, what="window",
                         key_ranges=spec.key_ranges)
    return build_keyed(prepared, keyed, ref, out_segment, op_id, bucket_labels(spark, buckets))


def check_layout(name: str, checkpoint: str | None) -> None:
    """Refuse, in one line, a checkpoint of a key-range window that kept its state per
    key (before its keys were grouped into buckets): its state would not be found."""
    from pathlib import Path

    schemas = Path(checkpoint).glob("state/*/_stateSchema/*/*") if checkpoint else []
    if any(b"key_range" in f.read_bytes() for f in schemas if f.is_file()):
        raise ValueError(f"window {name!r}: checkpoint {checkpoint} keeps key-range windows "
                         "per key (lowtide before 0.2's buckets); start from a new checkpoint")
