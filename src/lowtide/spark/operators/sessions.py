"""Exact session windows: Spark's ``session_window`` over global time, keyed, each
session emitted once, when it is final.

::

    sessions = (stream
                .session_window("10 seconds", key="user")     # or a Column: per-row gaps
                .agg(n="count", total=("amount", "sum")))

reads like ``df.groupBy("user", F.session_window("ts", "10 seconds")).agg(...)``: the
result rows carry the keys, ``session_window_start`` and ``session_window_end``
(timestamps) and the aggregates (typed as windows type them, :mod:`.window_aggs`).

A row at slot ``s`` opens the session ``[s, s + gap]``; sessions that overlap or touch
are one, as in Spark (a row exactly ``gap`` after the last one joins it). Per-row gaps
(a Column of durations like ``"5 seconds"``, intervals, or ms integers) are rounded up
to whole slots; a row whose gap is null, unreadable or not positive is in no session
(Spark drops it too). The session's end is its last row's slot plus that row's gap.

A session ``[start, end]`` is final once the step's inbound segment is complete through
``end`` (its min time is above ``end``): no row that could join it is still in flight.
Its pending result keeps a hold at ``end`` (rule 7); when a row extends the session,
the hold moves to the new end in the same batch; when sessions merge, their holds
become the merged one's. The result row sits at slot ``end``.

Worked example (gap 5 slots, ``count``): rows at slots 3 and 12 arrive with ``done``
2: sessions ``[3, 8]`` and ``[12, 17]``, wakes ``[8, 17]``. A row at 8 with ``done`` 8:
one session ``[3, 13]`` merges with ``[12, 17]`` into ``[3, 17]`` (3 rows), wakes
``[17]``. A call with ``done`` 18: out ``(30 ms, 170 ms, n 3)`` at slot 17.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.spark.operators.frames import StepError, first_line
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

GAP_COL = "lt_gap"  # a row's own gap, in slots (0: in no session)
BOUNDS = ("session_window_start", "session_window_end")
_INTEGRAL = ("tinyint", "smallint", "int", "bigint")


@dataclass(frozen=True)
class Session:
    """One open session of a key: rows at slots ``start`` to ``end - gap``; a row at
    or below ``end`` still joins it (its hold sits at ``end``)."""

    start: int
    end: int
    aggs: list[Any]


@dataclass(frozen=True)
class SessionLogic:
    """A key's sessions as a slot logic (:mod:`.slot_logic`): ``gap`` in slots (0: each
    row's own, in :data:`GAP_COL`). State: its open sessions, by start."""

    gap: int
    delta_ms: int
    aggs: tuple[TypedAgg, ...]

    def step(self, key: tuple[Any, ...], state: tuple[Session, ...] | None, new: Any,
             done: int, parts: RowParts, now_ms: int = 0) -> LogicStep:
        sessions = list(state or ())
        if new is not None and len(new):
            sessions = self._absorb(sessions, new)
        ready = [s for s in sessions if s.end < done]
        left = tuple(s for s in sessions if s.end >= done)
        return LogicStep(left or None, self._results(ready) if ready else None,
                         np.array([s.end for s in left], np.int64))

    def _absorb(self, sessions: list[Session], new: Any) -> list[Session]:
        """``sessions`` with the rows of ``new`` in them: each run of new rows that
        touch one another a session, then every overlapping or touching pair merged."""
        times = new[SLOT_COL].to_numpy(np.int64)
        gaps = (new[GAP_COL].to_numpy(np.int64) if not self.gap
                else np.full(len(new), self.gap, np.int64))
        ends = times + gaps
        order = np.lexsort((ends, times))
        order = order[gaps[order] > 0]
        ids = new[ID_COL].to_numpy(np.int64)
        t, reach = times[order], np.maximum.accumulate(ends[order])
        cuts = np.r_[np.flatnonzero(np.r_[True, t[1:] > reach[:-1]]), len(order)] \
            if len(order) else np.zeros(0, np.int64)
        runs = [Session(int(t[a]), int(reach[b - 1]), partial(
                    self.aggs, new.iloc[order[a:b]], times[order[a:b]], ids[order[a:b]]))
                for a, b in itertools.pairwise(cuts.tolist())]
        merged: list[Session] = []
        for s in sorted([*sessions, *runs], key=lambda s: (s.start, s.end)):
            last = merged[-1] if merged else None
            if last is not None and s.start <= last.end:
                merged[-1] = Session(last.start, max(last.end, s.end),
                                     merge(self.aggs, last.aggs, s.aggs))
            else:
                merged.append(s)
        return merged

    def _results(self, ready: list[Session]) -> Any:
        """The output rows of final sessions: bounds, aggregates, :data:`AT_COL`."""
        import pandas as pd

        res = pd.DataFrame(result_columns(self.aggs, [results(self.aggs, s.aggs)
                                                      for s in ready]))
        res.insert(0, BOUNDS[0], time_column([s.start for s in ready], self.delta_ms))
        res.insert(1, BOUNDS[1], time_column([s.end for s in ready], self.delta_ms))
        res[AT_COL] = np.array([s.end for s in ready], np.int64)
        return res


@dataclass(frozen=True)
class SessionSpec(KeyedStep):
    """A session window step of a :class:`lowtide.spark.pipeline.stream.Stream`:
    ``gap_ms`` fixed, or ``gap`` a Spark Column (per-row gaps)."""

    name: str
    keys: tuple[str, ...]
    gap_ms: int
    gap: Any
    aggs: tuple[Agg, ...]
    poll_ms: int = 100

    def keyed_input(self, df: Any, delta_ms: int) -> tuple[Any, StatefulSpec]:
        """The step's input (keys, aggregated columns, :data:`GAP_COL` for per-row
        gaps) and the keyed step that sessionizes it."""
        keep = () if self.gap is None else (self._gap_slots(df, delta_ms).alias(GAP_COL),)
        prepared, typed = aggregated_input(df, "session_window", self.name, self.keys,
                                           self.aggs, keep)
        logic = SessionLogic(self.gap_ms // delta_ms, delta_ms, typed)
        return prepared, self.keyed(logic, session_schema(typed))

    def keyed(self, logic: SessionLogic, schema: str) -> StatefulSpec:
        """The keyed step of ``logic``, its output's columns after the keys ``schema``
        (a speculative session window's changes both: :mod:`.speculative_sessions`)."""
        return StatefulSpec(self.name, self.keys, logic, schema, self.poll_ms,
                            what="session_window")

    def _gap_slots(self, df: Any, delta_ms: int) -> Any:
        """Each row's gap in whole slots (rounded up), 0 when null or not positive."""
        from pyspark.errors import PySparkException
        from pyspark.sql import functions as F

        try:
            kind = df.select(self.gap).schema.fields[0].dataType.simpleString()
        except PySparkException as err:
            raise StepError(f"session_window {self.name!r}: gap: {first_line(err)}") from None
        zero = F.timestamp_millis(F.lit(0))
        if kind in _INTEGRAL:
            ms = self.gap.cast("long")
        elif kind == "string":
            ms = F.unix_millis(zero + self.gap.try_cast("interval"))
        elif kind.startswith("interval"):
            ms = F.unix_millis(zero + self.gap)
        else:
            raise StepError(f"session_window {self.name!r}: the gap column is {kind}: give "
                             "durations as strings ('5 seconds'), intervals or ms integers")
        slots = F.when(ms > 0, F.ceil(ms / F.lit(delta_ms)))
        return F.coalesce(slots, F.lit(0)).cast("long")


def session_schema(aggs: tuple[TypedAgg, ...]) -> str:
    """The DDL of a session window's output columns after its keys."""
    cols = [f"{b} timestamp" for b in BOUNDS]
    return ", ".join([*cols, *(f"`{a.agg.out}` {a.out_type()}" for a in aggs)])


def make_sessions(stream: Any, gap: Any, key: Any, name: str, poll_ms: int,
                  delta_ms: int) -> Grouping:
    """The description of ``stream.session_window(gap, key=...)``: ``gap`` a duration
    (a multiple of ``delta_ms``) or a Spark Column."""
    step = f"session_window {name!r}"
    keys = parse_keys(key, step)
    if isinstance(gap, str | int) and not isinstance(gap, bool):
        gap_ms = duration_ms(gap)
        if gap_ms <= 0 or gap_ms % delta_ms:
            raise ValueError(f"{step}: the gap ({gap_ms} ms) must be a positive multiple of "
                             f"delta_ms={delta_ms}")
        gap = None
    elif type(gap).__name__ == "Column":
        gap_ms = 0
    else:
        raise ValueError(f"{step}: gap={gap!r}: give a duration ('5 minutes') or a Column "
                         "of per-row gaps")
    return Grouping(stream, step, keys, BOUNDS,
                    functools.partial(SessionSpec, name, keys, gap_ms, gap, poll_ms=poll_ms))
