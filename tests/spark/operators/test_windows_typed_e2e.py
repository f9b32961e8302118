"""Exact windows with several keys and typed aggregates, end to end, against Spark's own
groupBy/agg over the same rows: longs above 2**53, decimals, strings, timestamps and
nulls come out exact and typed as Spark types them. And the window's errors, raised
when the query starts, never in an executor."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import lowtide
from lowtide.core.time import TimeGrid
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import t0_of_checkpoint
from tests.spark.operators.helpers import all_input, start_fails

pytestmark = pytest.mark.spark

GRID = TimeGrid(delta_ms=10)
SIZE = 100  # slots: 1 second
KEYS = ["front", "region", "bucket"]
STUCK_MS = 60_000


def typed_columns() -> list[tuple[str, Any]]:
    """(name, Column) the pipeline adds with with_column, and the batch with withColumn."""
    from pyspark.sql import functions as F

    seq = F.col("seq")

    def unless(every: int, value: Any) -> Any:
        return F.when(seq % every == 0, F.lit(None)).otherwise(value)

    return [
        ("region", unless(11, F.concat(F.lit("r"), (seq % 4).cast("string")))),
        ("bucket", F.lit(2**60) + seq % 2),
        ("big", unless(7, F.lit(2**55) + seq * 1_000_003)),
        ("price", unless(5, F.expr("CAST((seq % 99991) / 7 AS DECIMAL(12,2))"))),
        ("name", F.concat(F.lit("n"), ((seq * 7) % 10).cast("string"))),
        ("ts", unless(13, F.timestamp_millis(F.lit(1_700_000_000_000) + seq * 1_234))),
    ]


AGGS: dict[str, Any] = {
    "n": "count", "n_big": ("big", "count"), "s_big": ("big", "sum"),
    "lo_big": ("big", "min"), "hi_big": ("big", "max"), "avg_big": ("big", "mean"),
    "s_price": ("price", "sum"), "avg_price": ("price", "avg"),
    "p50_price": ("price", "percentile", 0.5), "lo_name": ("name", "min"),
    "hi_name": ("name", "max"), "d_name": ("name", "count_distinct"),
    "lo_ts": ("ts", "min"), "hi_ts": ("ts", "max"), "first_big": ("big", "first"),
    "last_ts": ("ts", "last"),
}


def spark_aggs() -> list[Any]:
    """The same aggregates in plain Spark (first/last: by the rows' time)."""
    from pyspark.sql import functions as F

    def at(col: str) -> Any:
        return F.when(F.col(col).isNotNull(), F.col("slot"))

    return [F.count(F.lit(1)).alias("n"), F.count("big").alias("n_big"),
            F.sum("big").alias("s_big"), F.min("big").alias("lo_big"),
            F.max("big").alias("hi_big"), F.avg("big").alias("avg_big"),
            F.sum("price").alias("s_price"), F.avg("price").alias("avg_price"),
            F.percentile_approx("price", 0.5, 1_000_000).alias("p50_price"),
            F.min("name").alias("lo_name"), F.max("name").alias("hi_name"),
            F.count_distinct("name").alias("d_name"), F.min("ts").alias("lo_ts"),
            F.max("ts").alias("hi_ts"), F.min_by("big", at("big")).alias("first_big"),
            F.max_by("ts", at("ts")).alias("last_ts")]


def batch_windows(spark: Any, spec: GeneratorSpec, t0: int, horizon: int) -> Any:
    from pyspark.sql import functions as F

    rows = all_input(spec, t0, horizon)[["front", "seq", "slot"]]
    df = spark.createDataFrame(rows.astype({"front": "int32"}))
    for name, col in typed_columns():
        df = df.withColumn(name, col)
    start = F.floor(F.col("slot") / SIZE) * SIZE
    return (df.withColumn("start", start)
            .groupBy(*KEYS, "start").agg(*spark_aggs())
            .withColumn("window_start", F.timestamp_millis(F.col("start") * GRID.delta_ms))
            .drop("start"))


def sort_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple((row[k] is None, row[k]) for k in [*KEYS, "window_start"])


def test_several_keys_typed_aggregates_equal_spark(spark, tmp_path: Path) -> None:
    spec = GeneratorSpec(fronts=2, rate=90.0, payload_bytes=4, lag_ms={1: 500})
    pipe = lowtide.Pipeline(spark, "typed", grid=GRID, stuck_after_ms=STUCK_MS)
    stream = pipe.generate(spec)
    for name, col in typed_columns():
        stream = stream.with_column(name, col)
    stream = stream.window("1 second", key=KEYS, name="win").agg(**AGGS)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    try:
        query = stream.write_parquet(str(out), checkpoint=str(ckpt), trigger="200 milliseconds")
        t0 = t0_of_checkpoint(ckpt, query)
        first_end = (GRID.slot_of(t0) // SIZE + 1) * SIZE + SIZE
        query.wait_for_min_time(first_end + 3 * SIZE, timeout_s=120)
        assert not query.stuck()
        query.stop()
        final = query.min_time()
    finally:
        pipe.close()
    got_df = spark.read.parquet(str(out))
    ends = got_df.selectExpr("max(unix_millis(window_start))").first()[0] // GRID.delta_ms
    expected_df = batch_windows(spark, spec, t0, max(final, ends + SIZE))
    # typed as Spark types them
    want_types = dict(expected_df.dtypes)
    assert [(c, t) for c, t in got_df.dtypes if c in want_types] == \
        [(c, want_types[c]) for c in got_df.columns if c in want_types]
    assert got_df.columns[:4] == [*KEYS, "window_start"]
    got = sorted((r.asDict() for r in got_df.drop("window_end").collect()), key=sort_key)
    expected = {sort_key(r.asDict()): r.asDict() for r in expected_df.collect()}
    assert len({sort_key(r) for r in got}) == len(got), "a window was emitted twice"
    final_ms = final * GRID.delta_ms
    done = [k for k, r in expected.items()
            if r["window_start"].timestamp() * 1000 + SIZE * GRID.delta_ms <= final_ms]
    assert len(done) >= 8
    assert {sort_key(r) for r in got} >= set(done), "a complete window is missing"
    for row in got:
        want = expected[sort_key(row)]
        for col, value in row.items():
            if col == "avg_big" and None not in (value, want[col]):
                # Spark sums doubles; lowtide the exact longs
                assert math.isclose(value, want[col], rel_tol=1e-12), col
            else:
                assert value == want[col], (col, value, want[col], row)


def test_window_errors_name_the_column(spark, tmp_path: Path) -> None:
    msg = start_fails(spark, tmp_path, lambda s: s.window("1 second", key=["front", "user"],
                                                          name="w").agg(n="count"))
    assert msg == "window 'w': no key column 'user' (columns: front, seq, event_ms, payload)"
    msg = start_fails(spark, tmp_path, lambda s: s.window("1 second", key="front", name="w")
                      .agg(total=("payload", "sum")))
    assert msg == ("window 'w': sum of column 'payload' (binary) is not supported: sum takes "
                   "numbers or decimals")
    msg = start_fails(spark, tmp_path, lambda s: s.window("1 second", key="front", name="w")
                      .agg(top=("amount", "max")))
    assert msg.startswith("window 'w': aggregate 'top' reads no column 'amount'")
