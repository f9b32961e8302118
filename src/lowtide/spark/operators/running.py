"""Aggregation without a window: ``groupBy(k).agg(...)``, the exact running result per
key, emitted per completed time range.

::

    counts = words.groupBy("word").count()                       # a running word count
    totals = events.groupBy("user", every="1 minute").agg(n="count", spent=("amount", "sum"))

Global time is cut into ranges of ``every`` (default: one slot, ``delta_ms``), aligned
to the epoch. For each key and each range in which the key has rows, once the step's
inbound segment is complete to the range's end, one row: the keys, the aggregates over
EVERY row of the key below that end (all earlier ranges too), and ``as_of``, the
range's end (a timestamp): the running result as of that time. A key without rows in a
range emits nothing for it (what Spark's ``update`` mode shows, but final). So the
output equals a batch aggregation of each key's rows below each ``as_of``, whatever the
micro-batches, lags and retries were.

The aggregates are the windows' (:mod:`.window_aggs`, typed as Spark types them); a
key's partial states live in the state store for ever, as Spark's running aggregation
keeps them (``count_distinct`` and ``percentile`` keep the key's values). Each pending
range keeps a hold at its last slot (rule 7); its row sits there.

Worked example (``every`` 10 slots, ``count``): rows at slots 3, 7 and 12 arrive with
``done`` 2: ranges ``[0, 10)`` (2 rows) and ``[10, 20)`` (1), wakes ``[9, 19]``. A call
with ``done`` 20: out ``(n 2, as_of 100 ms)`` at slot 9 and ``(n 3, as_of 200 ms)`` at
slot 19; the key's state keeps the running count 3.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.spark.operators.keyed_state import KeyedStep, StatefulSpec
from lowtide.spark.operators.slot_logic import AT_COL, ID_COL, SLOT_COL, LogicStep, RowParts
from lowtide.spark.operators.window_aggs import (
    TypedAgg,
    aggregated_input,
    merge,
    partial,
    result_columns,
    results,
    time_column,
)
from lowtide.spark.operators.windows import Agg, Grouping, duration_ms, parse_keys

AS_OF = "as_of"


@dataclass(frozen=True)
class Running:
    """A key's state: the partial states over every range emitted (None: none yet) and
    those of the ranges still pending, by start slot."""

    total: list[Any] | None
    ranges: dict[int, list[Any]]


@dataclass(frozen=True)
class RunningLogic:
    """A key's running aggregation as a slot logic (:mod:`.slot_logic`), ``every`` in
    slots."""

    every: int
    delta_ms: int
    aggs: tuple[TypedAgg, ...]

    def step(self, key: tuple[Any, ...], state: Running | None, new: Any, done: int,
             parts: RowParts, now_ms: int = 0) -> LogicStep:
        total, ranges = (None, {}) if state is None else (state.total, dict(state.ranges))
        self.absorb(ranges, new)
        values, ends = [], []
        for start in sorted(s for s in ranges if s + self.every <= done):
            part = ranges.pop(start)
            total = part if total is None else merge(self.aggs, total, part)
            values.append(results(self.aggs, total))
            ends.append(start + self.every)
        wakes = np.array(sorted(s + self.every - 1 for s in ranges), np.int64)
        return LogicStep(Running(total, ranges), self._rows(values, ends) if ends else None,
                         wakes)

    def absorb(self, ranges: dict[int, list[Any]], new: Any) -> None:
        """Fold the rows of ``new`` (or None) into their ranges' partial states."""
        if new is None or not len(new):
            return
        times = new[SLOT_COL].to_numpy(np.int64)
        ids = new[ID_COL].to_numpy(np.int64)
        starts = times - times % self.every
        for start in np.unique(starts).tolist():
            mine = starts == start
            part = partial(self.aggs, new[mine], times[mine], ids[mine])
            ranges[start] = part if start not in ranges else merge(self.aggs,
                                                                   ranges[start], part)

    def _rows(self, values: list[list[Any]], ends: list[int]) -> Any:
        import pandas as pd

        res = pd.DataFrame(result_columns(self.aggs, values))
        res[AS_OF] = time_column(ends, self.delta_ms)
        res[AT_COL] = np.array(ends, np.int64) - 1
        return res


@dataclass(frozen=True)
class GroupedSpec(KeyedStep):
    """A ``groupBy(keys).agg(...)`` step: ``every_ms`` the length of a range."""

    name: str
    keys: tuple[str, ...]
    every_ms: int
    aggs: tuple[Agg, ...]
    poll_ms: int = 100

    def keyed_input(self, df: Any, delta_ms: int) -> tuple[Any, StatefulSpec]:
        prepared, typed = aggregated_input(df, "groupBy", self.name, self.keys, self.aggs)
        cols = [f"`{a.agg.out}` {a.out_type()}" for a in typed] + [f"{AS_OF} timestamp"]
        logic = RunningLogic(self.every_ms // delta_ms, delta_ms, typed)
        return prepared, self.keyed(logic, ", ".join(cols))

    def keyed(self, logic: RunningLogic, schema: str) -> StatefulSpec:
        """The keyed step of ``logic``, its output's columns after the keys ``schema``
        (a speculative ``groupBy`` changes both: :mod:`.speculative_running`)."""
        return StatefulSpec(self.name, self.keys, logic, schema, self.poll_ms, what="groupBy")


def make_grouped(stream: Any, cols: tuple[Any, ...], every: str | int | None, name: str,
                 poll_ms: int, delta_ms: int) -> Grouping:
    """The description of ``stream.groupBy(*cols, every=...)``: column names (or one
    list of them); ``every`` a multiple of ``delta_ms`` (None: ``delta_ms``)."""
    names = cols[0] if len(cols) == 1 and isinstance(cols[0], list | tuple) else cols
    if not names:
        raise ValueError(f"groupBy {name!r}: give the key columns (for one running result "
                         "over all rows, group by a constant column: with_column)")
    keys = parse_keys(list(names), f"groupBy {name!r}")
    every_ms = delta_ms if every is None else duration_ms(every)
    if every_ms <= 0 or every_ms % delta_ms:
        raise ValueError(f"groupBy {name!r}: every={every!r} must be a positive multiple of "
                         f"delta_ms={delta_ms}")
    return Grouping(stream, f"groupBy {name!r}", keys, (AS_OF,),
                    functools.partial(GroupedSpec, name, keys, every_ms, poll_ms=poll_ms))
