"""Early results of session windows (rule 13): ``stream.session_window(gap,
key=...).agg(...).speculative(every=None)``, a changelog of each session's versions.

::

    changes = (stream.session_window("10 seconds", key="user").agg(n="count")
               .speculative())

The changelog is a speculative window's (:mod:`.speculative`) with the session's
bounds: the keys, ``session_window_start``, ``session_window_end``, the aggregates,
``op``, ``version``, ``is_final``. A session's bounds change as rows arrive (a row
extends it, sessions merge), so a version carries the bounds it had: its tombstone
repeats them, and the next version shows the new ones.

A session keeps its identity (its *origin*: the slot it started at when it was first
seen) across versions. When sessions merge, the merged one goes on with the versions
of the one that starts first (the others were shown, each with its own versions):
each other session's last version is cancelled by a tombstone, and the merged one
shows its next version, at once (a merge is never held back by ``every``). The final
version comes once the session is final (its end below ``done``, as without
``speculative()``): the tombstone of the last version first.

Tracking: every row of a call sits at the session's end at that call, the slot of the
hold the session keeps (which moves with the end, :mod:`.sessions`): early rows are
children of that hold with their own index (:data:`.speculative.EARLY_BASE`, the
session's origin below the end, the version and insert or tombstone), the final is
sent with the hold's release. A session's ends only grow, so every version and
tombstone of it sits at or below its final end: a downstream min time past that end
covers them all. Versions come from the state in the store: a retried task or a
batch re-run after a restart emits the same versions with the same acks (rules 5, 6).

Worked example (gap 5 slots, ``count``, every batch): rows at slots 3 and 12 with
``done = 2``: sessions ``[3, 8]`` and ``[12, 17]`` each show ``insert v1`` (at 8 and
17). A row at 8 with ``done = 8``: one session ``[3, 17]``; at 17: ``tombstone v1
[3, 8] n=1``, ``insert v2 [3, 17] n=3`` (the session from 3 goes on) and ``tombstone
v1 [12, 17] n=1`` (the session from 12 is gone). A call with ``done = 18``: out
``tombstone v2``, ``insert v3 [3, 17] n=3 final`` at 17 (the hold is released).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.spark.operators.keyed_state import StatefulSpec
from lowtide.spark.operators.sessions import (
    BOUNDS,
    Session,
    SessionLogic,
    SessionSpec,
)
from lowtide.spark.operators.slot_logic import AT_COL, CHILD_COL, LogicStep, RowParts
from lowtide.spark.operators.speculative import (
    EARLY_BASE,
    Change,
    Shown,
    aggs_every,
    changelog_keyed_step,
    show,
)
from lowtide.spark.operators.window_aggs import result_columns, results, time_column
from lowtide.spark.sinks.changelog import (
    FINAL_COL,
    INSERT,
    OP_COL,
    TOMBSTONE,
    VERSION_COL,
)

#: an early row's child index: the session's origin below its end, above this bit
ORIGIN_SHIFT = 32
#: the longest session (in slots) whose early rows' child indices stay apart
MAX_SLOTS = 1 << 30


@dataclass(frozen=True)
class Seen:
    """A session's identity (``origin``: its start when first seen) and the version it
    last showed (its values: the bounds, then the aggregates)."""

    origin: int
    shown: Shown


@dataclass(frozen=True)
class SessionVersions:
    """A key's state: its open sessions and what each showed, by the session's start."""

    sessions: tuple[Session, ...]
    seen: dict[int, Seen]


@dataclass(frozen=True)
class Row:
    """One changelog row of a call: ``change`` of the session with ``origin``, sent at
    the slot ``at`` (the session's end now)."""

    change: Change
    origin: int
    at: int


@dataclass(frozen=True)
class SpeculativeSessions:
    """The session logic ``sessions`` with early versions, re-emitted at most every
    ``every_ms`` (0: every call that changes a session)."""

    sessions: SessionLogic
    every_ms: int = 0

    def step(self, key: tuple[Any, ...], state: SessionVersions | None, new: Any, done: int,
             parts: RowParts, now_ms: int = 0) -> LogicStep:
        before = list(state.sessions) if state else []
        seen = state.seen if state else {}
        now = self.sessions._absorb(before, new) if new is not None and len(new) else before
        out: list[Row] = []
        early: list[Row] = []
        left: dict[int, Seen] = {}
        for s in now:
            was = [seen[b.start] for b in before
                   if s.start <= b.start <= s.end and b.start in seen]
            rows, kept = self._versions(s, was, done, now_ms)
            (out if s.end < done else early).extend(rows)
            if kept is not None:
                left[s.start] = kept
        pending = tuple(s for s in now if s.end >= done)
        delta = self.sessions.delta_ms
        return LogicStep(SessionVersions(pending, left) if pending else None,
                         self._frame(out, delta), np.array([s.end for s in pending], np.int64),
                         early=self._frame(early, delta))

    def _versions(self, s: Session, was: list[Seen], done: int, now_ms: int
                  ) -> tuple[list[Row], Seen | None]:
        """The rows of session ``s``, made of the sessions ``was`` (ascending start:
        the first goes on, the others are cancelled), and what it keeps."""
        first = was[0] if was else None
        origin = first.origin if first else s.start
        prev = first.shown if first else None
        gone = [Row(Change(*w.shown.values[:2], w.shown.values, w.shown.version, True, False),
                    w.origin, s.end) for w in was[1:]]
        final = s.end < done
        if not final and not gone and prev is not None and now_ms - prev.at_ms < self.every_ms:
            return [], first  # shown too recently: a later call (a poll) shows the change
        values = [s.start, s.end, *results(self.sessions.aggs, s.aggs)]
        changes, shown = show(s.start, s.end, values, prev, now_ms, final)
        rows = gone + [Row(c, origin, s.end) for c in changes]
        if final:
            return rows, None
        return rows, Seen(origin, shown) if shown is not None else first

    def _frame(self, rows: list[Row], delta_ms: int) -> Any:
        """The changelog rows of ``rows`` at their sessions' ends, each with its child
        index under that slot's hold (unique: a session's origin is below its end and
        no two sessions that show at one hold share one); None for none."""
        import pandas as pd

        if not rows:
            return None
        values = [r.change.values for r in rows]
        at = np.array([r.at for r in rows], np.int64)
        below = at - np.array([r.origin for r in rows], np.int64)
        if below.max() >= MAX_SLOTS:
            raise RuntimeError(f"a speculative session of over {MAX_SLOTS} slots")
        versions = np.array([r.change.version for r in rows], np.int64)
        gone = np.array([r.change.tombstone for r in rows], bool)
        cols = {BOUNDS[0]: time_column([v[0] for v in values], delta_ms),
                BOUNDS[1]: time_column([v[1] for v in values], delta_ms),
                **result_columns(self.sessions.aggs, [v[2:] for v in values])}
        return pd.DataFrame({
            **{k: v.array if isinstance(v, pd.Series) else v for k, v in cols.items()},
            OP_COL: np.where(gone, TOMBSTONE, INSERT).astype(object),
            VERSION_COL: versions, FINAL_COL: np.array([r.change.final for r in rows], bool),
            AT_COL: at, CHILD_COL: EARLY_BASE + (below << ORIGIN_SHIFT) + 2 * versions + gone})


@dataclass(frozen=True)
class SpeculativeSessionSpec(SessionSpec):
    """A session window step with early rows (its changelog), ``every_ms`` the least
    time between two versions of a session (0: none)."""

    every_ms: int = 0

    def keyed(self, logic: SessionLogic, schema: str) -> StatefulSpec:
        return changelog_keyed_step(self, SpeculativeSessions(logic, self.every_ms),
                                    schema, "session_window", self.every_ms)


def make_speculative_sessions(step: SessionSpec, every: str | int | None
                              ) -> SpeculativeSessionSpec:
    """``stream.session_window(...).agg(...).speculative(every=...)``."""
    every_ms = aggs_every(f"session_window {step.name!r}", step, every,
                          isinstance(step, SpeculativeSessionSpec))
    return SpeculativeSessionSpec(step.name, step.keys, step.gap_ms, step.gap, step.aggs,
                                  step.poll_ms, every_ms)


def writes_session_changelog(step: Any) -> bool:
    """Does ``step`` (a stream's last) write a session window's changelog?"""
    return isinstance(step, SpeculativeSessionSpec)
