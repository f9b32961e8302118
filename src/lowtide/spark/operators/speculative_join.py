"""Early outer rows of an exact stream-stream join (rule 13): a changelog in which a
row that has no match yet shows at once as a provisional row, cancelled by a
tombstone if a match comes, and final once nothing can match it any more.

::

    changes = clicks.join(views, on="user", within="10 seconds", how="left").speculative()

Where it fits: a join's pairs (inner matches) are final the moment both rows are
there, but an outer row (``how="left"``, ``"right"``, ``"full"``) or an anti join's
row waits until the other side is complete up to the last slot it could match at
(:mod:`.joins`): with a lagging front, that is the front's lag. ``.speculative()``
shows it while it waits. An inner or semi join has nothing to speculate (each row it
emits is final when emitted) and ``.speculative()`` on it is refused in one line, as is
``every=``: an outer row has one provisional version, so there is nothing to bound.

The output is a changelog, read as a window's is
(:func:`lowtide.spark.sinks.changelog.apply_changelog`, ``finals``, ``merge_sql``):
the join's columns, then

* ``row_id``: the row's identity across its versions: an outer row's is its input
  row's ack id, a pair's is derived from its two rows' ack ids; both are labels the
  rows keep through retries and restarts, so the ids are the same in every attempt;
* ``op`` (``"insert"`` / ``"tombstone"``), ``version``, ``is_final`` as a window's.

Per row:

* a pair: ``insert v1 final``, at its slot (``max(a, b)``), as the join without
  ``.speculative()`` emits it; never cancelled;
* an outer row, once the join has received it (even while its slot is not complete):
  ``insert v1`` (not final) at the slot of the hold it keeps (rule 7: its own slot,
  then the last slot it could match at). If a match comes: ``tombstone v1`` (repeating
  v1) then the pairs. If none can come any more: ``tombstone v1``, ``insert v2 final``
  at the last slot it could match at, where the join without ``.speculative()`` emits
  it. (A row arrives while its slot is not complete, so it always shows v1 first; a
  row decided unshown would show ``insert v1 final`` alone.)

Every provisional row and every tombstone is a tracked child of the hold the outer
row keeps at its slot (rule 13; child indices from the row's ack id, the version and
the op), so a downstream min time past that slot covers them; the final row releases
the hold. Whether a row's v1 was shown is in the row's state (``lt_shown``), kept with
the group's rows in the state store, so a retried task or a batch re-run after a
restart emits the same rows with the same acks (rules 5 and 6). A window join shows
its outer rows early too; their matches are found when the window closes, as without
``.speculative()``, so a tombstone comes then.

Worked example (left join, ``within`` 2 slots; ``done`` the inbound min time): a left
row L at slot 3 arrives with ``done = 1``: early ``insert v1`` at slot 3. ``done = 4``:
L is stepped, no match; its hold moves to slot 5 (3 + 2). A right row R at slot 4
arrives with ``done = 4``; with ``done = 5`` R is stepped and matches L: early
``tombstone v1`` at slot 5, out the pair ``insert v1 final`` at slot 4. Had no R
come: with ``done = 6``, out ``tombstone v1`` and ``insert v2 final`` at slot 5.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from lowtide.core.acks import child_acks
from lowtide.spark.operators.frames import StepError
from lowtide.spark.operators.slot_logic import (
    AT_COL,
    CHILD_COL,
    ID_COL,
    WAKE_COL,
    KeptRows,
    LogicStep,
    RowParts,
)
from lowtide.spark.operators.speculative import EARLY_BASE
from lowtide.spark.sinks.changelog import (
    CHANGELOG_COLS,
    CHANGELOG_DDL,
    FINAL_COL,
    INSERT,
    OP_COL,
    TOMBSTONE,
    VERSION_COL,
)

ROW_ID_COL = "row_id"  # a changelog row's identity across its versions
SHOWN_COL = "lt_shown"  # 1: a kept outer row whose provisional v1 was shown, not cancelled
#: the columns a speculative join adds after the join's, and their types
JOIN_CHANGELOG_DDL = f"{ROW_ID_COL} bigint, {CHANGELOG_DDL}"
SPECULATING = ("left", "right", "full", "anti")


def make_speculative_join(spec: Any, every: str | int | None) -> Any:
    """``left.join(right, ..., how=...).speculative()``: ``spec`` (a
    :class:`.joins.JoinSpec`) with early outer rows, or a one-line error."""
    if spec.speculative:
        raise StepError(f"join {spec.name!r}: speculative() is given twice")
    if spec.how not in SPECULATING:
        raise StepError(f"join {spec.name!r}: how={spec.how!r} emits each row once it is "
                        "final, there is nothing to speculate: drop .speculative() (early "
                        f"rows are for how={', '.join(map(repr, SPECULATING))})")
    if every is not None:
        raise StepError(f"join {spec.name!r}: speculative(every={every!r}): an outer row "
                        "has one provisional version, there is nothing to bound: drop every=")
    return replace(spec, speculative=True)


def check_changelog_names(name: str, columns: set[str]) -> None:
    """A one-line error for a join column named like a changelog column."""
    taken = sorted(columns & {ROW_ID_COL, *CHANGELOG_COLS})
    if taken:
        raise StepError(f"join {name!r}: column {taken[0]!r} is a changelog column "
                        "(row_id, op, version, is_final): rename it (withColumnRenamed)")


def shown(rows: Any) -> np.ndarray:
    """Which kept rows' provisional v1 is shown and not cancelled."""
    if SHOWN_COL not in rows.columns:
        return np.zeros(len(rows), bool)
    return np.asarray(rows[SHOWN_COL].fillna(0).to_numpy(np.int8), bool)


def _early_child(ids: np.ndarray, version: Any, tombstone: Any) -> np.ndarray:
    """An early row's child index under its slot's hold: distinct per input row (ack
    id), version and op, the same in every attempt."""
    index = EARLY_BASE + 2 * np.asarray(version, np.uint64) + np.asarray(tombstone, np.uint64)
    return child_acks(ids.astype(np.int64).view(np.uint64), 0,
                      np.broadcast_to(index, ids.shape))


def _versions(frame: Any, ids: np.ndarray, version: Any, tombstone: Any, final: Any) -> Any:
    """``frame`` (with :data:`AT_COL`) as changelog rows: each a ``version`` (scalars
    or arrays) of row ``ids``, a tombstone or an insert, final or not; a tombstone's
    child index for an early row."""
    n = len(ids)
    version = np.broadcast_to(np.asarray(version, np.int64), n)
    tombstone = np.broadcast_to(np.asarray(tombstone, bool), n)
    out = frame.reset_index(drop=True)
    out[ROW_ID_COL] = ids.astype(np.int64)
    out[OP_COL] = np.where(tombstone, TOMBSTONE, INSERT).astype(object)
    out[VERSION_COL] = version
    out[FINAL_COL] = np.broadcast_to(np.asarray(final, bool), n)
    out[CHILD_COL] = _early_child(ids, version, tombstone)
    return out


def join_changelog(pairs: Any, pair_ids: tuple[np.ndarray, np.ndarray], alone: Any,
                   ids: np.ndarray, lone: tuple[np.ndarray, np.ndarray, np.ndarray],
                   gone: tuple[np.ndarray, np.ndarray]) -> Any:
    """The changelog rows of one call: ``pairs`` (with :data:`AT_COL`) final, their
    ids from their rows' ``pair_ids``; of ``alone`` (every row's columns as emitted
    alone, ``ids`` their ack ids): ``gone`` (positions, slots), outer rows matched now
    whose v1 is cancelled, then ``lone`` (positions, slots, was v1 shown), outer rows
    decided unmatched: the tombstone of v1 and v2 final where shown, else v1 final.
    One frame of single rows, built at once: it is made per bucket and call."""
    import pandas as pd

    (lone_pos, lone_slots, was_shown), (gone_pos, gone_slots) = lone, gone
    was, unshown = lone_pos[was_shown], lone_pos[~was_shown]
    pos = np.concatenate([gone_pos, was, was, unshown]).astype(np.int64)
    n_gone, n_was = len(gone_pos), len(was)
    single = alone.iloc[pos].assign(**{AT_COL: np.concatenate(
        [gone_slots, lone_slots[was_shown], lone_slots[was_shown],
         lone_slots[~was_shown]]).astype(np.int64)})
    versions = np.ones(len(pos), np.int64)
    versions[n_gone + n_was:n_gone + 2 * n_was] = 2
    tombstone = np.arange(len(pos)) < n_gone + n_was
    singles = _versions(single, ids[pos], versions, tombstone, ~tombstone)
    left_ids, right_ids = (i.astype(np.int64).view(np.uint64) for i in pair_ids)
    both = _versions(pairs, child_acks(left_ids, 0, right_ids).view(np.int64), 1, False, True)
    parts = [p for p in (both, singles) if len(p)]
    if not parts:
        return None
    return pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]


@dataclass(frozen=True)
class SpeculativeJoin:
    """A join's slot logic with early outer rows (see the module docstring): the join
    over its kept rows (:class:`.slot_logic.KeptRows` over ``logic``, a speculative
    :class:`.joins.JoinLogic`), its tombstones of rows still waiting moved to
    ``early``, and a provisional v1 of every kept outer row that waits unmatched and
    has not shown one."""

    logic: Any

    def step(self, key: tuple[Any, ...], state: Any, new: Any, done: int,
             parts: RowParts, now_ms: int) -> LogicStep:
        res = KeptRows(self.logic).step(key, state, new, done, parts, now_ms)
        out, early = res.out, None
        if out is not None:  # tombstones at a wake that stays open: still provisional
            waiting = out[AT_COL].to_numpy(np.int64) >= done
            out, early = out[~waiting], out[waiting]
        kept = res.state
        if kept is not None and kept.rows is not None:
            rows = kept.rows
            show = self.logic.waiting_outer(rows) & ~shown(rows)
            if show.any():
                ids = rows[ID_COL].to_numpy(np.int64)[show]
                first = rows[list(self.logic.alone_cols)][show].assign(
                    **{AT_COL: rows[WAKE_COL].to_numpy(np.int64)[show]})
                early = _concat(early, _versions(first, ids, 1, False, False))
                kept = replace(kept, rows=rows.assign(
                    **{SHOWN_COL: (shown(rows) | show).astype(np.int8)}))
        return replace(res, state=kept, out=_nonempty(out), early=_nonempty(early))


def _concat(a: Any, b: Any) -> Any:
    import pandas as pd

    return b if a is None or not len(a) else pd.concat([a, b], ignore_index=True)


def _nonempty(frame: Any) -> Any:
    return frame if frame is not None and len(frame) else None
