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

from collections.abc import Callable
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
    CHANGELOG_DDL,
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
class Change:
    """One changelog row of a (key, window) ``[start, end)`` (slots)."""

    start: int
    end: int
    values: list[Any]
    version: int
    tombstone: bool
    final: bool


@dataclass(frozen=True)
class Versions:
    """A key's state: its open windows (what a logic folds their rows into, by window
    start) and the version each last showed."""

    panes: dict[int, Any]
    shown: dict[int, Shown]


def show(start: int, end: int, values: list[Any], prev: Shown | None, now_ms: int,
         final: bool) -> tuple[list[Change], Shown | None]:
    """The changes that show ``values`` of ``[start, end)`` after ``prev``: its
    tombstone and the next version, none if an early one would show what ``prev``
    shows; and what the new version shows (None: nothing new).

    >>> show(0, 10, [2], None, 5, False)[0]
    [Change(start=0, end=10, values=[2], version=1, tombstone=False, final=False)]
    >>> [(c.version, c.tombstone, c.values) for c in show(0, 10, [3], Shown(1, 5, [2]), 9,
    ...                                                    False)[0]]
    [(1, True, [2]), (2, False, [3])]
    >>> show(0, 10, [2], Shown(1, 5, [2]), 9, False)
    ([], None)
    """
    if not final and prev is not None and repr(values) == repr(prev.values):
        return [], None  # repr: NaN and Decimals compare as they print
    rows = [] if prev is None else [Change(start, end, prev.values, prev.version, True, False)]
    version = 1 if prev is None else prev.version + 1
    return [*rows, Change(start, end, values, version, False, final)], \
        Shown(version, now_ms, values)


def changelog_step(ends: dict[int, int], values: Callable[[int], list[Any]],
                   shown: dict[int, Shown], done: int, now_ms: int, every_ms: int
                   ) -> tuple[dict[int, Shown], list[Change], list[Change]]:
    """One call's changelog of a key's open windows (``ends``: start -> end): the
    windows ending at or below ``done`` show their final version (``values(start)``),
    the others a new one if it changed and the last is at least ``every_ms`` old.
    Versions come from ``shown`` (the state), never from a counter of the process, so
    a retried call emits the same (rules 5 and 6). Returns (``shown`` of the windows
    left open, final changes, early changes).

    >>> ends, vals = {0: 10, 10: 20}, {0: [3], 10: [1]}.get
    >>> left, out, early = changelog_step(ends, vals, {0: Shown(1, 0, [2])}, 12, 50, 0)
    >>> [(c.start, c.version, c.tombstone, c.final) for c in out + early]
    [(0, 1, True, False), (0, 2, False, True), (10, 1, False, False)]
    >>> left
    {10: Shown(version=1, at_ms=50, values=[1])}
    """
    left = {s: v for s, v in shown.items() if ends.get(s, done) > done}
    out: list[Change] = []
    for start in sorted(s for s, e in ends.items() if e <= done):
        out += show(start, ends[start], values(start), shown.get(start), now_ms, True)[0]
    early: list[Change] = []
    for start in sorted(s for s, e in ends.items() if e > done):
        prev = left.get(start)
        if prev is not None and now_ms - prev.at_ms < every_ms:
            continue  # shown too recently: a later call (a poll) shows the change
        rows, now = show(start, ends[start], values(start), prev, now_ms, False)
        early += rows
        if now is not None:
            left[start] = now
    return left, out, early


def changelog_frame(aggs: tuple[TypedAgg, ...], delta_ms: int, rows: list[Change],
                    as_of: str | None = None) -> Any:
    """The changelog rows of ``rows``, at their windows' last slots, each with its
    child index under that slot's hold (early rows: above the final rows' positions);
    None for none. One DataFrame built at once: it is made per group and call. With
    ``as_of`` (a ``groupBy``'s): the aggregates, then the window's end as ``as_of``."""
    import pandas as pd

    if not rows:
        return None
    starts = np.array([r.start for r in rows], np.int64)
    ends = np.array([r.end for r in rows], np.int64)
    versions = np.array([r.version for r in rows], np.int64)
    gone = np.array([r.tombstone for r in rows], bool)
    values = result_columns(aggs, [r.values for r in rows])
    cols = {**values, as_of: time_column(ends, delta_ms)} if as_of else {
        "window_start": time_column(starts, delta_ms),
        "window_end": time_column(ends, delta_ms), **values}
    return pd.DataFrame({  # plain arrays: no index to align, a third of the cost
        **{k: v.array if isinstance(v, pd.Series) else v for k, v in cols.items()},
        OP_COL: np.where(gone, TOMBSTONE, INSERT).astype(object),
        VERSION_COL: versions, FINAL_COL: np.array([r.final for r in rows], bool),
        AT_COL: ends - 1, CHILD_COL: EARLY_BASE + 2 * versions + gone})


@dataclass(frozen=True)
class SpeculativeLogic:
    """The window logic ``window`` (``agg`` only) with early rows, re-emitted at most
    every ``every_ms`` (0: every batch that changes the window); the runtime of a
    speculative window not planned in Spark's JVM (:mod:`.speculative_plan`)."""

    window: WindowLogic
    every_ms: int = 0

    @property
    def aggs(self) -> tuple[TypedAgg, ...]:
        return self.window.aggs

    def step(self, key: tuple[Any, ...], state: Versions | None, new: Any, done: int,
             parts: RowParts, now_ms: int = 0) -> LogicStep:
        panes: dict[int, Pane] = dict(state.panes) if state else {}
        if new is not None and len(new):
            self.window._absorb(panes, new, [])  # agg only: no row parts
        shown, out, early = changelog_step(
            {s: p.end for s, p in panes.items()},
            lambda s: results(self.aggs, panes[s].aggs or []),
            state.shown if state else {}, done, now_ms, self.every_ms)
        panes = {s: p for s, p in panes.items() if p.end > done}
        wakes = np.array(sorted(p.end - 1 for p in panes.values()), np.int64)
        delta = self.window.delta_ms
        return LogicStep(Versions(panes, shown) if panes else None,
                         changelog_frame(self.aggs, delta, out), wakes,
                         early=changelog_frame(self.aggs, delta, early))


@dataclass(frozen=True)
class SpeculativeSpec(KeyedStep):
    """A window step with early rows: ``window`` its exact description (``agg``),
    ``every_ms`` the least time between two versions of a (key, window) (0: none)."""

    name: str
    window: WindowSpec
    every_ms: int = 0
    #: planned in Spark's JVM where its window would be (:mod:`.speculative_plan`);
    #: False for a sink that takes no update mode (the Python data source sink)
    jvm: bool = True

    def keyed_input(self, df: Any, delta_ms: int) -> tuple[Any, StatefulSpec]:
        w = self.window
        prepared, typed = aggregated_input(df, "window", w.name, w.keys, w.aggs)
        logic = SpeculativeLogic(WindowLogic(w.size_ms // delta_ms, w.slide_ms // delta_ms,
                                             delta_ms, typed), self.every_ms)
        return prepared, StatefulSpec(w.name, w.keys, logic, changelog_schema(w, typed),
                                      w.poll_ms,
                                      what="window", eager=self.every_ms > 0)


def changelog_schema(window: WindowSpec, aggs: tuple[TypedAgg, ...]) -> str:
    """The DDL of a changelog's columns after its keys."""
    return f"{output_schema(window, aggs)}, {CHANGELOG_DDL}"


def aggs_every(what: str, step: Any, every: str | int | None, given: bool) -> int:
    """:func:`checked_every` of a keyed ``agg()`` step (its output: keys, aggregates)
    made speculative; ``given``: it was already (a one-line error)."""
    if given:
        raise ValueError(f"{what}: speculative() is given once")
    return checked_every(what, every, {*step.keys, *(a.out for a in step.aggs)})


def changelog_keyed_step(step: Any, logic: Any, schema: str, what: str, every_ms: int
                         ) -> StatefulSpec:
    """The keyed runtime's step of a speculative ``step`` (name, keys, ``poll_ms``):
    ``logic`` writing its changelog after ``schema``'s columns, eager when ``every_ms``
    bounds how often a version may follow the last."""
    return StatefulSpec(step.name, step.keys, logic, f"{schema}, {CHANGELOG_DDL}",
                        step.poll_ms, what=what, eager=every_ms > 0)


def make_speculative(step: Any, every: str | int | None) -> SpeculativeSpec:
    """``stream.window(...).agg(...).speculative(every=...)``: ``step`` the stream's
    last step, which must be a window's ``agg``; ``every`` None (each batch) or a
    duration."""
    if not isinstance(step, WindowSpec):
        what = f"step {step.name!r}" if step is not None else "the source"
        raise ValueError(f"speculative() follows a window's, session window's or groupBy's "
                         f"agg(), a window's apply(), a stateful() or an outer join, not {what}: "
                         "stream.window(...).agg(...).speculative()")
    return SpeculativeSpec(step.name, step, aggs_every(f"window {step.name!r}", step, every,
                                                       False))


def checked_every(what: str, every: str | int | None, columns: set[str],
                  added: tuple[str, ...] = CHANGELOG_COLS) -> int:
    """``speculative(every=...)`` of the step ``what`` (e.g. "window 'w'") in ms (0:
    each batch), whose output ``columns`` must not take a name of the ``added``
    changelog columns; one-line errors."""
    every_ms = 0 if every is None else duration_ms(every)
    if every_ms < 0:
        raise ValueError(f"{what}: speculative(every={every!r}) must be >= 0")
    taken = sorted(set(added) & columns)
    if taken:
        raise ValueError(f"{what}: column {taken[0]!r} is a changelog column "
                         f"({', '.join(added)}): rename it")
    return every_ms
