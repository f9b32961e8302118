"""Early results of ``apply()`` windows (rule 13): ``stream.window(...).apply(fn,
schema).speculative(every=None)``, a changelog of ``fn``'s rows per (key, window).

::

    def p50(rows):                              # all the window's rows, as without it
        return {"p50": rows["amount"].median()}

    changes = stream.window("10 seconds", key="user").apply(p50, "p50 double").speculative()

``fn`` is called as without ``speculative()`` once per complete window, on all its
rows: those rows are the window's final version (``is_final``). Besides, each
micro-batch that brings a pending window rows calls ``fn`` *provisionally* on the
window's rows so far (the same order: slot, then ack id): what the window would emit
if it were complete now. A window whose provisional rows differ from its last version
shows a new version, preceded by one tombstone per row of the last one; a call that
returns no rows shows a version of no rows (only the tombstones). When the window
completes, the tombstones of its last version come first, then the final rows.

The changelog's columns: the keys, ``window_start``, ``window_end``, ``fn``'s columns
(``schema``), ``op``, ``version``, ``is_final``; a version is (key, window,
``version``), all its rows (as a fold's, :mod:`.speculative_fold`); a tombstone
repeats one row of the version it cancels. ``every`` bounds re-emission as for an
aggregating window: a change within ``every`` of the last version is held back and
shown by a later call (a poll), the final never waits.

Rules: every row sits at the window's last slot ``end - 1``, a child of the hold the
window keeps there with its own index (:data:`.speculative.EARLY_BASE` + version,
tombstone and position in the version), so a downstream min time past the window
covers every version and tombstone; the final version is sent with the hold's
release. The provisional rows are a function of the window's stored rows, the batch's
rows and the stored versions: a retried task or a batch re-run after a restart emits
the same versions with the same acks (rules 5 and 6). The cost: a provisional call of
``fn`` over all the window's rows so far per micro-batch that brings it rows.

Worked example (size 10 slots, ``fn`` = the rows' count as one row): rows at slots 3
and 7 with ``done = 2``: early ``insert v1 n=2`` at slot 9. A row at 8 with ``done =
5``: ``tombstone v1 n=2``, ``insert v2 n=3``. A call with ``done = 12``: out
``tombstone v2 n=3``, ``insert v3 n=3 final`` at slot 9 (the hold is released).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.spark.operators.keyed_state import KeyedStep, StatefulSpec
from lowtide.spark.operators.slot_logic import AT_COL, LogicStep, RowParts
from lowtide.spark.operators.speculative import Shown, changelog_step, checked_every
from lowtide.spark.operators.speculative_fold import ddl_names, row_tuples, version_rows
from lowtide.spark.operators.window_aggs import time_column
from lowtide.spark.operators.window_state import Pane, WindowLogic, output_schema
from lowtide.spark.operators.windows import WindowSpec
from lowtide.spark.sinks.changelog import CHANGELOG_DDL


@dataclass(frozen=True)
class ApplyVersions:
    """A key's state: its open windows (:class:`.window_state.Pane`, by start), the
    version each last showed (its values: ``fn``'s rows as tuples) and the windows
    whose change ``every`` held back."""

    panes: dict[int, Pane]
    shown: dict[int, Shown]
    held: frozenset[int] = frozenset()


@dataclass(frozen=True)
class SpeculativeApply:
    """The window logic ``window`` (``apply``) with early versions (see the module
    docstring): ``columns`` ``fn``'s, in ``schema`` order; ``every_ms`` the least time
    between two versions of a (key, window) (0: each call that changes it)."""

    name: str
    window: WindowLogic
    columns: tuple[str, ...]
    every_ms: int = 0

    def step(self, key: tuple[Any, ...], state: ApplyVersions | None, new: Any, done: int,
             parts: RowParts, now_ms: int = 0) -> LogicStep:
        inner = self.window.step(key, state.panes if state else None, new, done, parts,
                                 now_ms)
        panes: dict[int, Pane] = inner.state or {}
        shown = state.shown if state else {}
        held = state.held if state else frozenset()
        final = self._by_window(inner.out)
        ready = {*final, *(set(state.panes) - set(panes) if state else ())}
        look = {a[0] for a in inner.appends} | {
            s for s in held if s in panes and now_ms - shown[s].at_ms >= self.every_ms}
        early = {s: self._provisional(panes[s], parts, inner.appends) for s in look}
        left, out, changes = changelog_step(
            {s: s + self.window.size for s in {*ready, *early}},
            lambda s: final.get(s, []) if s in ready else early[s], shown, done, now_ms,
            self.every_ms)
        left.update({s: v for s, v in shown.items() if s in panes and s not in early})
        held = frozenset({s for s in held if s in panes and s not in early} | {
            s for s in early if left.get(s) is shown.get(s)
            and repr(early[s]) != repr(shown[s].values)})
        keep = ApplyVersions(panes, left, held) if panes else None
        return LogicStep(keep, self._frame(out), inner.wakes, inner.appends, inner.drops,
                         early=self._frame(changes))

    def _provisional(self, pane: Pane, parts: RowParts,
                     appends: tuple[tuple[int, int, Any], ...]) -> list[tuple[Any, ...]]:
        """``fn``'s rows over the pending window's rows so far (stored and new)."""
        fresh = [rows for start, _, rows in appends if start == pane.start]
        return self._rows(self.window._apply(pane, parts, fresh))

    def _rows(self, out: Any) -> list[tuple[Any, ...]]:
        return row_tuples(out, self.columns, f"window {self.name!r}")

    def _by_window(self, out: Any) -> dict[int, list[tuple[Any, ...]]]:
        """The final rows of the windows complete in this call, by window start."""
        if out is None or not len(out):
            return {}
        at = out[AT_COL].to_numpy(np.int64)
        return {int(s) + 1 - self.window.size: self._rows(out[at == s]) for s in np.unique(at)}

    def _frame(self, changes: list[Any]) -> Any:
        """The changelog rows of ``changes`` at their windows' last slots."""
        got = version_rows(self.columns, changes)
        if got is None:
            return None
        frame, starts, ends = got
        delta = self.window.delta_ms
        frame.insert(0, "window_start", time_column(starts, delta).array)
        frame.insert(1, "window_end", time_column(ends, delta).array)
        frame[AT_COL] = ends - 1
        return frame


@dataclass(frozen=True)
class SpeculativeApplySpec(KeyedStep):
    """An ``apply`` window step with early versions: ``window`` its exact description,
    ``every_ms`` the least time between two versions of a (key, window) (0: none)."""

    name: str
    window: WindowSpec
    every_ms: int = 0

    def keyed_input(self, df: Any, delta_ms: int) -> tuple[Any, StatefulSpec]:
        from lowtide.spark.operators.state_clock import check_keys
        from lowtide.spark.tracking.column import TRACKING_COLS

        w = self.window
        fields = [f.name for f in df.schema.fields if f.name not in TRACKING_COLS]
        check_keys(f"window {w.name!r}", w.keys,
                   {f.name: f.dataType.simpleString() for f in df.schema.fields})
        logic = WindowLogic(w.size_ms // delta_ms, w.slide_ms // delta_ms, delta_ms, (), w.fn,
                            tuple(fields))
        columns = ddl_names(w.fn_schema or "")
        schema = f"{output_schema(w, ())}, {CHANGELOG_DDL}"
        return df, StatefulSpec(w.name, w.keys,
                                SpeculativeApply(w.name, logic, columns, self.every_ms),
                                schema, w.poll_ms, what="window", eager=self.every_ms > 0)


def make_speculative_apply(step: WindowSpec, every: str | int | None) -> SpeculativeApplySpec:
    """``stream.window(...).apply(fn, schema).speculative(every=...)``."""
    what = f"window {step.name!r}"
    columns = {*step.keys, *ddl_names(step.fn_schema or "")}
    return SpeculativeApplySpec(step.name, step, checked_every(what, every, columns))
