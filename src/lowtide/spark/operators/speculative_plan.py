"""Speculative windows planned in Spark's JVM (rule 13): Spark aggregates, lowtide
versions. The changelog is that of :mod:`.speculative`; what differs is where the
window's rows go.

::

    rows, received and stamped by their senders            (window_input)
         .groupBy(keys, window).agg(...)   in update mode   (window_plan, in the JVM)
         --> each batch: the (key, window)s whose values changed, one row each
         .groupBy(bucket of keys).transformWithStateInPandas (ChangelogLogic)
         --> tombstone of the last version, the new version; the final once complete

Spark's own aggregation keeps each (key, window)'s partial aggregates (partial
aggregation before the shuffle, state in the state store, as the exact window's plan:
:mod:`.window_plan`), and in update mode hands on, per micro-batch, only the
(key, window)s that batch changed, with their new values. Only those cross into
Python, where :class:`ChangelogLogic` keeps per (key, window) the latest values and
the version last shown (:class:`.speculative.Shown`), and emits the changelog
(:func:`.speculative.changelog_step`): versions come from that state, so a retried
task or a batch re-run after a restart emits the same versions (rules 5 and 6).

Where the window is the query's last step, the changelog step runs on the driver, in the
sink's ``foreachBatch``, with the same :class:`ChangelogLogic` over every key
(:mod:`.speculative_driver`): the plan below ends at the aggregation's changed rows.
Otherwise (steps after the window, or a checkpoint that already ran it) it is the keyed
runtime's step below.

Buckets: the keyed step's cost is per group and batch (the processor's state reads
and writes, its timer, each a round trip to the JVM), not per row, so it groups the
keys into one bucket per shuffle partition (:func:`.keyed_state.shuffle_buckets`: the
checkpoint's number, fixed for the query's life as Spark's is), each bucket named so
that Spark's hash partitioning gives it a partition of its own
(:func:`bucket_labels`): one call per task and batch, whatever the number of keys.
A key's identity in its bucket is its JSON (``lt_key``), as Spark compares keys.

Tracking: the senders receive the rows out of the window's inbound segment ``S_in``
(and stamp them: Spark's watermark, under the ``max`` policy, evicts a window's
aggregation state once it is complete). Within the batch that received a window's
rows, the query's watermark hold (:mod:`.window_hold`) keeps the outbound segment at
or below every window not complete at the last watermark; from that batch on, the
keyed runtime's hold at the window's last slot does, until its final version is sent
(rule 7). Every version and tombstone is a child of that hold (rule 13). The final is
emitted once ``S_in``'s min time at the batch's timestamp passes the window's end:
every row of the window was received by an earlier batch, whose update this logic has.

Two stateful operators in one query: Spark's check for rows a first operator emits
"late" for a second one is off for the query (:data:`SPECULATIVE_CONFS`): the second
one here keeps no event-time state and drops nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from lowtide.core.acks import child_acks
from lowtide.spark.operators.joins import KEY_COL
from lowtide.spark.operators.keyed_state import (
    StatefulSpec,
    bucket_labels,
    key_json,
    key_rows,
    shuffle_buckets,
)
from lowtide.spark.operators.slot_logic import CHILD_COL, SLOT_COL, LogicStep, RowParts
from lowtide.spark.operators.speculative import (
    Change,
    SpeculativeSpec,
    Versions,
    changelog_frame,
    changelog_schema,
    changelog_step,
)
from lowtide.spark.operators.state_clock import insert_key_rows, key_hash
from lowtide.spark.operators.window_aggs import (
    VALID_PREFIX,
    VALUE_PREFIX,
    TypedAgg,
    bind_aggs,
    helper_columns,
    input_columns,
)
from lowtide.spark.operators.window_plan import (
    WATERMARK_CONFS,
    QueryWindows,
    build_window_plan,
    input_fields,
)
from lowtide.spark.operators.windows import WindowSpec
from lowtide.spark.tracking.column import TRACK_COL
from lowtide.spark.tracking.key_ranges import RANGE_HI, RANGE_LO
from lowtide.spark.tracking.transport import TrackerRef

#: session confs a query with a speculative window in the JVM starts with
SPECULATIVE_CONFS = (*WATERMARK_CONFS,
                     ("spark.sql.streaming.statefulOperator.checkCorrectness.enabled", "false"))


def window_values(aggs: tuple[TypedAgg, ...], frame: Any) -> list[list[Any]]:
    """Each row's aggregate values (as :func:`.window_aggs.results` gives them: ints,
    floats, Decimals, ns for timestamps, None for null) from the columns
    :func:`.window_aggs.input_columns` made of the aggregates' outputs."""
    cols = []
    for j, a in enumerate(aggs):
        kind = TypedAgg(a.agg, j, a.out_type()).kind
        col = frame[f"{VALUE_PREFIX}{j}"]
        if kind == "int":
            values = col.to_numpy(np.int64).tolist()
        elif kind == "float":
            values = col.to_numpy(np.float64).tolist()
        elif kind == "timestamp":
            values = col.to_numpy("datetime64[ns]").view(np.int64).tolist()
        else:
            values = col.to_numpy(object).tolist()
        valid = frame[f"{VALID_PREFIX}{j}"].to_numpy(bool).tolist()
        cols.append([v if ok else None for v, ok in zip(values, valid, strict=True)])
    return [list(r) for r in zip(*cols, strict=True)] if cols else []


#: a bucket's state: key -> (the key's values, its windows' :class:`.speculative.Versions`)
KeyVersions = dict[str, tuple[tuple[Any, ...], Versions]]


@dataclass(frozen=True)
class ChangelogLogic:
    """A speculative window's changelog over Spark's running values, for a bucket of
    keys: ``new`` rows are (key, window)s whose values changed this batch (``keys``
    and :data:`KEY_COL`; :data:`SLOT_COL`: the window's last slot; the values as
    :func:`window_values` reads them). State: :data:`KeyVersions`, per key
    :class:`.speculative.Versions` with ``panes`` start -> (end, latest values). The
    bucket's holds are one per slot, shared by its keys' windows ending there; an early
    row's child index mixes its key's hash in, so that the keys' indices differ.

    Worked example (size 10 slots, ``count``, every batch): ``(last 9, n 2)`` with
    ``done = 2``: early ``insert v1 n=2`` at slot 9 (its hold opens). ``(last 9, n 3)``
    with ``done = 5``: early ``tombstone v1 n=2``, ``insert v2 n=3``. No row with
    ``done = 12``: out ``tombstone v2 n=3``, ``insert v3 n=3 final`` (the hold is
    released)."""

    aggs: tuple[TypedAgg, ...]
    size: int  # slots
    delta_ms: int
    every_ms: int = 0
    keys: tuple[str, ...] = ("k",)

    def step(self, key: tuple[Any, ...], state: KeyVersions | None, new: Any, done: int,
             parts: RowParts, now_ms: int = 0) -> LogicStep:
        held, news = dict(state or {}), self._by_key(new)
        left: KeyVersions = {}
        out: list[tuple[str, tuple[Any, ...], Change]] = []
        early: list[tuple[str, tuple[Any, ...], Change]] = []
        for kid in sorted(held.keys() | news.keys()):
            if kid not in news and self._unchanged(held[kid][1], done):
                left[kid] = held[kid]
                continue
            values = held[kid][0] if kid in held else news[kid][0]
            versions, o, e = self._key_step(held[kid][1] if kid in held else None,
                                            news[kid][1] if kid in news else [], done, now_ms)
            out += [(kid, values, c) for c in o]
            early += [(kid, values, c) for c in e]
            if versions is not None:
                left[kid] = (values, versions)
        wakes = np.array(sorted({end - 1 for _, v in left.values()
                                 for end, _ in v.panes.values()}), np.int64)
        return LogicStep(left or None, self._frame(out), wakes, early=self._frame(early))

    def _by_key(self, new: Any) -> dict[str, tuple[tuple[Any, ...], list[tuple[int, list[Any]]]]]:
        """The changed rows by key: (its key's values, [(window's last slot, values)]),
        read in one pass over the frame (a pandas group per key costs more than the
        logic, with many keys)."""
        if new is None or not len(new):
            return {}
        kids = new[KEY_COL].astype(str).tolist()
        lasts = new[SLOT_COL].to_numpy(np.int64).tolist()
        rows: dict[str, list[tuple[int, list[Any]]]] = {}
        first: dict[str, int] = {}
        for i, (kid, last, values) in enumerate(zip(kids, lasts, window_values(self.aggs, new),
                                                    strict=True)):
            first.setdefault(kid, i)
            rows.setdefault(kid, []).append((last, values))
        keys = key_rows(new, self.keys, list(first.values()))
        return {kid: (k, rows[kid]) for kid, k in zip(first, keys, strict=True)}

    def _unchanged(self, state: Versions, done: int) -> bool:
        """Would a key without new rows change nothing: no window complete, and every
        change shown (each is, at once, without ``every``)?"""
        return self.every_ms == 0 and all(end > done for end, _ in state.panes.values())

    def _key_step(self, state: Versions | None, new: list[tuple[int, list[Any]]], done: int,
                  now_ms: int) -> tuple[Versions | None, list[Change], list[Change]]:
        """One key's windows: its state after the call, its final and early changes."""
        latest: dict[int, tuple[int, list[Any]]] = dict(state.panes) if state else {}
        for last, values in new:
            latest[last + 1 - self.size] = (last + 1, values)
        shown, out, early = changelog_step(
            {s: end for s, (end, _) in latest.items()},
            lambda s: latest[s][1], state.shown if state else {}, done, now_ms, self.every_ms)
        latest = {s: v for s, v in latest.items() if v[0] > done}
        return (Versions(latest, shown) if latest else None), out, early

    def _frame(self, rows: list[tuple[str, tuple[Any, ...], Change]]) -> Any:
        """The changelog rows of ``rows`` with their keys' columns; None for none."""
        frame = changelog_frame(self.aggs, self.delta_ms, [c for _, _, c in rows])
        if frame is None:
            return None
        hashes = {kid: key_hash(kid) for kid, _, _ in rows}
        mixed = np.array([hashes[kid] for kid, _, _ in rows], np.uint64)
        frame[CHILD_COL] = child_acks(mixed, 0, frame[CHILD_COL].to_numpy(np.uint64))
        insert_key_rows(frame, self.keys, [values for _, values, _ in rows])
        return frame


def changed_rows(df: Any, w: WindowSpec, windows: QueryWindows, ref: TrackerRef,
                 op_id: int, ranges: dict[int, int] | None = None
                 ) -> tuple[Any, tuple[TypedAgg, ...], dict[str, str]]:
    """(the (key, window)s each micro-batch changes, with their values as
    :class:`ChangelogLogic` reads them, the window's aggregates, the input's fields):
    Spark's aggregation in update mode (:func:`.window_plan.build_window_plan`; with
    ``ranges``, each row also has its rows' key ranges), whose hold joins
    ``windows.holds``, which the query moves."""
    from pyspark.sql import functions as F

    from lowtide.spark.operators.window_hold import WatermarkHold
    assert windows.checkpoint is not None
    delta = ref.grid.delta_ms
    hold = WatermarkHold(ref, w.name, op_id, windows.checkpoint)
    values = build_window_plan(df, w, ref, op_id, hold, None, ranges).drop(TRACK_COL)
    fields = input_fields(df, f"window {w.name!r}")
    aggs, _ = bind_aggs(w.name, w.aggs, fields)
    outs = [a.agg.out for a in aggs]
    last = F.floor(F.unix_millis(F.col("window_end")) / F.lit(delta)).cast("long") - 1
    prepared = input_columns(values, outs, {a.agg.out: a.out_type() for a in aggs}).select(
        *[F.col(f"`{k}`") for k in w.keys], last.alias(SLOT_COL),
        key_json(w.keys, fields, null_if_null=False).alias(KEY_COL), *helper_columns(outs),
        *[F.col(c) for c in (RANGE_LO, RANGE_HI) if ranges is not None])
    windows.holds.append(hold)
    return prepared, aggs, fields


def keys_ddl(keys: tuple[str, ...], fields: dict[str, str]) -> str:
    return ", ".join(f"`{k}` {fields[k]}" for k in keys)


def build_speculative_plan(df: Any, spec: SpeculativeSpec, windows: QueryWindows,
                           ref: TrackerRef, out_segment: str, op_id: int) -> Any:
    """The DataFrame of a speculative window planned in the JVM (see the module
    docstring); its hold joins ``windows.holds``, which the query moves."""
    from lowtide.spark.operators.speculative_driver import ChangelogStore, DriverChangelog
    from lowtide.spark.operators.state_processor import build_keyed

    assert windows.checkpoint is not None
    w = spec.window
    prepared, aggs, fields = changed_rows(df, w, windows, ref, op_id)
    logic = ChangelogLogic(aggs, w.size_ms // ref.grid.delta_ms, ref.grid.delta_ms,
                           spec.every_ms, w.keys)
    if windows.driver_step == spec.name and ChangelogStore.usable(windows.checkpoint,
                                                                  spec.name):
        ddl = f"{keys_ddl(w.keys, fields)}, {changelog_schema(w, aggs)}, {TRACK_COL} long"
        windows.changelogs.append(DriverChangelog(spec.name, logic, ddl, ref,
                                                  out_segment, op_id, windows.checkpoint,
                                                  eager=spec.every_ms > 0))
        return prepared
    buckets = shuffle_buckets(df.sparkSession, windows.checkpoint)
    keyed = StatefulSpec(w.name, w.keys, logic, changelog_schema(w, aggs), w.poll_ms,
                         buckets, what="window", eager=spec.every_ms > 0, received=True,
                         row_parts=False)
    return build_keyed(prepared, keyed, ref, out_segment, op_id,
                       labels=bucket_labels(df.sparkSession, buckets))


def update_mode(windows: QueryWindows) -> bool:
    """Does a query whose windows ``windows`` planned hold a speculative window planned
    in the JVM, or a window whose results a driver step emits (its aggregation runs in
    update mode, with :data:`SPECULATIVE_CONFS`)?"""
    return bool(windows.changelogs) or any(
        isinstance(s, SpeculativeSpec) and s.jvm and windows.in_jvm(s.window)
        for s in windows.stateful)


def on_keyed_runtime(stream: Any) -> Any:
    """``stream`` with its speculative windows on the keyed runtime: for a sink that
    takes no update mode (Spark refuses it for a Python data source's writer)."""
    steps = tuple(replace(s, jvm=False) if isinstance(s, SpeculativeSpec) else s
                  for s in stream.steps)
    return replace(stream, steps=steps,
                   inputs=tuple(on_keyed_runtime(s) for s in stream.inputs))
