"""Exact stream-stream joins over global time, interval or window, on the keyed
state runtime, vectorised over a bucket of keys.

::

    pairs = clicks.join(views, on="user", within="10 seconds")          # inner
    all_clicks = clicks.join(views, on="user", within="10 seconds", how="left")
    per_minute = clicks.join(views, on="user", window="1 minute", how="full")

Interval join: a left row at slot ``a`` and a right row at slot ``b`` with equal keys
(SQL equality: a null key matches nothing) match when ``|a - b| <= within`` (in slots
of ``delta_ms``); a pair is emitted at its later row's slot ``max(a, b)``. Window
join: they match when they are in the same tumbling window of global time (``window``
slots, the first starting at slot 0); a pair is emitted at the window's last slot.
Outer joins (``how="left"`` or ``"full"``): a row that no row of the other side
matched gets one row with nulls for the other side's columns, at ``a + within`` (the
window's last slot), once the other side is complete up to there; not after a guessed
delay. The result rows are the keys, the left columns and the right columns (a column
name on both sides, other than a key, is refused: rename it first).

Exact, with no watermark and nothing dropped as late: both inputs are unioned into
the join's inbound segment (a union: two senders) and grouped into ``buckets`` buckets
of keys (:class:`.keyed_state.StatefulSpec`); each call of a bucket steps ALL its rows
below the inbound segment's min time ``done`` at once (:meth:`JoinLogic.run`): a
pandas merge on the keys, then the match predicate. Rows below ``done`` that were not
stepped yet (their wake is their slot: a hold there) are above every row stepped
before, so the pairs to emit are those with at least one such row, all at slots below
``done``. An interval join keeps stepped rows ``within`` slots for look-back and marks
matched rows (``lt_hit``); an outer row not decided by ``done`` waits with a hold at
``a + within``. A window join keeps a window's rows (their hold moves to the window's
last slot) until ``done`` passes it, then joins the window at once and drops it.
Outputs are sorted by (slot, left row, right row) in the bucket's fixed row order
(slot, ack id), so a retried task emits the same rows with the same acks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.spark.operators.keyed_state import GROUP_COL, StatefulSpec, key_json
from lowtide.spark.operators.slot_logic import (
    AT_COL,
    RUNTIME_COLS,
    SLOT_COL,
    WAKE_COL,
    KeptRows,
    UserState,
)
from lowtide.spark.operators.state_clock import check_keys, state_segment
from lowtide.spark.tracking.column import TRACK_COL, TRACKING_COLS

SIDE_COL = "lt_side"  # 0: a left row, 1: a right row (the join's input only; Spark
# renames a column starting with "_" on its way into transformWithStateInPandas)
HIT_COL = "lt_hit"  # 1: an interval join's row matched a row of the other side
# the keys as the JVM compares them, for the merge: JSON of the key struct, null when a
# key is null (SQL: it matches nothing); pandas would see a nullable long as a float
KEY_COL = "lt_key"
RESERVED = (SIDE_COL, HIT_COL, KEY_COL, AT_COL, GROUP_COL, *RUNTIME_COLS)
HOWS = ("inner", "left", "full")
BUCKETS = 8  # per join; fixed, as the state is kept per bucket across restarts


@dataclass(frozen=True)
class JoinSpec:
    """A join step (the first step of a stream whose inputs are its two sides):
    ``within_ms`` for an interval join, ``window_ms`` (> 0) for a window join."""

    name: str
    keys: tuple[str, ...]
    within_ms: int
    how: str
    poll_ms: int = 100
    window_ms: int = 0

    def segments(self) -> list[str]:
        return [self.name, state_segment(self.name)]


def check_join(name: str, within_ms: int | None, how: str, delta_ms: int,
               window_ms: int | None = None) -> None:
    """Raises a one-line error for a join the description cannot track."""
    if how not in HOWS:
        hint = " (b.join(a, how='left') is a right join)" if how == "right" else ""
        raise ValueError(f"join {name!r}: how={how!r}: use one of {', '.join(HOWS)}{hint}")
    if (within_ms is None) == (window_ms is None):
        raise ValueError(f"join {name!r}: give exactly one of within= (an interval join) "
                         "and window= (a window join)")
    if within_ms is not None and (within_ms < 0 or within_ms % delta_ms):
        raise ValueError(f"join {name!r}: within={within_ms} ms must be a non-negative "
                         f"multiple of delta_ms={delta_ms}")
    if window_ms is not None and (window_ms <= 0 or window_ms % delta_ms):
        raise ValueError(f"join {name!r}: window={window_ms} ms must be a positive "
                         f"multiple of delta_ms={delta_ms}")


@dataclass(frozen=True)
class JoinLogic:
    """A bucket's join step (:class:`.slot_logic.RowLogic`); see the module
    docstring. ``window`` > 0 (slots): a window join, else an interval join."""

    keys: tuple[str, ...]
    left_cols: tuple[str, ...]
    right_cols: tuple[str, ...]
    within: int  # slots
    how: str
    window: int = 0  # slots

    def run(self, key: tuple[Any, ...], rows: Any, done: int, user: UserState
            ) -> tuple[Any, Any]:
        if self.window:
            return self._windows(rows, done)
        return self._intervals(rows, done)

    def _intervals(self, rows: Any, done: int) -> tuple[Any, Any]:
        w = self.within
        if HIT_COL not in rows.columns:
            rows[HIT_COL] = np.zeros(len(rows), np.int8)
        rows[HIT_COL] = rows[HIT_COL].fillna(0).astype(np.int8)
        slot = rows[SLOT_COL].to_numpy(np.int64)
        wake = rows[WAKE_COL].to_numpy(np.int64)
        fresh = (wake == slot) & (slot < done)  # rows stepped now
        # new pairs have a fresh row: fresh left x all right, then old left x fresh right
        below = slot < done
        li, ri = self._matches(rows, fresh, below, (below & ~fresh, fresh))
        hit = rows[HIT_COL].to_numpy(np.int8).copy()
        hit[li] = 1
        hit[ri] = 1
        rows[HIT_COL] = hit
        outer = self._outer_side(rows) & (fresh | (wake > slot))
        decided = outer & (slot + w < done)
        lone = np.flatnonzero(decided & (hit == 0))
        out = self._output(rows, li, ri, np.maximum(slot[li], slot[ri]), lone, slot[lone] + w)
        new_wake = np.where(fresh | decided, -1, wake)
        new_wake[outer & ~decided] = (slot + w)[outer & ~decided]
        rows[WAKE_COL] = new_wake
        stay = (new_wake >= 0) | (slot >= done) | ((slot + w >= done) & self._keyed(rows))
        return out, rows[stay]

    def _windows(self, rows: Any, done: int) -> tuple[Any, Any]:
        slot = rows[SLOT_COL].to_numpy(np.int64)
        last = (slot // self.window + 1) * self.window - 1
        closed = last < done
        li, ri = self._matches(rows, closed, closed, on_window=True)
        hit = np.zeros(len(rows), bool)
        hit[li] = True
        hit[ri] = True
        lone = np.flatnonzero(closed & self._outer_side(rows) & ~hit)
        out = self._output(rows, li, ri, last[li], lone, last[lone])
        # a stepped row's hold moves to its window's last slot
        rows[WAKE_COL] = np.where(slot < done, last, rows[WAKE_COL].to_numpy(np.int64))
        return out, rows[~closed]

    def _keyed(self, rows: Any) -> np.ndarray:
        """Rows whose keys are all non-null (the only ones that match)."""
        return np.asarray(rows[KEY_COL].notna().to_numpy(), bool)

    def _outer_side(self, rows: Any) -> np.ndarray:
        """Rows that get an outer row when they match nothing."""
        side = rows[SIDE_COL].to_numpy()
        if self.how == "full":
            return np.ones(len(rows), bool)
        return side == 0 if self.how == "left" else np.zeros(len(rows), bool)

    def _matches(self, rows: Any, lefts: np.ndarray, rights: np.ndarray,
                 more: tuple[np.ndarray, np.ndarray] | None = None, on_window: bool = False
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(left, right) row positions of the matching pairs of a left row in ``lefts``
        and a right row in ``rights`` (and of ``more``'s pair of masks), sorted by (later
        slot, left, right)."""
        import pandas as pd

        side = rows[SIDE_COL].to_numpy()
        keyed = self._keyed(rows)
        slot = rows[SLOT_COL].to_numpy(np.int64)
        on = [KEY_COL]
        cols = rows[on].assign(lt_pos=np.arange(len(rows)))
        if on_window:
            cols["lt_win"] = slot // self.window
            on.append("lt_win")
        found = []
        for lm, rm in [(lefts, rights), *([more] if more is not None else [])]:
            m = pd.merge(cols[lm & keyed & (side == 0)], cols[rm & keyed & (side == 1)],
                         on=on, suffixes=("_l", "_r"))
            found.append((m["lt_pos_l"].to_numpy(np.int64), m["lt_pos_r"].to_numpy(np.int64)))
        li = np.concatenate([f[0] for f in found])
        ri = np.concatenate([f[1] for f in found])
        if not on_window:
            near = np.abs(slot[li] - slot[ri]) <= self.within
            li, ri = li[near], ri[near]
        order = np.lexsort((ri, li, np.maximum(slot[li], slot[ri])))
        return li[order], ri[order]

    def _output(self, rows: Any, li: np.ndarray, ri: np.ndarray, at: np.ndarray,
                lone: np.ndarray, lone_at: np.ndarray) -> Any:
        """The result rows: pairs (``li``, ``ri``) at ``at``, then rows ``lone`` with
        nulls for the other side at ``lone_at``; None for none."""
        import pandas as pd

        if not len(li) and not len(lone):
            return None
        k, lc, rc = list(self.keys), list(self.left_cols), list(self.right_cols)
        pairs = pd.concat([rows[k + lc].iloc[li].reset_index(drop=True),
                           rows[rc].iloc[ri].reset_index(drop=True)], axis=1)
        pairs[AT_COL] = at
        # a row's columns of the other side are null in the join's input already
        alone = rows[k + lc + rc].iloc[lone].reset_index(drop=True)
        alone[AT_COL] = lone_at
        parts = [p for p in (pairs, alone) if len(p)]
        return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]


def join_input(name: str, left: Any, right: Any, spec: JoinSpec, delta_ms: int
               ) -> tuple[Any, StatefulSpec]:
    """The join's input (both sides' rows, their columns side by side, ``lt_side``)
    and the keyed step that joins it. Raises a one-line error for keys a side lacks
    or types that differ, and for a column name on both sides."""
    from pyspark.sql import functions as F

    def fields(df: Any) -> dict[str, str]:
        return {f.name: f.dataType.simpleString() for f in df.schema.fields
                if f.name not in TRACKING_COLS}

    lf, rf = fields(left), fields(right)
    check_keys(f"join {name!r} (left)", spec.keys, lf)
    check_keys(f"join {name!r} (right)", spec.keys, rf)
    for k in spec.keys:
        if lf[k] != rf[k]:
            raise ValueError(f"join {name!r}: key {k!r} is {lf[k]} on the left and {rf[k]} "
                             "on the right: cast one side")
    taken = sorted((set(lf) | set(rf)) & set(RESERVED))
    if taken:
        raise ValueError(f"join {name!r}: column {taken[0]!r} is a name the join uses: "
                         "rename it (with_column / select)")
    lcols = tuple(c for c in lf if c not in spec.keys)
    rcols = tuple(c for c in rf if c not in spec.keys)
    both = sorted(set(lcols) & set(rcols))
    if both:
        raise ValueError(f"join {name!r}: both sides have a column {both[0]!r}: rename it "
                         "on one side (with_column / select)")

    def side(df: Any, mine: tuple[str, ...], other: dict[str, str], tag: int) -> Any:
        cols = [F.col(f"`{c}`") for c in (*spec.keys, *mine)]
        cols += [F.lit(None).cast(other[c]).alias(c) for c in other if c not in spec.keys]
        return df.select(*cols, F.lit(tag).cast("tinyint").alias(SIDE_COL),
                         key_json(spec.keys, lf, null_if_null=True).alias(KEY_COL), TRACK_COL)

    df = side(left, lcols, rf, 0).unionByName(side(right, rcols, lf, 1))
    schema = ", ".join(f"`{c}` {t}" for c, t in [*((c, lf[c]) for c in lcols),
                                                 *((c, rf[c]) for c in rcols)])
    logic = JoinLogic(spec.keys, lcols, rcols, spec.within_ms // delta_ms, spec.how,
                      spec.window_ms // delta_ms)
    return df, StatefulSpec(name, spec.keys, KeptRows(logic), schema, spec.poll_ms, BUCKETS,
                           what="join")
