"""Exact stream-stream joins over global time, interval or window, on the keyed
state runtime, vectorised over a bucket of keys.

::

    pairs = clicks.join(views, on="user", within="10 seconds")          # inner
    all_clicks = clicks.join(views, on="user", within="10 seconds", how="left")
    clicked = views.join(clicks, left_on="ad_id", right_on="click_ad_id",
                         lower="0 seconds", upper="15 minutes", how="left")
    per_minute = clicks.join(views, on="user", window="1 minute", how="full")

Interval join: a left row at slot ``a`` and a right row at slot ``b`` with equal keys
(SQL equality: a null key matches nothing) match when ``lower <= b - a <= upper`` (in
slots of ``delta_ms``; ``within=w`` is ``lower=-w, upper=w``); a pair is emitted at its
later row's slot ``max(a, b)``. Window join: they match when they are in the same
tumbling window of global time (``window`` slots, the first starting at slot 0); a pair
is emitted at the window's last slot. Outer joins (``how="left"``, ``"right"`` or
``"full"``): a row that no row of the other side matched gets one row with nulls for
the other side's columns once the other side is complete up to the last slot it could
match at (a left row at ``a + max(upper, 0)``, a right row at ``b + max(-lower, 0)``; a
window join's at the window's last slot); not after a guessed delay (``.speculative()``
shows it early, provisional: :mod:`.speculative_join`). ``"semi"``: each
left row that matches, once, with the left columns only, at its first match's slot;
``"anti"``: each left row that matches nothing, where a left outer join would emit its
outer row. The result rows are the keys, the left columns and the right columns (a
column name on both sides, other than a key named alike, is refused: rename it first);
keys named differently (``left_on``/``right_on``, or a Column condition of equalities)
stay in their side's columns.

Exact, with no watermark and nothing dropped as late: both inputs are unioned into
the join's inbound segment (a union: two senders) and grouped into ``buckets`` buckets
of keys (:class:`.keyed_state.StatefulSpec`); each call of a bucket steps ALL its rows
below the inbound segment's min time ``done`` at once (:meth:`JoinLogic.run`): a
pandas merge on the keys, then the match predicate. Rows below ``done`` that were not
stepped yet (their wake is their slot: a hold there) are above every row stepped
before, so the pairs to emit are those with at least one such row, all at slots below
``done``. An interval join keeps stepped rows for look-back while a row still to come
can match them (a left row while ``a + upper >= done``, a right row while ``b - lower
>= done``) and marks matched rows (``lt_hit``); an outer row not decided by ``done``
waits with a hold at its slot. A window join keeps a window's rows (their hold moves
to the window's last slot) until ``done`` passes it, then joins the window at once and
drops it. Outputs are sorted by (slot, left row, right row) in the bucket's fixed row
order (slot, ack id), so a retried task emits the same rows with the same acks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.spark.operators.frames import StepError, first_line
from lowtide.spark.operators.keyed_state import GROUP_COL, StatefulSpec, key_json
from lowtide.spark.operators.slot_logic import (
    AT_COL,
    ID_COL,
    RUNTIME_COLS,
    SLOT_COL,
    WAKE_COL,
    KeptRows,
    UserState,
)
from lowtide.spark.operators.speculative_join import (
    JOIN_CHANGELOG_DDL,
    SHOWN_COL,
    SpeculativeJoin,
    check_changelog_names,
    join_changelog,
    shown,
)
from lowtide.spark.operators.state_clock import check_keys, state_segment
from lowtide.spark.tracking.column import TRACK_COL, TRACKING_COLS

SIDE_COL = "lt_side"  # 0: a left row, 1: a right row (the join's input only; Spark
# renames a column starting with "_" on its way into transformWithStateInPandas)
HIT_COL = "lt_hit"  # 1: an interval join's row matched a row of the other side
# the keys as the JVM compares them, for the merge: JSON of the key struct, null when a
# key is null (SQL: it matches nothing); pandas would see a nullable long as a float
KEY_COL = "lt_key"
RESERVED = (SIDE_COL, HIT_COL, KEY_COL, SHOWN_COL, AT_COL, GROUP_COL, *RUNTIME_COLS)
HOWS = ("inner", "left", "right", "full", "semi", "anti")
#: Spark's names for the same joins
HOW_ALIASES = {"leftouter": "left", "left_outer": "left", "rightouter": "right",
               "right_outer": "right", "outer": "full", "fullouter": "full",
               "full_outer": "full", "leftsemi": "semi", "left_semi": "semi",
               "leftanti": "anti", "left_anti": "anti", "cross": "cross"}
BUCKETS = 8  # per join; fixed, as the state is kept per bucket across restarts


@dataclass(frozen=True, eq=False)
class JoinCondition:
    """A join condition given as a Spark ``Column`` (``F.col("ad") == F.col("ad_id")``,
    several joined with ``&``); resolved into key pairs once both sides' columns are
    known (:func:`condition_keys`). Compared by identity (a Column's ``==`` is a
    Column)."""

    column: Any


@dataclass(frozen=True)
class JoinSpec:
    """A join step (the first step of a stream whose inputs are its two sides): a left
    row at slot ``a`` and a right row at slot ``b`` with equal keys match when ``b - a``
    is in [``lower``, ``upper``] (slots of ``delta_ms``, given in ms: an interval join),
    or, with ``window_ms`` > 0, when both are in the same tumbling window. Keys:
    ``keys`` on the left and ``right_keys`` on the right (() : the same names), or a
    ``condition`` resolved when the plan is built."""

    name: str
    keys: tuple[str, ...]
    lower_ms: int
    upper_ms: int
    how: str
    poll_ms: int = 100
    window_ms: int = 0
    right_keys: tuple[str, ...] = ()
    condition: JoinCondition | None = None
    #: early outer rows, a changelog (:mod:`.speculative_join`)
    speculative: bool = False

    def segments(self) -> list[str]:
        return [self.name, state_segment(self.name)]


def check_join(name: str, how: str, delta_ms: int, *, within_ms: int | None = None,
               lower_ms: int | None = None, upper_ms: int | None = None,
               window_ms: int | None = None) -> tuple[str, int, int]:
    """(lowtide's name of ``how``, lower, upper in ms) of a join as described, or a
    one-line error for one the description cannot track: ``within`` is ``lower=-within,
    upper=within``; ``lower``/``upper`` bound the right row's time minus the left's."""
    how = HOW_ALIASES.get(how.lower(), how.lower())
    if how not in HOWS:
        why = " (every pair of rows, with no key)" if how == "cross" else ""
        raise StepError(f"join {name!r}: how={how!r}{why}: use one of {', '.join(HOWS)}")
    bounded = lower_ms is not None or upper_ms is not None
    if sum((within_ms is not None, bounded, window_ms is not None)) != 1:
        raise StepError(f"join {name!r}: give exactly one of within=, lower= with upper= "
                        "(interval joins) and window= (a window join)")
    if within_ms is not None:
        if within_ms < 0 or within_ms % delta_ms:
            raise StepError(f"join {name!r}: within={within_ms} ms must be a non-negative "
                            f"multiple of delta_ms={delta_ms}")
        return how, -within_ms, within_ms
    if window_ms is not None:
        if window_ms <= 0 or window_ms % delta_ms:
            raise StepError(f"join {name!r}: window={window_ms} ms must be a positive "
                            f"multiple of delta_ms={delta_ms}")
        return how, 0, 0
    if lower_ms is None or upper_ms is None:
        raise StepError(f"join {name!r}: give both lower= and upper= (the right row's time "
                        "minus the left row's is in [lower, upper])")
    if lower_ms > upper_ms or lower_ms % delta_ms or upper_ms % delta_ms:
        raise StepError(f"join {name!r}: lower={lower_ms} ms, upper={upper_ms} ms: give "
                        f"lower <= upper, both multiples of delta_ms={delta_ms}")
    return how, lower_ms, upper_ms


@dataclass(frozen=True)
class JoinLogic:
    """A bucket's join step (:class:`.slot_logic.RowLogic`); see the module
    docstring. ``window`` > 0 (slots): a window join, else an interval join whose pairs
    have ``lower <= b - a <= upper`` (slots, ``a`` the left row's, ``b`` the right's)."""

    keys: tuple[str, ...]
    left_cols: tuple[str, ...]
    right_cols: tuple[str, ...]
    lower: int  # slots
    upper: int  # slots
    how: str
    window: int = 0  # slots
    speculative: bool = False  # a changelog (:mod:`.speculative_join`)

    @property
    def alone_cols(self) -> tuple[str, ...]:
        """The columns of a row emitted alone (an outer row, a semi or anti join's)."""
        return (*self.keys, *self.left_cols,
                *(self.right_cols if self.how not in ("semi", "anti") else ()))

    def waiting_outer(self, rows: Any) -> np.ndarray:
        """Kept rows that wait, unmatched, for their outer row to be decided."""
        hit = rows[HIT_COL].fillna(0).to_numpy(np.int8) if HIT_COL in rows.columns else 0
        return self._outer_side(rows) & (rows[WAKE_COL].to_numpy(np.int64) >= 0) & (hit == 0)

    def run(self, key: tuple[Any, ...], rows: Any, done: int, user: UserState
            ) -> tuple[Any, Any]:
        if self.window:
            return self._windows(rows, done)
        return self._intervals(rows, done)

    def _intervals(self, rows: Any, done: int) -> tuple[Any, Any]:
        if HIT_COL not in rows.columns:
            rows[HIT_COL] = np.zeros(len(rows), np.int8)
        rows[HIT_COL] = rows[HIT_COL].fillna(0).astype(np.int8)
        slot = rows[SLOT_COL].to_numpy(np.int64)
        wake = rows[WAKE_COL].to_numpy(np.int64)
        left = rows[SIDE_COL].to_numpy() == 0
        fresh = (wake == slot) & (slot < done)  # rows stepped now
        # new pairs have a fresh row: fresh left x all right, then old left x fresh right
        below = slot < done
        li, ri = self._matches(rows, fresh, below, (below & ~fresh, fresh))
        was_hit = rows[HIT_COL].to_numpy(np.int8).astype(bool)
        hit = was_hit.copy()
        hit[li] = True
        hit[ri] = True
        rows[HIT_COL] = hit.astype(np.int8)
        # a row is decided once the other side is complete up to the last slot it can
        # match at; its outer row goes out there (never below its own slot)
        lone_at = slot + np.where(left, max(self.upper, 0), max(-self.lower, 0))
        outer = self._outer_side(rows) & (fresh | (wake > slot))
        decided = outer & (lone_at < done)
        cancel = np.flatnonzero(shown(rows) & hit)  # their v1 tombstoned at their wake
        at = np.maximum(slot[li], slot[ri])
        if self.how == "semi":  # a left row once, at its first match's slot
            first_l, first_at = li[~was_hit[li]], at[~was_hit[li]]  # sorted by slot
            first = np.unique(first_l, return_index=True)[1]
            out = self._output(rows, li[:0], ri[:0], at[:0], first_l[first], first_at[first])
        else:
            lone = np.flatnonzero(decided & ~hit)
            pairs = slice(0 if self.how == "anti" else None)
            out = self._output(rows, li[pairs], ri[pairs], at[pairs], lone, lone_at[lone],
                               (cancel, lone_at[cancel]))
        if self.speculative:
            rows[SHOWN_COL] = (shown(rows) & ~hit).astype(np.int8)
        new_wake = np.where(fresh | decided, -1, wake)
        new_wake[outer & ~decided] = lone_at[outer & ~decided]
        rows[WAKE_COL] = new_wake
        # kept for look-back while a row of the other side still to come can match it
        reach = np.where(left, slot + self.upper, slot - self.lower)
        stay = (new_wake >= 0) | (slot >= done) | ((reach >= done) & self._keyed(rows))
        return out, rows[stay]

    def _windows(self, rows: Any, done: int) -> tuple[Any, Any]:
        slot = rows[SLOT_COL].to_numpy(np.int64)
        last = (slot // self.window + 1) * self.window - 1
        closed = last < done
        li, ri = self._matches(rows, closed, closed, on_window=True)
        hit = np.zeros(len(rows), bool)
        hit[li] = True
        hit[ri] = True
        if self.how == "semi":
            lone = np.flatnonzero(closed & (rows[SIDE_COL].to_numpy() == 0) & hit)
        else:
            lone = np.flatnonzero(closed & self._outer_side(rows) & ~hit)
        if self.how in ("semi", "anti"):
            li, ri = li[:0], ri[:0]
        cancel = np.flatnonzero(closed & shown(rows) & hit)
        out = self._output(rows, li, ri, last[li], lone, last[lone], (cancel, last[cancel]))
        # a stepped row's hold moves to its window's last slot
        rows[WAKE_COL] = np.where(slot < done, last, rows[WAKE_COL].to_numpy(np.int64))
        return out, rows[~closed]

    def _keyed(self, rows: Any) -> np.ndarray:
        """Rows whose keys are all non-null (the only ones that match)."""
        return np.asarray(rows[KEY_COL].notna().to_numpy(), bool)

    def _outer_side(self, rows: Any) -> np.ndarray:
        """Rows that get a row of their own when they match nothing (an outer row, or
        an anti join's row)."""
        side = rows[SIDE_COL].to_numpy()
        if self.how == "full":
            return np.ones(len(rows), bool)
        if self.how in ("left", "anti"):
            return np.asarray(side == 0, bool)
        return np.asarray(side == 1, bool) if self.how == "right" else np.zeros(len(rows), bool)

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
            gap = slot[ri] - slot[li]
            near = (gap >= self.lower) & (gap <= self.upper)
            li, ri = li[near], ri[near]
        order = np.lexsort((ri, li, np.maximum(slot[li], slot[ri])))
        return li[order], ri[order]

    def _output(self, rows: Any, li: np.ndarray, ri: np.ndarray, at: np.ndarray,
                lone: np.ndarray, lone_at: np.ndarray,
                cancel: tuple[np.ndarray, np.ndarray] | None = None) -> Any:
        """The result rows: pairs (``li``, ``ri``) at ``at``, then rows ``lone`` (with
        nulls for the other side; a semi or anti join's left rows) at ``lone_at``;
        None for none. Speculative: their changelog, with the tombstones of the shown
        rows ``cancel`` (positions, slots)."""
        import pandas as pd

        none = np.zeros(0, np.int64)
        gone, gone_at = cancel if cancel is not None and self.speculative else (none, none)
        if not len(li) and not len(lone) and not len(gone):
            return None
        k, lc, rc = list(self.keys), list(self.left_cols), list(self.right_cols)
        pairs = pd.concat([rows[k + lc].iloc[li].reset_index(drop=True),
                           rows[rc].iloc[ri].reset_index(drop=True)], axis=1)
        pairs[AT_COL] = at
        # a row's columns of the other side are null in the join's input already
        alone = rows[list(self.alone_cols)]
        if self.speculative:
            ids = rows[ID_COL].to_numpy(np.int64)
            return join_changelog(pairs, (ids[li], ids[ri]), alone, ids,
                                  (lone, lone_at, shown(rows)[lone]), (gone, gone_at))
        alone = alone.iloc[lone].reset_index(drop=True)
        alone[AT_COL] = lone_at
        parts = [p for p in (pairs, alone) if len(p)]
        return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]


def join_input(name: str, left: Any, right: Any, spec: JoinSpec, delta_ms: int
               ) -> tuple[Any, StatefulSpec]:
    """The join's input (both sides' rows, their columns side by side, ``lt_side``)
    and the keyed step that joins it. Raises a one-line error for keys a side lacks
    or types that differ, and for a column name on both sides (other than a key named
    alike on both, which the result has once). Keys named differently are the result's
    columns on their own side; the step then groups by ``lt_key``, which
    :func:`joined` drops."""
    from pyspark.sql import functions as F

    def fields(df: Any) -> dict[str, str]:
        return {f.name: f.dataType.simpleString() for f in df.schema.fields
                if f.name not in TRACKING_COLS}

    lf, rf = fields(left), fields(right)
    lkeys, rkeys = join_keys(name, spec, lf, rf, left.sparkSession)
    check_keys(f"join {name!r} (left)", lkeys, lf)
    check_keys(f"join {name!r} (right)", rkeys, rf)
    for lk, rk in zip(lkeys, rkeys, strict=True):
        if lf[lk] != rf[rk]:
            what = repr(lk) if lk == rk else f"{lk!r} = {rk!r}"
            raise StepError(f"join {name!r}: key {what} is {lf[lk]} on the left and "
                            f"{rf[rk]} on the right: cast one side")
    taken = sorted((set(lf) | set(rf)) & set(RESERVED))
    if taken:
        raise StepError(f"join {name!r}: column {taken[0]!r} is a name the join uses: "
                        "rename it (withColumnRenamed)")
    keys = tuple(lk for lk, rk in zip(lkeys, rkeys, strict=True) if lk == rk)
    lcols = tuple(c for c in lf if c not in keys)
    rcols = tuple(c for c in rf if c not in keys)
    both = sorted(set(lcols) & set(rcols))
    if both:
        raise StepError(f"join {name!r}: both sides have a column {both[0]!r}: rename it "
                        "on one side (withColumnRenamed)")
    if spec.speculative:
        check_changelog_names(name, set(lf) | set(rf))

    def side(df: Any, mine: tuple[str, ...], other: dict[str, str], tag: int,
             on: tuple[str, ...], types: dict[str, str]) -> Any:
        cols = [F.col(f"`{c}`") for c in (*keys, *mine)]
        cols += [F.lit(None).cast(other[c]).alias(c) for c in other if c not in keys]
        return df.select(*cols, F.lit(tag).cast("tinyint").alias(SIDE_COL),
                         key_json(on, types, null_if_null=True).alias(KEY_COL), TRACK_COL)

    df = side(left, lcols, rf, 0, lkeys, lf).unionByName(side(right, rcols, lf, 1, rkeys, rf))
    out = [*((c, lf[c]) for c in lcols)]
    if spec.how not in ("semi", "anti"):
        out += [(c, rf[c]) for c in rcols]
    schema = ", ".join(f"`{c}` {t}" for c, t in out)
    group = keys or (KEY_COL,)  # keys named differently: the keys' JSON, dropped after
    return df, join_step(spec, group, lcols, rcols, schema, delta_ms)


def join_step(spec: JoinSpec, group: tuple[str, ...], lcols: tuple[str, ...],
              rcols: tuple[str, ...], schema: str, delta_ms: int) -> StatefulSpec:
    """The keyed step of a join grouped by ``group``, its output ``schema`` (the
    columns after the keys), with a changelog's columns if it is speculative."""
    logic = JoinLogic(group, lcols, rcols, spec.lower_ms // delta_ms,
                      spec.upper_ms // delta_ms, spec.how, spec.window_ms // delta_ms,
                      spec.speculative)
    if spec.speculative:
        return StatefulSpec(spec.name, group, SpeculativeJoin(logic),
                            f"{schema}, {JOIN_CHANGELOG_DDL}", spec.poll_ms, BUCKETS, what="join")
    return StatefulSpec(spec.name, group, KeptRows(logic), schema, spec.poll_ms, BUCKETS,
                        what="join")


def joined(df: Any, step: StatefulSpec) -> Any:
    """The join's output as the user sees it: without ``lt_key`` if it grouped by it."""
    return df.drop(KEY_COL) if KEY_COL in step.keys else df


def join_keys(name: str, spec: JoinSpec, lf: dict[str, str], rf: dict[str, str],
              spark: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(left keys, right keys), pairwise equal: as given, or from the condition."""
    if spec.condition is None:
        return spec.keys, spec.right_keys or spec.keys
    return condition_keys(name, spec.condition.column, lf, rf, spark)


def condition_keys(name: str, condition: Any, lf: dict[str, str], rf: dict[str, str],
                   spark: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The key pairs of a Column condition: equalities of a left and a right column,
    joined by AND (Spark analyses it against empty frames of both sides' columns)."""
    from pyspark.errors import PySparkException

    def empty(types: dict[str, str]) -> Any:
        ddl = ", ".join(f"`{c}` {t}" for c, t in types.items())
        return spark.createDataFrame([], ddl)

    hint = ("a join condition is equalities of a left and a right column joined by &; "
            "give the time range with lower=/upper=")
    try:
        probe = empty(lf).crossJoin(empty(rf)).where(condition)
    except PySparkException as err:
        raise StepError(f"join {name!r}: {first_line(err)} ({hint})") from None
    todo, pairs = [probe._jdf.queryExecution().analyzed().condition()], []
    while todo:
        node = todo.pop()
        kids = [node.children().apply(i) for i in range(node.children().size())]
        if node.nodeName() == "And":
            todo.extend(reversed(kids))
            continue
        names = [k.name() for k in kids if k.nodeName() == "AttributeReference"]
        if node.nodeName() != "EqualTo" or len(names) != 2 or \
                (names[0] in lf) == (names[1] in lf):
            raise StepError(f"join {name!r}: {node.sql()}: {hint}")
        pairs.append(tuple(names) if names[0] in lf else (names[1], names[0]))
    return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
