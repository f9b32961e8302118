"""An exact window's results on the driver, from Spark's running values: the slot logic
of :mod:`.window_driver`' driver step, on columns.

Each micro-batch, Spark's aggregation in update mode hands on the (key, window)s it
changed, one row each with its running values (:func:`.speculative_plan.changed_rows`:
the keys, ``lt_key``, the window's last slot, the aggregates as
:func:`.window_aggs.input_columns` hands them over). The state of a key range (or of
the whole window) is the latest row of each of its open (key, window)s, as plain
columns. A step lays the new rows over it (a (key, window) in both: the new row),
hands out the windows whose end is at or below ``done`` as result rows, and keeps the
rest; the wakes are the kept windows' last slots. The work is on numpy columns: a
backlogged batch changes thousands of windows, and Python objects per window (or a
pandas operation per range, about a millisecond each whatever the rows) would cost
more than the step's few milliseconds.

Result rows at a slot are in key order (``lt_key``, the keys' JSON), so a batch run
again hands them out in the same order, each the same child of its slot's hold
(rules 5 and 6).

Worked example (size 10 slots, ``count``): ``(a, last 9, n 2)`` with ``done = 2``:
nothing out, wakes ``[9]``. ``(a, last 9, n 3), (b, last 19, n 1)`` with
``done = 12``: out ``(a, window [0, 10), n 3)`` at slot 9, wakes ``[19]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.spark.operators.joins import KEY_COL
from lowtide.spark.operators.slot_logic import AT_COL, SLOT_COL, LogicStep, RowParts
from lowtide.spark.operators.window_aggs import (
    VALID_PREFIX,
    VALUE_PREFIX,
    TypedAgg,
    helper_columns,
    time_column,
)

#: the open (key, window)s' rows: column -> values, one entry per (key, window)
Columns = dict[str, np.ndarray]


@dataclass(frozen=True)
class WindowFinals:
    """The results of an exact window's (key, window)s once ``done`` passes their end,
    over every key of a range; see the module docstring. State: :data:`Columns` (plain
    arrays: a pandas operation costs a millisecond whatever the rows, and a step runs
    per range and batch), None for none."""

    aggs: tuple[TypedAgg, ...]
    size: int  # slots
    delta_ms: int
    keys: tuple[str, ...]

    @property
    def columns(self) -> list[str]:
        """What the state keeps of a changed row."""
        return [*self.keys, KEY_COL, SLOT_COL,
                *helper_columns([a.agg.out for a in self.aggs])]

    def step(self, key: tuple[Any, ...], state: Columns | None, new: Any, done: int,
             parts: RowParts, now_ms: int = 0) -> LogicStep:
        rows = self._latest(state, new)
        if rows is None:
            return LogicStep(None, None, np.zeros(0, np.int64))
        slots = rows[SLOT_COL]
        ready = slots < done
        out = self._results(_take(rows, ready)) if ready.any() else None
        left = None if ready.all() else _take(rows, ~ready)
        return LogicStep(left, out, np.unique(slots[~ready]))

    def _latest(self, state: Columns | None, new: Any) -> Columns | None:
        """The open (key, window)s' rows: ``state``'s, each replaced by its new row."""
        fresh = None if new is None or not len(new) else {
            c: new[c].to_numpy(np.int64) if c == SLOT_COL else new[c].to_numpy()
            for c in self.columns}
        if state is not None and KEY_COL not in state:  # fail closed, in one line
            raise ValueError("this window's state in the checkpoint was written by a 0.2 "
                             "development build before its columnar step: start the "
                             "query from a new checkpoint")
        if state is None or fresh is None:
            return state if fresh is None else fresh
        changed = set(zip(fresh[KEY_COL].tolist(), fresh[SLOT_COL].tolist(), strict=True))
        kept = np.fromiter((w not in changed for w in zip(
            state[KEY_COL].tolist(), state[SLOT_COL].tolist(), strict=True)),
            bool, len(state[SLOT_COL]))
        return {c: np.concatenate([state[c][kept], fresh[c]]) for c in self.columns}

    def _results(self, rows: Columns) -> Any:
        """The result rows of ``rows`` (windows complete): the keys, the window's bounds,
        the aggregates (typed as :func:`.window_aggs.result_columns` types them), and
        :data:`AT_COL`, sorted by slot, then key."""
        import pandas as pd

        rows = _take(rows, np.lexsort((rows[KEY_COL], rows[SLOT_COL])))
        last = rows[SLOT_COL]
        cols: dict[str, Any] = {k: rows[k] for k in self.keys}
        cols["window_start"] = time_column(last + 1 - self.size, self.delta_ms).array
        cols["window_end"] = time_column(last + 1, self.delta_ms).array
        for j, a in enumerate(self.aggs):
            cols[a.agg.out] = result_column(a, rows[f"{VALUE_PREFIX}{j}"],
                                            rows[f"{VALID_PREFIX}{j}"].astype(bool))
        return pd.DataFrame({**cols, AT_COL: last})


def _take(rows: Columns, at: np.ndarray) -> Columns:
    return {c: v[at] for c, v in rows.items()}


def result_column(a: TypedAgg, values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """An aggregate's result column from Spark's value (nulls replaced) and validity
    columns: numbers and timestamps as numpy (null: NaN, NaT), integers with a null and
    every other type as objects (null: None)."""
    kind = TypedAgg(a.agg, 0, a.out_type()).kind
    if kind == "float":
        return np.where(valid, values.astype(np.float64), np.nan)
    if kind == "timestamp":
        return np.where(valid, values.astype("datetime64[ns]"), np.datetime64("NaT"))
    if kind == "int" and valid.all():
        return values.astype(np.int64)
    out = values.astype(object)
    out[~valid] = None
    return out
