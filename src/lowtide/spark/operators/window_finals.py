"""An exact window's results on the driver, from Spark's running values: the slot logic
of :mod:`.window_driver`' driver step, on columns.

Each micro-batch, Spark's aggregation in update mode hands on the (key, window)s it
changed, one row each with its running values (:func:`.speculative_plan.changed_rows`:
the keys, ``lt_key``, the window's last slot, the aggregates as
:func:`.window_aggs.input_columns` hands them over). The state of a key range (or of
the whole window) is one frame: the latest row of each of its open (key, window)s. A
step lays the new rows over it (a (key, window) in both: the new row), hands out the
windows whose end is at or below ``done`` as result rows, and keeps the rest; the
wakes are the kept windows' last slots. Every operation is on columns, none per
window: a backlogged batch changes thousands of windows, and Python per window would
cost more than Spark's aggregation of the batch.

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


@dataclass(frozen=True)
class WindowFinals:
    """The results of an exact window's (key, window)s once ``done`` passes their end,
    over every key of a range; see the module docstring. State: the open
    (key, window)s' latest rows (a pandas DataFrame), None for none."""

    aggs: tuple[TypedAgg, ...]
    size: int  # slots
    delta_ms: int
    keys: tuple[str, ...]

    @property
    def columns(self) -> list[str]:
        """What the state keeps of a changed row."""
        return [*self.keys, KEY_COL, SLOT_COL,
                *helper_columns([a.agg.out for a in self.aggs])]

    def step(self, key: tuple[Any, ...], state: Any, new: Any, done: int,
             parts: RowParts, now_ms: int = 0) -> LogicStep:
        rows = self._latest(state, new)
        if rows is None:
            return LogicStep(None, None, np.zeros(0, np.int64))
        slots = rows[SLOT_COL].to_numpy(np.int64)
        ready = slots < done
        out = self._results(rows[ready]) if ready.any() else None
        left = rows[~ready].reset_index(drop=True)
        return LogicStep(left if len(left) else None, out, np.unique(slots[~ready]))

    def _latest(self, state: Any, new: Any) -> Any:
        """The open (key, window)s' rows: ``state``'s, each replaced by its new row."""
        import pandas as pd

        frames = [f[self.columns] for f in (state, new) if f is not None and len(f)]
        if len(frames) < 2:
            return frames[0] if frames else None
        both = pd.concat(frames, ignore_index=True)
        return both[~both.duplicated([KEY_COL, SLOT_COL], keep="last")]

    def _results(self, rows: Any) -> Any:
        """The result rows of ``rows`` (windows complete): the keys, the window's bounds,
        the aggregates (typed as :func:`.window_aggs.result_columns` types them), and
        :data:`AT_COL`, sorted by slot, then key."""
        import pandas as pd

        rows = rows.sort_values([SLOT_COL, KEY_COL], kind="stable")
        last = rows[SLOT_COL].to_numpy(np.int64)
        cols: dict[str, Any] = {k: rows[k].array for k in self.keys}
        cols["window_start"] = time_column(last + 1 - self.size, self.delta_ms).array
        cols["window_end"] = time_column(last + 1, self.delta_ms).array
        for j, a in enumerate(self.aggs):
            cols[a.agg.out] = result_column(a, rows[f"{VALUE_PREFIX}{j}"],
                                            rows[f"{VALID_PREFIX}{j}"].to_numpy(bool))
        return pd.DataFrame({**cols, AT_COL: last})


def result_column(a: TypedAgg, values: Any, valid: np.ndarray) -> np.ndarray:
    """An aggregate's result column from Spark's value (nulls replaced) and validity
    columns: numbers and timestamps as numpy (null: NaN, NaT), integers with a null and
    every other type as objects (null: None)."""
    kind = TypedAgg(a.agg, 0, a.out_type()).kind
    if kind == "float":
        return np.where(valid, values.to_numpy(np.float64), np.nan)
    if kind == "timestamp":
        return np.where(valid, values.to_numpy("datetime64[ns]"), np.datetime64("NaT"))
    if kind == "int" and valid.all():
        return values.to_numpy(np.int64)
    out = values.to_numpy(object).copy()
    out[~valid] = None
    return out
