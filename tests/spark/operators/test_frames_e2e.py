"""DataFrame-native steps end to end: a pipeline written with where / select /
from_json / explode equals the same logic in plain Spark over the same rows; and the
errors a step that cannot be tracked raises before the query starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import lowtide
from lowtide.core.time import TimeGrid
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import Committed, assert_equal_below, generated, run_past_lag
from tests.spark.operators.helpers import STUCK_MS, start_fails

pytestmark = pytest.mark.spark

GRID = TimeGrid(delta_ms=10)
EVENT = "n long, user string, tags array<long>"


def as_json(F: Any) -> Any:
    """What a producer would send: one JSON document per row."""
    return F.to_json(F.struct(F.col("seq").alias("n"),
                              F.concat(F.lit("u"), (F.col("seq") % 5).cast("string")).alias("user"),
                              F.array_repeat(F.col("seq") % 7, (F.col("seq") % 3).cast("int"))
                              .alias("tags")))


def plain_spark(df: Any) -> Any:
    """The logic as a user writes it in plain PySpark."""
    from pyspark.sql import functions as F

    return (df.withColumn("json", as_json(F))
            .select("front", "seq", F.from_json("json", EVENT).alias("e"))
            .select("front", "seq", "e.*")
            .where("n % 4 != 1")
            .where(F.col("user") != "u3")
            .where("seq % 3 != 2")
            .select("*", F.explode("tags").alias("tag"))
            .withColumn("u", F.upper("user")))


def not_2_mod_3(b: Any) -> Any:
    """An Arrow filter: ``seq % 3 != 2``."""
    return b["seq"].to_numpy() % 3 != 2


def test_where_select_from_json_equal_plain_spark(spark, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    spec = GeneratorSpec(fronts=2, rate=300.0, payload_bytes=4, lag_ms={1: 300})
    # a loaded machine's slow batch keeps the sink's items in flight past 5 s: only a
    # window still open after a minute is stuck
    pipe = lowtide.Pipeline(spark, "frames", grid=GRID, stuck_after_ms=STUCK_MS)
    stream = (pipe.generate(spec)
              .with_column("json", as_json(F))
              .select("front", "seq", F.from_json("json", EVENT).alias("e"))
              .select("front", "seq", "e.*")
              .where("n % 4 != 1", name="not1")
              .repartition(2)
              .where(F.col("user") != "u3", name="not_u3")
              .filter(not_2_mod_3, name="keep")  # chained into not_u3's task
              .explode("tags", "tag", name="tags")
              .with_column("u", F.upper("user")))
    assert stream.segment_names() == ["not1", "not_u3", "keep", "tags", "sink"]
    sink = Committed()
    t0, final = run_past_lag(pipe, stream, sink, tmp_path / "ckpt")
    expected = plain_spark(generated(spark, spec, t0, final, GRID.delta_ms)).toPandas()
    assert_equal_below(sink.rows(), expected, final, ["front", "seq", "tag"])


def test_unknown_column_names_the_step(spark, tmp_path: Path) -> None:
    msg = start_fails(spark, tmp_path, lambda s: s.where("amount > 0", name="positive"))
    assert msg.startswith("step 'positive': [UNRESOLVED_COLUMN")
    assert "`amount`" in msg


def test_a_step_that_drops_the_tracking_column(spark, tmp_path: Path) -> None:
    msg = start_fails(spark, tmp_path,
                      lambda s: s.transform(lambda df: df.select("seq"), name="narrow"))
    assert msg.startswith("step 'narrow' drops the tracking column 'lt_track'")


def test_non_deterministic_columns_are_refused(spark, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    msg = start_fails(spark, tmp_path, lambda s: s.with_column("r", F.rand(), name="noise"))
    assert msg.startswith("step 'noise': column 'r' is not deterministic")
    coin = F.udf(lambda x: x, "long").asNondeterministic()
    msg = start_fails(spark, tmp_path, lambda s: s.where(coin("seq") > 0, name="coin"))
    assert "step 'coin'" in msg and "not deterministic" in msg


def test_a_select_that_makes_rows_is_refused(spark, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    msg = start_fails(spark, tmp_path, lambda s: s.select(
        F.explode(F.array("seq", "seq")).alias("x"), name="twice"))
    assert msg.startswith("step 'twice' adds a Generate") and "explode()" in msg
