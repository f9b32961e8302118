"""Reading a changelog, a speculative window's (:mod:`lowtide.spark.operators.speculative`)
or a speculative fold's (:mod:`lowtide.spark.operators.speculative_fold`): its latest
state, its exact output, and a Delta table kept up to date with it.

::

    latest = lowtide.apply_changelog(spark.read.parquet("/out/changes"))
    exact = finals(spark.read.parquet("/out/changes"))

A changelog row is (a row of) a version of a (key, window) or, for a fold, of a (key,
``slot_start``) (``op = "insert"``), or the tombstone of one (``op = "tombstone"``,
the same columns as the row it cancels). The latest state is every version no
tombstone cancels: one version per (key, window) once the rows of every batch so far
are read, whatever order they are read in. A final version (``is_final``) is never
cancelled: a reader that sees it knows the window (the slot) is exact.
"""

from __future__ import annotations

from functools import reduce
from typing import Any

from lowtide.spark.tracking.column import ACK_COL, TIME_COL, TRACK_COL

# a changelog's columns after the window's (the operators' side imports them from here)
OP_COL, VERSION_COL, FINAL_COL = "op", "version", "is_final"
CHANGELOG_COLS = (OP_COL, VERSION_COL, FINAL_COL)
#: their DDL, after the step's own columns
CHANGELOG_DDL = f"{OP_COL} string, {VERSION_COL} bigint, {FINAL_COL} boolean"
SLOT_START_COL = "slot_start"  # a fold's changelog: the slot a version is of
INSERT, TOMBSTONE = "insert", "tombstone"
_LABELS = (TIME_COL, ACK_COL, TRACK_COL)


def _identity(columns: list[str]) -> list[str]:
    """What a tombstone repeats of the version it cancels: every column but ``op``,
    ``is_final`` and the labels."""
    missing = [c for c in (OP_COL, VERSION_COL, FINAL_COL) if c not in columns]
    if missing:
        raise ValueError(f"not a changelog: no column {missing[0]!r} (write a "
                         "window(...).agg(...).speculative() or stateful(...).speculative() "
                         "stream)")
    return [c for c in columns if c not in (OP_COL, FINAL_COL, *_LABELS)]


def apply_changelog(df: Any) -> Any:
    """The latest state of a changelog (a Spark or pandas DataFrame): its versions that
    no tombstone cancels, without ``op`` and the labels (``version``, ``is_final``
    kept)."""
    cols = _identity(list(df.columns))
    if not hasattr(df, "sparkSession"):
        return _apply_pandas(df, cols)
    from pyspark.sql import functions as F

    inserts = df.where(F.col(OP_COL) == INSERT).alias("i")
    cancelled = df.where(F.col(OP_COL) == TOMBSTONE).select(*cols).alias("t")
    same = reduce(lambda a, b: a & b, [F.col(f"i.`{c}`").eqNullSafe(F.col(f"t.`{c}`"))
                                       for c in cols])
    kept = inserts.join(cancelled, same, "left_anti")
    return kept.drop(OP_COL, *[c for c in _LABELS if c in df.columns])


def _apply_pandas(df: Any, cols: list[str]) -> Any:
    # merge matches NaN with NaN and None with None, as eqNullSafe does
    cancelled = df.loc[df[OP_COL] == TOMBSTONE, cols].assign(_lt_gone=True)
    inserts = df[df[OP_COL] == INSERT]
    merged = inserts.merge(cancelled, on=cols, how="left")
    kept = merged[merged["_lt_gone"].isna()]
    return kept.drop(columns=["_lt_gone", OP_COL, *[c for c in _LABELS if c in df.columns]]
                     ).reset_index(drop=True)


def finals(df: Any) -> Any:
    """The exact output in a changelog (a Spark or pandas DataFrame): its final rows,
    without ``op``, ``version``, ``is_final`` (and a fold's ``slot_start``): what the
    window or ``stateful`` without ``speculative()`` emits."""
    _identity(list(df.columns))
    drop = [c for c in (OP_COL, VERSION_COL, FINAL_COL, SLOT_START_COL) if c in df.columns]
    if not hasattr(df, "sparkSession"):
        return df[df[FINAL_COL].astype(bool)].drop(columns=drop).reset_index(drop=True)
    from pyspark.sql import functions as F

    return df.where(F.col(FINAL_COL)).drop(*drop)


def merge_sql(table: str, source: str, keys: list[str], on: list[str] | None = None) -> str:
    """The Delta ``MERGE`` that folds one batch of a changelog (the view ``source``)
    into ``table``, its latest state, by the window's ``keys`` (a tombstone deletes
    the version it names, an insert adds its version: ``version`` is in the match, so
    one batch may hold both for a window). ``on``: what names a row besides the keys
    and ``version``: a window's ``window_start`` by default; a fold's changelog
    (several rows per version): ``slot_start`` and its output columns (rows of one
    version must then differ: Delta refuses two source rows for one target row)."""
    ident = ["window_start"] if on is None else on
    on_sql = " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in [*keys, *ident, VERSION_COL])
    return (f"MERGE INTO {table} t USING {source} s ON {on_sql} "
            f"WHEN MATCHED AND s.{OP_COL} = '{TOMBSTONE}' THEN DELETE "
            f"WHEN NOT MATCHED AND s.{OP_COL} = '{INSERT}' THEN INSERT *")
