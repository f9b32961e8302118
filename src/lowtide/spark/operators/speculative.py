"""Early results, then exact ones: a window that emits provisional rows while its input
is still arriving, each cancelled by a tombstone when it changes, and marks its last
row final exactly when the window is complete (rule 13).

::

    changes = (stream.window("10 seconds", key="user").agg(n="count")
               .speculative(every="2 seconds"))    # a changelog; every=None: each batch

The output is a *changelog*: the window's columns (keys, ``window_start``,
``window_end``, the aggregates) and

* ``op``: ``"insert"`` (a version of the (key, window)) or ``"tombstone"`` (cancels
  the version with the same key, window and ``version``; its other columns repeat
  the row it cancels);
* ``version``: 1, 2, ... per (key, window), in the order they were emitted;
* ``is_final``: the last version, emitted once the window is complete (never
  cancelled, never followed by another version). Its values equal the exact window's.

Each micro-batch that changes a (key, window)'s result (and at most once every
``every``) emits the tombstone of the previous version (if any) and the new version,
both at the window's last slot ``end - 1``, children of the hold the window keeps
there (rule 7), so they are tracked items like any other: a downstream min time past
``end - 1`` covers every version and every tombstone of the window, and the final
row is the one that releases the hold. Versions come from the group's state in the
store, so a retried task or a batch re-run after a restart emits the same versions
with the same acks (rules 5 and 6): nothing is duplicated or skipped.

Worked example (size 10 slots, ``count``, every batch): rows at slots 3 and 7 with
``done = 2``: early ``insert v1 n=2`` at slot 9 (the hold at 9 opens and stays open).
A row at slot 8 with ``done = 5``: early ``tombstone v1 n=2``, ``insert v2 n=3``.
A call with ``done = 12``: out ``tombstone v2 n=3``, ``insert v3 n=3 final`` at slot 9
(the hold at 9 is released).

Reading it: :func:`lowtide.spark.sinks.changelog.apply_changelog` folds a changelog
into the latest row per (key, window); :func:`~lowtide.spark.sinks.changelog.finals`
keeps the exact output (final rows only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.spark.operators.keyed_state import KeyedStep, StatefulSpec
from lowtide.spark.operators.slot_logic import AT_COL, CHILD_COL, LogicStep, RowParts
from lowtide.spark.operators.window_aggs import (
    TypedAgg,
    aggregated_input,
    result_columns,
    results,
    time_column,
)
from lowtide.spark.operators.window_state import Pane, WindowLogic, output_schema
from lowtide.spark.operators.windows import WindowSpec, duration_ms
from lowtide.spark.sinks.changelog import (
    CHANGELOG_COLS,
    FINAL_COL,
    INSERT,
    OP_COL,
    TOMBSTONE,
    VERSION_COL,
)

#: early rows' child indices under their hold: above any final row's position
EARLY_BASE = 1 << 40


@dataclass(frozen=True)
class Shown:
    """The version of a (key, window) last emitted: its number, when (the batch's ms)
    and its values (what its tombstone repeats)."""

    version: int
    at_ms: int
    values: list[Any]


@dataclass(frozen=True)
class Versions:
    """A key's state: its open windows (:class:`.window_state.Pane`) and the version
    each last showed, by window start."""

    panes: dict[int, Pane]
    shown: dict[int, Shown]


@dataclass(frozen=True)
class SpeculativeLogic:
    """The window logic ``window`` (``agg`` only) with early rows, re-emitted at most
    every ``every_ms`` (0: every batch that changes the window)."""

    window: WindowLogic
    every_ms: int = 0

    @property
    def aggs(self) -> tuple[TypedAgg, ...]:
        return self.window.aggs

    def step(self, key: tuple[Any, ...], state: Versions | None, new: Any, done: int,
             parts: RowParts, now_ms: int = 0) -> LogicStep:
        panes = dict(state.panes) if state else {}
        shown = dict(state.shown) if state else {}
        if new is not None and len(new):
            self.window._absorb(panes, new, [])  # agg only: no row parts
        out: list[tuple[Pane, list[Any], int, bool, bool]] = []
        for start in sorted(s for s, p in panes.items() if p.end <= done):
            self._change(out, panes.pop(start), shown.pop(start, None), now_ms, True)
        early: list[tuple[Pane, list[Any], int, bool, bool]] = []
        for start in sorted(panes):
            prev = shown.get(start)
            if prev is not None and now_ms - prev.at_ms < self.every_ms:
                continue  # shown too recently: a later call (a poll) shows the change
            now = self._change(early, panes[start], prev, now_ms, False)
            if now is not None:
                shown[start] = now
        wakes = np.array(sorted(p.end - 1 for p in panes.values()), np.int64)
        return LogicStep(Versions(panes, shown) if panes else None, self._rows(out),
                         wakes, early=self._rows(early))

    def _change(self, rows: list[tuple[Pane, list[Any], int, bool, bool]], pane: Pane,
                prev: Shown | None, now_ms: int, final: bool) -> Shown | None:
        """Append the tombstone of ``prev`` and ``pane``'s next version to ``rows``
        (pane, values, version, is tombstone, is final) unless an early one would
        show what ``prev`` shows; what the new version shows, or None."""
        values = results(self.aggs, pane.aggs or [])
        if not final and prev is not None and repr(values) == repr(prev.values):
            return None  # repr: NaN and Decimals compare as they print
        if prev is not None:
            rows.append((pane, prev.values, prev.version, True, False))
        version = 1 if prev is None else prev.version + 1
        rows.append((pane, values, version, False, final))
        return Shown(version, now_ms, values)

    def _rows(self, rows: list[tuple[Pane, list[Any], int, bool, bool]]) -> Any:
        """The changelog rows of ``rows``, at their windows' last slots, each with its
        child index (early rows: above the final rows' positions). One DataFrame built
        at once: it is made per group and call."""
        import pandas as pd

        if not rows:
            return None
        starts = np.array([r[0].start for r in rows], np.int64)
        ends = np.array([r[0].end for r in rows], np.int64)
        versions = np.array([r[2] for r in rows], np.int64)
        gone = np.array([r[3] for r in rows], bool)
        cols = {"window_start": time_column(starts, self.window.delta_ms),
                "window_end": time_column(ends, self.window.delta_ms),
                **result_columns(self.aggs, [r[1] for r in rows])}
        return pd.DataFrame({  # plain arrays: no index to align, a third of the cost
            **{k: v.array if isinstance(v, pd.Series) else v for k, v in cols.items()},
            OP_COL: np.where(gone, TOMBSTONE, INSERT).astype(object),
            VERSION_COL: versions, FINAL_COL: np.array([r[4] for r in rows], bool),
            AT_COL: ends - 1, CHILD_COL: EARLY_BASE + 2 * versions + gone})


@dataclass(frozen=True)
class SpeculativeSpec(KeyedStep):
    """A window step with early rows: ``window`` its exact description (``agg``),
    ``every_ms`` the least time between two versions of a (key, window) (0: none)."""

    name: str
    window: WindowSpec
    every_ms: int = 0

    def keyed_input(self, df: Any, delta_ms: int) -> tuple[Any, StatefulSpec]:
        w = self.window
        prepared, typed = aggregated_input(df, "window", w.name, w.keys, w.aggs)
        logic = SpeculativeLogic(WindowLogic(w.size_ms // delta_ms, w.slide_ms // delta_ms,
                                             delta_ms, typed), self.every_ms)
        schema = f"{output_schema(w, typed)}, {OP_COL} string, {VERSION_COL} bigint, " \
                 f"{FINAL_COL} boolean"
        return prepared, StatefulSpec(w.name, w.keys, logic, schema, w.poll_ms,
                                      what="window", eager=self.every_ms > 0)


def make_speculative(step: Any, every: str | int | None) -> SpeculativeSpec:
    """``stream.window(...).agg(...).speculative(every=...)``: ``step`` the stream's
    last step, which must be a window's ``agg``; ``every`` None (each batch) or a
    duration."""
    if not isinstance(step, WindowSpec):
        what = f"step {step.name!r}" if step is not None else "the source"
        raise ValueError(f"speculative() follows a window's agg(), not {what}: "
                         "stream.window(...).agg(...).speculative()")
    if step.fn is not None:
        raise ValueError(f"window {step.name!r}: speculative() needs agg(); apply() runs "
                         "once per complete window")
    every_ms = 0 if every is None else duration_ms(every)
    if every_ms < 0:
        raise ValueError(f"window {step.name!r}: speculative(every={every!r}) must be >= 0")
    taken = set(CHANGELOG_COLS) & {*step.keys, *(a.out for a in step.aggs)}
    if taken:
        raise ValueError(f"window {step.name!r}: column {sorted(taken)[0]!r} is a changelog "
                         "column (op, version, is_final): rename it")
    return SpeculativeSpec(step.name, step, every_ms)
