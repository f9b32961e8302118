"""Typed window aggregates: what an exact window computes, kept apart from when it
emits (the window's slot logic is in :mod:`.window_state`).

Results are typed as Spark types them: ``count`` and ``count_distinct`` long; ``sum``
of integers long, of decimals ``decimal(p + 10, s)``, of floats double; ``mean`` of
numbers double, of decimals ``decimal(p + 4, s + 4)`` (rounded half up); ``min``,
``max``, ``first``, ``last`` and ``percentile`` the column's own type. Nulls are
skipped (an aggregate of no value is null, a count 0). ``first`` / ``last`` are the
value of the earliest / latest row in global time (ties: the smaller ack id), so every
attempt picks the same row. ``percentile`` is exact: the smallest value such that at
least ``p`` of the values are at or below it, what Spark's ``percentile_approx``
returns at full accuracy; it keeps the window's values in state until the window
closes (as ``count_distinct`` keeps the distinct ones).

Values cross into pandas without loss: the JVM hands each aggregated column over as
``lt_agg<j>`` with nulls replaced (integers and floats by 0) and a validity column
``lt_valid<j>``, because pandas would turn an integer column with nulls into doubles
(longs above 2**53 rounded). Everything is checked against the input schema when the
plan is built: unknown columns and unsupported types raise there, naming the column.

Partial states are plain Python values (ints, Decimals, strings, ns integers for
timestamps), merged across micro-batches and pickled into the state store.
"""

from __future__ import annotations

import decimal
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.spark.operators.windows import Agg

VALUE_PREFIX = "lt_agg"
VALID_PREFIX = "lt_valid"
NUMERIC = ("tinyint", "smallint", "int", "bigint", "float", "double")
ORDERABLE = (*NUMERIC, "string", "binary", "boolean", "date", "timestamp", "timestamp_ntz")
# Python's Decimal context must hold a 38-digit sum exactly
_EXACT = decimal.Context(prec=80, rounding=decimal.ROUND_HALF_UP)


def _kind(type_name: str) -> str:
    """How values of a Spark type travel through pandas."""
    if type_name in ("tinyint", "smallint", "int", "bigint"):
        return "int"
    if type_name in ("float", "double"):
        return "float"
    if type_name.startswith("decimal"):
        return "decimal"
    if type_name.startswith("timestamp"):
        return "timestamp"
    return "object"


def _decimal(type_name: str) -> tuple[int, int]:
    p, s = type_name[len("decimal("):-1].split(",")
    return int(p), int(s)


@dataclass(frozen=True)
class TypedAgg:
    """An aggregate bound to its input column's Spark type."""

    agg: Agg
    source: int | None  # index of its input among the window's aggregated columns
    type_name: str  # the column's simpleString ("" for count(*))

    @property
    def kind(self) -> str:
        return _kind(self.type_name)

    def out_type(self) -> str:
        fn, t = self.agg.fn, self.type_name
        if fn in ("count", "count_distinct"):
            return "bigint"
        if fn == "sum":
            if self.kind == "decimal":
                p, s = _decimal(t)
                return f"decimal({min(38, p + 10)},{s})"
            return "bigint" if self.kind == "int" else "double"
        if fn == "mean":
            if self.kind == "decimal":
                p, s = _decimal(t)
                return f"decimal({min(38, p + 4)},{min(38, s + 4)})"
            return "double"
        return t


def _supported(fn: str, type_name: str) -> str | None:
    """None if ``fn`` takes a column of ``type_name``, else what it takes."""
    kind = _kind(type_name)
    if fn in ("sum", "mean"):
        return None if kind in ("int", "float", "decimal") else "numbers or decimals"
    if fn == "percentile":
        ok = kind in ("int", "float", "decimal", "timestamp") or type_name == "date"
        return None if ok else "numbers, decimals, dates or timestamps"
    if fn in ("min", "max", "first", "last"):
        return None if kind == "decimal" or type_name in ORDERABLE else "an orderable type"
    return None  # count, count_distinct: any type


def bind_aggs(name: str, aggs: tuple[Agg, ...], fields: dict[str, str], what: str = "window"
              ) -> tuple[tuple[TypedAgg, ...], list[str]]:
    """(typed aggregates, the distinct columns they read) for input columns ``fields``
    (name -> simpleString). Raises a one-line error naming the step (``what name``) and
    column."""
    columns: list[str] = []
    typed = []
    for a in aggs:
        if a.column is None:
            typed.append(TypedAgg(a, None, ""))
            continue
        if a.column not in fields:
            raise ValueError(f"{what} {name!r}: aggregate {a.out!r} reads no column "
                             f"{a.column!r} (columns: {', '.join(fields)})")
        t = fields[a.column]
        takes = _supported(a.fn, t)
        if takes is not None:
            raise ValueError(f"{what} {name!r}: {a.fn} of column {a.column!r} ({t}) is not "
                             f"supported: {a.fn} takes {takes}")
        if a.column not in columns:
            columns.append(a.column)
        typed.append(TypedAgg(a, columns.index(a.column), t))
    return tuple(typed), columns


def helper_columns(columns: list[str]) -> list[str]:
    """The columns :func:`input_columns` adds for ``columns``."""
    return [f"{prefix}{j}" for j in range(len(columns)) for prefix in (VALUE_PREFIX,
                                                                         VALID_PREFIX)]


def input_columns(df: Any, columns: list[str], fields: dict[str, str]) -> Any:
    """``df`` with each aggregated column as ``lt_agg<j>`` (nulls replaced where pandas
    would change the type) and ``lt_valid<j>`` (is it not null)."""
    from pyspark.sql import functions as F

    for j, c in enumerate(columns):
        col = F.col(f"`{c}`")
        kind = _kind(fields[c])
        value = F.coalesce(col, F.lit(0).cast(fields[c])) if kind in ("int", "float") else col
        df = df.withColumn(f"{VALUE_PREFIX}{j}", value).withColumn(
            f"{VALID_PREFIX}{j}", col.isNotNull())
    return df


def aggregated_input(df: Any, what: str, name: str, keys: tuple[str, ...],
                     aggs: tuple[Agg, ...], keep: tuple[Any, ...] = ()
                     ) -> tuple[Any, tuple[TypedAgg, ...]]:
    """The input of a keyed aggregation step (``what name``, e.g. "groupBy 'g'"): its
    keys, the aggregated columns as :func:`input_columns` hands them over, ``keep``
    (more columns), the tracking column; and the aggregates typed. Unknown columns and
    unsupported types raise here, naming the step."""
    from lowtide.spark.operators.state_clock import check_keys
    from lowtide.spark.tracking.column import TRACK_COL, TRACKING_COLS

    fields = {f.name: f.dataType.simpleString() for f in df.schema.fields
              if f.name not in TRACKING_COLS}
    check_keys(f"{what} {name!r}", keys, fields)
    typed, columns = bind_aggs(name, aggs, fields, what)
    prepared = input_columns(df, columns, fields)
    cols = [f"`{c}`" for c in [*keys, *helper_columns(columns)]]
    return prepared.select(*cols, *keep, TRACK_COL), typed


def time_column(slots: Any, delta_ms: int) -> Any:
    """Slots as a pandas column of UTC timestamps (their start, ``slot * delta_ms``)."""
    import pandas as pd

    ns = np.asarray(slots, np.int64) * (delta_ms * 1_000_000)
    # a DatetimeIndex from nanoseconds: a fifth of to_datetime's cost per call
    return pd.Series(pd.DatetimeIndex(ns.astype("datetime64[ns]")).tz_localize("UTC"))


# ------------------------------------------------------------------ executors


def _values(frame: Any, j: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(the non-null values of aggregated column ``j``, where they are)."""
    valid = frame[f"{VALID_PREFIX}{j}"].to_numpy(bool)
    col = frame[f"{VALUE_PREFIX}{j}"]
    if kind == "int":
        return col.to_numpy(np.int64)[valid], valid
    if kind == "float":
        return col.to_numpy(np.float64)[valid], valid
    if kind == "timestamp":  # ns since the epoch, exact
        return col.to_numpy("datetime64[ns]")[valid].view(np.int64), valid
    return col.to_numpy(object)[valid], valid


def _total(v: np.ndarray, kind: str) -> Any:
    if kind == "decimal":
        return _EXACT.create_decimal(sum(v.tolist(), decimal.Decimal(0)))
    if kind == "float":
        return float(v.sum())
    big = int(np.abs(v).max()) if len(v) else 0
    return int(v.sum()) if big * len(v) < 2**62 else sum(v.tolist())  # no int64 wrap


def _extreme(v: np.ndarray, kind: str, fn: str) -> Any:
    if kind == "float":  # Spark orders NaN above every number
        nan = np.isnan(v)
        numbers = v[~nan]
        if (fn == "max" and nan.any()) or not len(numbers):
            return float("nan")
        return float(numbers.min() if fn == "min" else numbers.max())
    if kind in ("int", "timestamp"):
        return int(v.min() if fn == "min" else v.max())
    return min(v.tolist()) if fn == "min" else max(v.tolist())


def partial(aggs: tuple[TypedAgg, ...], frame: Any, times: np.ndarray, ids: np.ndarray
            ) -> list[Any]:
    """Each aggregate's partial state over the rows of ``frame`` (one key, one window;
    ``times`` and ``ids`` are the rows' slots and ack ids), None if it has no value."""
    with decimal.localcontext(_EXACT):
        return [_partial(a, frame, times, ids) for a in aggs]


def _partial(a: TypedAgg, frame: Any, times: np.ndarray, ids: np.ndarray) -> Any:
    fn = a.agg.fn
    if a.source is None:
        return len(frame)
    v, valid = _values(frame, a.source, a.kind)
    if fn == "count":
        return len(v)
    if not len(v):
        return None
    if fn == "sum":
        return _total(v, a.kind)
    if fn == "mean":
        return (_total(v, a.kind), len(v))
    if fn in ("min", "max"):
        return _extreme(v, a.kind, fn)
    if fn in ("first", "last"):
        t, i = times[valid], ids[valid]
        k = int(np.lexsort((i, t))[0 if fn == "first" else -1])
        return (int(t[k]), int(i[k]), _scalar(v[k]))
    if fn == "count_distinct":
        return set(v.tolist())
    return v.tolist()  # percentile: every value, until the window closes


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def merge(aggs: tuple[TypedAgg, ...], old: list[Any], new: list[Any]) -> list[Any]:
    """Two partial states of the same (key, window) as one."""
    with decimal.localcontext(_EXACT):
        return [_merge(a, x, y) for a, x, y in zip(aggs, old, new, strict=True)]


def _merge(a: TypedAgg, x: Any, y: Any) -> Any:
    fn = a.agg.fn
    if x is None or y is None:
        return y if x is None else x
    if fn == "mean":
        return (x[0] + y[0], x[1] + y[1])
    if fn in ("min", "max"):
        both = np.array([x, y], dtype=np.float64 if a.kind == "float" else object)
        return _extreme(both, a.kind, fn)
    if fn in ("first", "last"):  # (time, ack id) are unique: values never compared
        return min(x, y) if fn == "first" else max(x, y)
    if fn == "count_distinct":
        return x | y
    return x + y  # count, sum, percentile's values


def results(aggs: tuple[TypedAgg, ...], state: list[Any]) -> list[Any]:
    """The final values, in Python types the output's Spark types take."""
    out = []
    for a, s in zip(aggs, state, strict=True):
        fn = a.agg.fn
        if fn == "count":
            value: Any = s
        elif fn == "count_distinct":
            value = len(s) if s is not None else 0
        elif s is None:
            value = None
        elif fn == "mean":
            value = _mean(s[0], s[1], a)
        elif fn in ("first", "last"):
            value = s[2]
        elif fn == "percentile":
            ordered = sorted(s)
            k = max(0, int(np.ceil((a.agg.param or 0.0) * len(ordered))) - 1)
            value = ordered[k]
        else:
            value = s
        out.append(value)
    return out


def _mean(total: Any, n: int, a: TypedAgg) -> Any:
    if a.kind != "decimal":
        return float(total) / n
    _, s = _decimal(a.out_type())
    return _EXACT.divide(total, decimal.Decimal(n)).quantize(
        decimal.Decimal(1).scaleb(-s), rounding=decimal.ROUND_HALF_UP)


def result_columns(aggs: tuple[TypedAgg, ...], rows: list[list[Any]]) -> dict[str, Any]:
    """Result columns, one row per window: ``rows`` are each window's :func:`results`
    (timestamps as pandas timestamps)."""
    import pandas as pd

    cols = {}
    for j, a in enumerate(aggs):
        values = [r[j] for r in rows]
        out_kind = _kind(a.out_type())
        if out_kind == "timestamp":
            cols[a.agg.out] = pd.Series([pd.NaT if v is None else pd.Timestamp(v)
                                         for v in values], dtype="datetime64[ns]")
        elif out_kind == "float":
            cols[a.agg.out] = pd.Series([np.nan if v is None else v for v in values],
                                        dtype=np.float64)
        else:
            cols[a.agg.out] = pd.Series(values, dtype=object)
    return cols
