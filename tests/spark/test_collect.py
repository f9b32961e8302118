"""A Collector returns the frame toPandas does: values and dtypes, every Spark type."""

from typing import Any

import pandas as pd
import pytest

from lowtide.spark.collect import Collector

pytestmark = pytest.mark.spark

#: every type a window's keys and aggregates may have, each with a null in row 2
COLUMNS = [
    "id",
    "cast(id as int) i", "cast(id as smallint) s", "cast(id as tinyint) b",
    "id * 1.5 d", "cast(id as float) f", "cast(id as string) str",
    "id % 2 = 0 flag", "cast(id * 1.25 as decimal(22,2)) dec", "cast(str_of as binary) bin",
    "timestamp_millis(id * 86400001) ts", "cast(timestamp_millis(id) as timestamp_ntz) ntz",
    "date_add(date'2026-01-01', cast(id as int)) day",
    "make_dt_interval(0, 0, 0, id) dt_interval",
    "named_struct('a', id, 'b', str_of) st", "array(id, id + 1) arr",
    "map(str_of, id) mp", "array(named_struct('x', id)) nested",
]


def _frame(spark: Any, rows: int) -> Any:
    base = spark.range(rows).selectExpr("id", "cast(id as string) str_of")
    typed = base.selectExpr(*COLUMNS)
    return typed.selectExpr(*[f"if(id = 2, null, {c}) as {c}" if c != "id" else c
                              for c in typed.columns])


def _collect(df: Any) -> pd.DataFrame:
    return Collector.of(df)(df)


def _same(left: pd.DataFrame, right: pd.DataFrame) -> None:
    assert list(left.columns) == list(right.columns)
    assert left.dtypes.tolist() == right.dtypes.tolist()
    # nested values (dicts, arrays) compare as their text
    assert left.astype(str).equals(right.astype(str))


def test_every_type_matches_to_pandas(spark: Any) -> None:
    df = _frame(spark, 5)
    _same(_collect(df), df.toPandas())


def test_an_empty_result_has_the_same_columns_and_dtypes(spark: Any) -> None:
    df = _frame(spark, 5).where("id < 0")
    got = _collect(df)
    assert len(got) == 0
    _same(got, df.toPandas())


def test_repeated_names_and_a_session_time_zone(spark: Any) -> None:
    df = spark.range(3).selectExpr("id", "timestamp_millis(id * 3600000) t",
                                   "id * 2 as id")
    old = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        _same(_collect(df), df.toPandas())
    finally:
        spark.conf.set("spark.sql.session.timeZone", old)
