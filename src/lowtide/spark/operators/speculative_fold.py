"""Early results of a user's fold (rule 13): ``stream.stateful(fn, schema,
key=...).speculative(every=None)``, a changelog of the fold's rows per (key, slot).

::

    def running(key, rows, total):          # one key's rows of one slot
        total = (total or 0) + len(rows)
        return total, pandas.DataFrame({"n": [total]})

    changes = stream.stateful(running, "n long", key="user").speculative()

``fn`` is called as without ``speculative()``: per key once per COMPLETE slot, in slot
order, on the state it keeps; those rows are the final version of (key, slot). Besides,
each micro-batch that brings the key rows calls ``fn`` *provisionally* on its pending
slots, in slot order, from a copy of the key's committed state, each slot's call on
the state the one before returned: what the fold would emit if those slots were
complete now. The state these calls return is thrown away. A call that brings no rows
makes no provisional calls (without timers, the committed state moved along the very
slots the last provisional calls ran, so they would return the same), but for a
version held back by ``every`` that is due, and with ``on_timer`` (a timer that fired
may have changed the state). Each pending slot whose rows differ from its last version shows a new
version, preceded by the tombstones of the last one's rows; a slot whose call returns
no rows shows a version of no rows (only the tombstones). When the slot completes,
the real call's rows are its final version (``is_final``): tombstones of the last
version first, then the final rows, even if they are the same.

The changelog's columns: the key columns, ``fn``'s columns (``schema``), and

* ``slot_start``: the start of the slot (a timestamp, ``slot * delta_ms``) whose rows
  the version is of: with the keys, what identifies (key, slot); the row's
  ``lt_time`` is that slot too;
* ``op``, ``version``, ``is_final`` as in a speculative window's changelog
  (:mod:`.speculative`): a version is (key, slot, ``version``), all its rows; a
  tombstone repeats one row of the version it cancels.

So :func:`lowtide.apply_changelog` folds it as it folds a window's (every column but
``op``, ``is_final`` and the labels names a row) and
:func:`~lowtide.spark.sinks.changelog.finals` gives what the same ``stateful``
without ``speculative()`` emits.

Timers (``on_timer``) stay final-only: a provisional call gets a copy of the key's
timers (what it registers is dropped) and no timer fires provisionally; a timer's rows
join the final version of the slot it fires at. ``every`` bounds re-emission as for
windows: a (key, slot) shows a new early version at most every ``every`` (the step
then looks at every poll, so a change held back shows within ``poll_ms`` of being
due; the provisional calls run again once ``every`` after a version was shown).

Rules: every early row sits at its pending slot, whose hold (the slot's rows keep one
open, rule 7) stays open; it is a child of that hold with its own index
(:data:`.speculative.EARLY_BASE` + version, tombstone and position), so a downstream
min time past the slot covers every version and tombstone; the final version is sent
with the hold's release. Versions and provisional rows are a function of the group's
stored state, its rows, ``done`` and the batch timestamp: a retried task or a batch
re-run after a restart emits the same versions with the same acks (rules 5 and 6).

Worked example (``running`` above, one key): rows at slots 3 and 5 with ``done = 2``:
early ``insert v1 n=1`` at slot 3 and ``insert v1 n=2`` at slot 5. A row at slot 3
with ``done = 3``: slot 3 shows ``tombstone v1 n=1``, ``insert v2 n=2``; slot 5
``tombstone v1 n=2``, ``insert v2 n=3``. A call with ``done = 6``: out slot 3
``tombstone v2 n=2``, ``insert v3 n=2 final``; slot 5 ``tombstone v2 n=3``,
``insert v3 n=3 final`` (both holds released).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from lowtide.spark.operators.fold import FoldLogic
from lowtide.spark.operators.keyed_state import StatefulSpec
from lowtide.spark.operators.slot_logic import AT_COL, CHILD_COL, Kept, KeptRows, LogicStep
from lowtide.spark.operators.speculative import (
    EARLY_BASE,
    Change,
    Shown,
    changelog_step,
    checked_every,
)
from lowtide.spark.operators.window_aggs import time_column
from lowtide.spark.sinks.changelog import (
    CHANGELOG_COLS,
    CHANGELOG_DDL,
    FINAL_COL,
    INSERT,
    OP_COL,
    SLOT_START_COL,
    TOMBSTONE,
    VERSION_COL,
)

#: a version's rows: the position of an early row in its version, below this bit
ROW_BITS = 23


@dataclass(frozen=True)
class FoldVersions:
    """A key's state: its fold's (:class:`.slot_logic.Kept`), the version each
    pending slot last showed (slot -> :class:`.speculative.Shown`, its values the
    rows as tuples) and, with ``every``, when a version held back may show (None:
    none can be)."""

    kept: Kept | None
    shown: dict[int, Shown]
    due_ms: int | None = None


@dataclass(frozen=True)
class SpeculativeFold:
    """A user's fold with early versions (see the module docstring): ``columns`` its
    output's, in ``schema`` order; ``every_ms`` the least time between two versions of
    a (key, slot) (0: each call that changes it)."""

    fold: FoldLogic
    columns: tuple[str, ...]
    every_ms: int = 0

    def step(self, key: tuple[Any, ...], state: FoldVersions | None, new: Any, done: int,
             parts: Any, now_ms: int = 0) -> LogicStep:
        inner = KeptRows(self.fold).step(key, state.kept if state else None, new, done,
                                         parts, now_ms)
        final = self._by_slot(inner.out)
        kept: Kept | None = inner.state
        shown = state.shown if state else {}
        early = self._early(key, kept, state, new, done, now_ms)
        slots = {*final, *(s for s in shown if s < done or early is not None),
                 *(s for s, rows in (early or {}).items() if rows)}
        left, out, early_changes = changelog_step(
            {s: s + 1 for s in slots},
            lambda s: final.get(s, []) if s < done else (early or {}).get(s, []),
            shown, done, now_ms, self.every_ms)
        if early is None:  # not looked at: the versions shown stand
            left.update({s: v for s, v in shown.items() if s >= done})
        due = min((v.at_ms + self.every_ms for v in left.values()
                   if now_ms - v.at_ms < self.every_ms), default=None)
        keep = FoldVersions(kept, left, due) if kept is not None or left else None
        delta = self.fold.delta_ms
        return LogicStep(keep, changelog_rows(self.columns, delta, out), inner.wakes,
                         early=changelog_rows(self.columns, delta, early_changes))

    def _early(self, key: tuple[Any, ...], kept: Kept | None, state: FoldVersions | None,
               new: Any, done: int, now_ms: int) -> dict[int, list[Any]] | None:
        """The provisional rows of each pending slot; None where none can differ from
        what was shown or held back: no new rows, no timers (fn's state moved only
        along the slots the last provisional calls ran) and no version held back by
        ``every`` due."""
        due = state.due_ms if state else None
        if (new is None or not len(new)) and self.fold.on_timer is None \
                and (due is None or now_ms < due):
            return None
        if kept is None or kept.rows is None:
            return {}
        got = self.fold.provisional(key, kept.rows, kept.user, kept.timers, done, now_ms)
        return {s: self._rows(out) for s, out in got.items()}

    def _rows(self, out: Any) -> list[tuple[Any, ...]]:
        return row_tuples(out, self.columns, f"stateful {self.fold.name!r}")

    def _by_slot(self, out: Any) -> dict[int, list[tuple[Any, ...]]]:
        """The fold's final rows (fn's and timers') by slot."""
        if out is None or not len(out):
            return {}
        at = out[AT_COL].to_numpy(np.int64)
        return {int(s): self._rows(out[at == s]) for s in np.unique(at)}


def row_tuples(out: Any, columns: tuple[str, ...], what: str) -> list[tuple[Any, ...]]:
    """``fn``'s rows (``out``, pandas or None) as tuples in ``columns`` order (what a
    version compares); ``what`` names the step in the error for a missing column."""
    if out is None or not len(out):
        return []
    missing = [c for c in columns if c not in out.columns]
    if missing:
        raise ValueError(f"{what}: fn returned rows without column {missing[0]!r} of its "
                         "schema")
    return list(zip(*(out[c].tolist() for c in columns), strict=True))


def changelog_rows(columns: tuple[str, ...], delta_ms: int, changes: list[Change]) -> Any:
    """The changelog rows of ``changes`` (each a version's or a tombstone's rows) at
    their slots, with their child indices under the slot's hold; None for none."""
    got = version_rows(columns, changes)
    if got is None:
        return None
    frame, starts, _ = got
    frame.insert(len(columns), SLOT_START_COL, time_column(starts, delta_ms).array)
    frame[AT_COL] = starts
    return frame


def version_rows(columns: tuple[str, ...], changes: list[Change]) -> Any:
    """The rows of ``changes`` (each a version's or a tombstone's rows: tuples in
    ``columns`` order) with ``op``, ``version``, ``is_final`` and each row's child
    index under its hold (version, tombstone, position in the version), and each
    row's change's ``start`` and ``end``; None for none."""
    import pandas as pd

    rows = [(row, c, i) for c in changes for i, row in enumerate(c.values)]
    if not rows:
        return None
    if max(i for _, _, i in rows) >> ROW_BITS:
        raise RuntimeError(f"a version of over {1 << ROW_BITS} rows of one key and slot")
    frame = pd.DataFrame.from_records([r for r, _, _ in rows], columns=list(columns))
    for j, c in enumerate(columns):  # pandas makes longs with a null floats (rounded)
        if frame[c].dtype.kind == "f" and any(isinstance(r[j], int) for r, _, _ in rows):
            frame[c] = pd.Series([r[j] for r, _, _ in rows], dtype=object)
    versions = np.array([c.version for _, c, _ in rows], np.int64)
    gone = np.array([c.tombstone for _, c, _ in rows], bool)
    position = np.array([i for _, _, i in rows], np.int64)
    child = (versions << (ROW_BITS + 1)) + (gone.astype(np.int64) << ROW_BITS) + position
    frame = frame.assign(**{
        OP_COL: np.where(gone, TOMBSTONE, INSERT).astype(object),
        VERSION_COL: versions, FINAL_COL: np.array([c.final for _, c, _ in rows], bool),
        CHILD_COL: EARLY_BASE + child})
    return (frame, np.array([c.start for _, c, _ in rows], np.int64),
            np.array([c.end for _, c, _ in rows], np.int64))


def is_fold(step: Any) -> bool:
    """Is ``step`` a user's fold (``stream.stateful``) that ``speculative()`` may follow?"""
    return isinstance(step, StatefulSpec) and isinstance(step.logic, KeptRows) \
        and isinstance(step.logic.logic, FoldLogic)


def writes_changelog(step: Any) -> bool:
    """Does ``step`` (a stream's last) write a fold's changelog?"""
    return isinstance(step, StatefulSpec) and isinstance(step.logic, SpeculativeFold)


def ddl_names(ddl: str) -> tuple[str, ...]:
    """The column names of a DDL schema (``"n long, `a b` struct<x: int>"``), read
    without Spark (a step is described before a session may exist).

    >>> ddl_names("n long, `a, b` struct<x: int, y: map<string, int>>, d decimal(10,2)")
    ('n', 'a, b', 'd')
    """
    names, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(f"{ddl},"):
        quoted ^= ch == "`"
        if not quoted:
            depth += (ch in "<(") - (ch in ">)")
        if ch == "," and not quoted and depth == 0:
            field = ddl[start:i].strip()
            end = field.index("`", 1) + 1 if field.startswith("`") else \
                len(field.split(None, 1)[0].split(":", 1)[0])
            names.append(field[:end].strip("`"))
            start = i + 1
    return tuple(names)


def make_speculative_fold(step: StatefulSpec, every: str | int | None) -> StatefulSpec:
    """``stream.stateful(...).speculative(every=...)``: ``step`` the fold's step."""
    if writes_changelog(step):
        raise ValueError(f"stateful {step.name!r}: speculative() is given once")
    assert isinstance(step.logic, KeptRows) and isinstance(step.logic.logic, FoldLogic)
    columns = ddl_names(step.schema)
    every_ms = checked_every(f"stateful {step.name!r}", every, {*step.keys, *columns},
                             (SLOT_START_COL, *CHANGELOG_COLS))
    logic = SpeculativeFold(step.logic.logic, columns, every_ms)
    schema = f"{step.schema}, {SLOT_START_COL} timestamp, {CHANGELOG_DDL}"
    return replace(step, logic=logic, schema=schema, eager=every_ms > 0)
