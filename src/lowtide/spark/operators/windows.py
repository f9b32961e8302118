"""Exact windows: tumbling and sliding windows over global time, keyed, emitted once
when they are complete.

::

    counts = (stream
              .window("2 seconds", key=["user", "region"])  # slide="1 second": sliding
              .agg(n="count", total=("amount", "sum"), top=("amount", "max"),
                   p90=("amount", "percentile", 0.9)))
    # or .apply(fn, "p50 double")  with fn(pandas.DataFrame of the window's rows) -> dict

reads like ``df.groupBy("user", "region", F.window("ts", "2 seconds")).agg(...)``: the
result rows carry the keys, ``window_start`` and ``window_end`` (timestamps, from the slots via
the grid's ``delta_ms``) and the aggregates.

The operator is a stateful step on the state clock (:mod:`.state_clock`:
``transformWithStateInPandas`` with processing-time timers, RocksDB state; segments
``S_in``, ``S_in.state`` and the outbound one). Its pending outputs are its open
(key, window)s:

* the first row of a (key, window): a hold, sent into ``S_in.state`` at the window's
  last slot ``end - 1`` with value ``child_acks(hash(key), operator id, start)``;
* a complete window: its result row (slot ``end - 1``, ack = child of the hold), sent
  into the outbound segment, and the hold's receive-ack, in the same batch.

A window ``[start, end)`` is complete when ``S_in``'s min time at the batch's
timestamp is ``>= end`` (:meth:`.StateClock.complete_below`). State (aggregates, rows
for ``apply``) lives in the state store and survives restarts from the checkpoint;
holds live in the tracker.

The caveat of :mod:`.state_clock` (a retry across a tracker restart) applies.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lowtide.core.graph import MAX_KEY_RANGES
from lowtide.spark.operators.state_clock import StatefulStep

AGG_FUNCTIONS = ("count", "sum", "min", "max", "mean", "first", "last", "count_distinct",
                 "percentile")
_ALIASES = {"avg": "mean", "countDistinct": "count_distinct", "percentile_approx": "percentile"}

_UNITS = {"ms": 1, "millisecond": 1, "milliseconds": 1, "s": 1000, "second": 1000,
          "seconds": 1000, "sec": 1000, "m": 60_000, "minute": 60_000, "minutes": 60_000,
          "min": 60_000, "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000}


def duration_ms(text: str | int) -> int:
    """``"2 seconds"``, ``"500 milliseconds"``, ``"1 minute"`` or an int (ms).

    >>> duration_ms("2 seconds"), duration_ms("250ms"), duration_ms(100)
    (2000, 250, 100)
    """
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]+)\s*", text)
    if m is None or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a duration: {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


@dataclass(frozen=True)
class Agg:
    out: str
    fn: str  # one of AGG_FUNCTIONS
    column: str | None
    param: float | None = None  # percentile: the fraction


def _agg(name: str, spec: Any) -> Agg:
    if spec == "count" or spec == ("*", "count"):
        return Agg(name, "count", None)
    usage = (f"aggregate {name}={spec!r}: use 'count', (column, one of {AGG_FUNCTIONS}) or "
             "(column, 'percentile', 0.5)")
    if not (isinstance(spec, tuple) and len(spec) in (2, 3) and isinstance(spec[0], str)):
        raise ValueError(usage)
    fn = _ALIASES.get(spec[1], spec[1])
    if fn not in AGG_FUNCTIONS or (len(spec) == 3) != (fn == "percentile"):
        raise ValueError(usage)
    if fn != "percentile":
        return Agg(name, fn, spec[0])
    p = spec[2]
    if not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
        raise ValueError(f"aggregate {name}: the percentile is a fraction in [0, 1], not {p!r}")
    return Agg(name, fn, spec[0], float(p))


def parse_aggs(aggs: dict[str, Any]) -> tuple[Agg, ...]:
    return tuple(_agg(name, spec) for name, spec in aggs.items())


def checked_aggs(step: str, keys: tuple[str, ...], taken: tuple[str, ...],
                 aggs: dict[str, Any]) -> tuple[Agg, ...]:
    """The aggregates of ``step`` (e.g. "window 'w'"), at least one, none named like a
    key or a column the step adds (``taken``)."""
    if not aggs:
        raise ValueError("agg() needs at least one aggregate")
    clash = (set(keys) | set(taken)) & set(aggs)
    if clash:
        raise ValueError(f"{step}: aggregate name {sorted(clash)[0]!r} is taken by a key or "
                         f"a column it adds ({', '.join(taken)})")
    return parse_aggs(aggs)


@dataclass(frozen=True)
class Grouping:
    """A keyed aggregation being described (``groupBy``, ``session_window``):
    :meth:`agg` finishes it with ``spec(aggregates)``, the step's description."""

    stream: Any
    step: str  # e.g. "groupBy 'g'", for errors
    keys: tuple[str, ...]
    taken: tuple[str, ...]  # the columns the step adds besides the keys
    spec: Callable[[tuple[Agg, ...]], Any]

    def agg(self, **aggs: Any) -> Any:
        """The aggregates of :meth:`WindowedStream.agg`."""
        return self.stream._then(self.spec(checked_aggs(self.step, self.keys, self.taken,
                                                        aggs)))


def parse_keys(key: Any, what: str = "window") -> tuple[str, ...]:
    """``"user"`` or ``["user", "region"]``: the key columns of a ``what`` step."""
    keys = (key,) if isinstance(key, str) else tuple(key) if isinstance(key, list | tuple) \
        else ()
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise ValueError(f"{what} key {key!r}: give a column name or a list of them")
    if len(set(keys)) != len(keys):
        raise ValueError(f"{what} key {key!r}: a column twice")
    return keys


@dataclass(frozen=True)
class WindowSpec(StatefulStep):
    """A window step of a :class:`lowtide.spark.pipeline.builder.Stream`."""

    name: str
    keys: tuple[str, ...]
    size_ms: int
    slide_ms: int
    aggs: tuple[Agg, ...] = ()
    fn: Callable[[Any], Any] | None = None
    fn_schema: str | None = None
    poll_ms: int = 100
    #: 0, or how many key ranges the window's inbound segment is split into (rule 15):
    #: a row's range is its front's (``front % key_ranges``, or ``front_ranges``), the
    #: window of a key is emitted once its range is complete
    key_ranges: int = 0
    front_ranges: tuple[tuple[int, int], ...] = ()  # (front, its range); () for f % N


@dataclass(frozen=True)
class WindowedStream:
    """``stream.window(...)``; finish with :meth:`agg` or :meth:`apply`."""

    stream: Any
    name: str
    keys: tuple[str, ...]
    size_ms: int
    slide_ms: int
    poll_ms: int = 100
    key_ranges: int = 0
    front_ranges: tuple[tuple[int, int], ...] = ()

    def agg(self, **aggs: Any) -> Any:
        """``name="count"``, ``name=(column, fn)`` with fn one of ``count``, ``sum``,
        ``min``, ``max``, ``mean`` (``avg``), ``first``, ``last``, ``count_distinct``,
        or ``name=(column, "percentile", 0.5)``; typed as Spark types them (see
        :mod:`.window_aggs`)."""
        parsed = checked_aggs(f"window {self.name!r}", self.keys,
                              ("window_start", "window_end"), aggs)
        spec = WindowSpec(self.name, self.keys, self.size_ms, self.slide_ms, parsed,
                          poll_ms=self.poll_ms, key_ranges=self.key_ranges,
                          front_ranges=self.front_ranges)
        return self.stream._then(spec)

    def count(self) -> Any:
        return self.agg(count="count")

    def apply(self, fn: Callable[[Any], Any], schema: str) -> Any:
        """``fn(rows: pandas.DataFrame) -> dict`` (one result row) or a DataFrame (one
        result row per row), columns as in the DDL ``schema``; called once per window
        with all its rows (without the tracking columns), when it is complete."""
        spec = WindowSpec(self.name, self.keys, self.size_ms, self.slide_ms, (), fn, schema,
                          self.poll_ms, self.key_ranges, self.front_ranges)
        return self.stream._then(spec)


def make_windowed(stream: Any, size: str | int, key: Any, slide: str | int | None,
                  name: str, poll_ms: int, delta_ms: int, key_ranges: int = 0,
                  front_ranges: dict[int, int] | None = None) -> WindowedStream:
    if key_ranges and not 2 <= key_ranges <= MAX_KEY_RANGES:
        raise ValueError(f"window {name!r}: key_ranges={key_ranges}; use 0 (none) or "
                         f"2..{MAX_KEY_RANGES}")
    pairs = tuple(sorted((int(f), int(r)) for f, r in (front_ranges or {}).items()))
    if pairs and not key_ranges:
        raise ValueError(f"window {name!r}: front_ranges needs key_ranges=N")
    if any(not 0 <= r < key_ranges or f < 0 for f, r in pairs):
        raise ValueError(f"window {name!r}: front_ranges maps front ids (>= 0) to ranges "
                         f"0..{key_ranges - 1}, got {dict(pairs)}")
    size_ms = duration_ms(size)
    slide_ms = duration_ms(slide) if slide is not None else size_ms
    if size_ms % delta_ms or slide_ms % delta_ms:
        raise ValueError(f"window size and slide must be multiples of delta_ms={delta_ms}")
    if slide_ms <= 0 or size_ms % slide_ms:
        raise ValueError("the window size must be a positive multiple of the slide")
    return WindowedStream(stream, name, parse_keys(key), size_ms, slide_ms, poll_ms,
                          key_ranges, pairs)
