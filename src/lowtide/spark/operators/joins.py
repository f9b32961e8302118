"""Exact stream-stream interval joins over global time, on the keyed state runtime.

::

    pairs = clicks.join(views, on="user", within="10 seconds")          # inner
    all_clicks = clicks.join(views, on="user", within="10 seconds", how="left")

A left row at slot ``a`` and a right row at slot ``b`` with equal keys (SQL equality:
a null key matches nothing) match when ``|a - b| <= within`` (in slots of
``delta_ms``). The result rows are the keys, the left columns and the right columns
(a column name on both sides, other than a key, is refused: rename it first).

Exact, with no watermark and nothing dropped as late: both inputs are unioned into
the join's inbound segment (a union: two senders) and grouped by key; the join is a
:class:`.keyed_state.SlotLogic`, so each key's slots are stepped in slot order once
the inbound segment is complete below them, and pending rows hold the min time
downstream (the state clock). At slot ``s`` the step emits, at time ``s``, every pair
whose later row is at ``s`` (the other row at ``s - within .. s``, all received by
then). Outer joins (``how="left"`` or ``"full"``): a row at ``a`` that no row of the
other side matched gets one row with nulls for the other side's columns at time
``a + within``, once the other side is complete up to there (a wake at that slot
holds the min time until then); not after a guessed delay. Rows are kept in state
for ``2 * within`` slots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lowtide.spark.operators.keyed_state import History, StatefulSpec
from lowtide.spark.operators.state_clock import check_keys, state_segment
from lowtide.spark.tracking.column import TRACK_COL, TRACKING_COLS

SIDE_COL = "lt_side"  # 0: a left row, 1: a right row (the join's input only; Spark
# renames a column starting with "_" on its way into transformWithStateInPandas)
HOWS = ("inner", "left", "full")


@dataclass(frozen=True)
class JoinSpec:
    """A join step (the first step of a stream whose inputs are its two sides)."""

    name: str
    keys: tuple[str, ...]
    within_ms: int
    how: str
    poll_ms: int = 100

    def segments(self) -> list[str]:
        return [self.name, state_segment(self.name)]


def check_join(name: str, within_ms: int, how: str, delta_ms: int) -> None:
    """Raises a one-line error for a join the description cannot track."""
    if how not in HOWS:
        hint = " (b.join(a, how='left') is a right join)" if how == "right" else ""
        raise ValueError(f"join {name!r}: how={how!r}: use one of {', '.join(HOWS)}{hint}")
    if within_ms < 0 or within_ms % delta_ms:
        raise ValueError(f"join {name!r}: within={within_ms} ms must be a non-negative "
                         f"multiple of delta_ms={delta_ms}")


@dataclass(frozen=True)
class JoinLogic:
    """The join's step at one complete slot of one key; see the module docstring."""

    left_cols: tuple[str, ...]
    right_cols: tuple[str, ...]
    within: int  # slots
    how: str

    @property
    def keep_slots(self) -> int:
        return 2 * self.within

    def step(self, key: tuple[Any, ...], slot: int, rows: Any, seen: History
             ) -> tuple[Any, list[int]]:
        import pandas as pd

        w = self.within
        now = _sides(rows)
        back = [(s, _sides(df)) for s, df in seen.kept(slot - 2 * w, slot - 1)]
        out = []
        if not any(_null(v) for v in key):  # pairs whose later row is at this slot
            recent = [sides for s, sides in back if s >= slot - w]
            out.append(self._cross([now[0]], [r for _, r in recent] + [now[1]]))
            out.append(self._cross([left for left, _ in recent], [now[1]]))
        # rows at slot - within have seen every row that can match them by now
        decided = now if w == 0 else next((sd for s, sd in back if s == slot - w),
                                          (None, None))
        if self.how != "inner":
            out.append(self._unmatched(decided[0], [r for _, (_, r) in back] + [now[1]],
                                       key, left=True))
        if self.how == "full":
            out.append(self._unmatched(decided[1], [x for _, (x, _) in back] + [now[0]],
                                       key, left=False))
        waiting = now[0] is not None or (self.how == "full" and now[1] is not None)
        wakes = [slot + w] if w > 0 and self.how != "inner" and waiting else []
        parts = [p for p in out if p is not None and len(p)]
        if not parts:
            return None, wakes
        return pd.concat(parts, ignore_index=True), wakes

    def _cross(self, lefts: list[Any], rights: list[Any]) -> Any:
        """Every row of ``lefts`` with every row of ``rights`` (None: a side without
        rows), left columns first."""
        import pandas as pd

        ls = [x for x in lefts if x is not None]
        rs = [x for x in rights if x is not None]
        if not ls or not rs:
            return None
        left = pd.concat(ls, ignore_index=True)[list(self.left_cols)]
        right = pd.concat(rs, ignore_index=True)[list(self.right_cols)]
        return left.merge(right, how="cross")

    def _unmatched(self, rows: Any, others: list[Any], key: tuple[Any, ...],
                   left: bool) -> Any:
        """``rows`` with nulls for the other side, if no row of the other side within
        reach (``others``) matched them (a null key matches nothing)."""
        import pandas as pd

        if rows is None or (not any(_null(v) for v in key)
                            and any(o is not None and len(o) for o in others)):
            return None
        mine = list(self.left_cols if left else self.right_cols)
        nulls = {c: pd.Series([None] * len(rows), dtype=object)
                 for c in (self.right_cols if left else self.left_cols)}
        res = rows[mine].reset_index(drop=True)
        for c, series in nulls.items():
            res[c] = series
        return res[[*self.left_cols, *self.right_cols]]


def _sides(rows: Any) -> tuple[Any, Any]:
    """(left rows, right rows) of a slot's rows; None for a side without rows."""
    if rows is None or not len(rows):
        return None, None
    side = rows[SIDE_COL].to_numpy()
    left, right = rows[side == 0], rows[side == 1]
    return (left if len(left) else None), (right if len(right) else None)


def _null(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def join_input(name: str, left: Any, right: Any, spec: JoinSpec, delta_ms: int
               ) -> tuple[Any, StatefulSpec]:
    """The join's input (both sides' rows, their columns side by side, ``_lt_side``)
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
    lcols = tuple(c for c in lf if c not in spec.keys)
    rcols = tuple(c for c in rf if c not in spec.keys)
    both = sorted(set(lcols) & set(rcols))
    if both:
        raise ValueError(f"join {name!r}: both sides have a column {both[0]!r}: rename it "
                         "on one side (with_column / select)")

    def side(df: Any, mine: tuple[str, ...], other: dict[str, str], tag: int) -> Any:
        cols = [F.col(f"`{c}`") for c in (*spec.keys, *mine)]
        cols += [F.lit(None).cast(other[c]).alias(c) for c in other if c not in spec.keys]
        return df.select(*cols, F.lit(tag).cast("tinyint").alias(SIDE_COL), TRACK_COL)

    df = side(left, lcols, rf, 0).unionByName(side(right, rcols, lf, 1))
    schema = ", ".join(f"`{c}` {t}" for c, t in [*((c, lf[c]) for c in lcols),
                                                 *((c, rf[c]) for c in rcols)])
    logic = JoinLogic(lcols, rcols, spec.within_ms // delta_ms, spec.how)
    return df, StatefulSpec(name, spec.keys, logic, schema, spec.poll_ms)
