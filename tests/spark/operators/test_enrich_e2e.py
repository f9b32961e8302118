"""Stream-static joins (enrichment) end to end: a tracked stream joined with a static
DataFrame equals plain Spark's ``df.join(static, on, how)`` over the same rows, under
an injected task failure, with every row acked; and the errors such a join raises
before the query starts."""

from __future__ import annotations

import contextlib
import io
import time
from pathlib import Path
from typing import Any

import pytest

import lowtide
from lowtide.core.time import TimeGrid
from lowtide.spark.sources.generator import GeneratorSpec
from tests.spark.helpers import (
    Committed,
    assert_equal_below,
    fail_once,
    generated,
    run_past_lag,
)
from tests.spark.operators.helpers import start_fails

pytestmark = pytest.mark.spark

GRID = TimeGrid(delta_ms=10)
STUCK_MS = 60_000  # a loaded machine's slow batch is not a stuck window
# u0 matches nothing, u1 one row, u2 two rows, u3 one row (u9 and a null key: no stream row)
USERS = [("u1", "ann", 1), ("u2", "bob", 2), ("u2", "bea", 2), ("u3", "cy", 3),
         ("u9", "zed", 9), (None, "nobody", 0)]


def users(spark: Any) -> Any:
    return spark.createDataFrame(USERS, "user string, name string, tier long")


def with_user(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.withColumn("user", F.concat(F.lit("u"), (F.col("seq") % 4).cast("string")))


# ~10 s each: "left" in the slow tier
@pytest.mark.parametrize("how", ["inner", pytest.param("left", marks=pytest.mark.slow)])
def test_enrich_equals_plain_spark_under_a_task_failure(spark, tmp_path: Path,
                                                        how: str) -> None:
    from pyspark.sql import functions as F

    spec = GeneratorSpec(fronts=2, rate=200.0, payload_bytes=4, lag_ms={1: 300})
    failed = tmp_path / "failed"
    failed.mkdir()

    def fail_here(bid: int, part: int) -> bool:  # first attempts only: noted, then failed
        if bid % 3 == 1:
            (failed / f"{bid}-{part}").touch()
        return bid % 3 == 1

    def until_a_task_failed(query: Any) -> None:  # after the join's acks were sent
        deadline = time.monotonic() + 90
        while not list(failed.iterdir()):
            assert time.monotonic() < deadline and query.query.exception() is None
            time.sleep(0.1)

    after = fail_once(fail_here)
    # a sort-merge join (Spark does not know the size of an RDD's rows) and a broadcast
    static = F.broadcast(users(spark)) if how == "left" else users(spark)
    pipe = lowtide.Pipeline(spark, f"enrich-{how}", grid=GRID, stuck_after_ms=STUCK_MS)
    stream = (pipe.generate(spec)
              .transform(with_user, name="user")
              .join(static, on="user", how=how, name="users")
              .transform(lambda df: df.mapInArrow(after, df.schema), name="fail"))
    assert stream.segment_names() == ["users", "sink"]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        pipe.build(stream).df.explain()
    assert ("BroadcastHashJoin" if how == "left" else "SortMergeJoin") in out.getvalue()
    sink = Committed()
    t0, final = run_past_lag(pipe, stream, sink, tmp_path / "ckpt", until_a_task_failed)
    base = with_user(generated(spark, spec, t0, final, GRID.delta_ms))
    expected = base.join(users(spark), on="user", how=how).toPandas()
    a = assert_equal_below(sink.rows(), expected, final, ["front", "seq", "name"])
    assert set(a["user"]) == ({"u0", "u1", "u2", "u3"} if how == "left"
                              else {"u1", "u2", "u3"})


def test_enrich_errors(spark, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    static = users(spark)

    def fails(describe: Any) -> str:
        return start_fails(spark, tmp_path, lambda s: describe(s.transform(with_user)))

    msg = fails(lambda s: s.join(spark.readStream.format("rate").load(), on="user",
                                 name="j"))
    assert msg.startswith("step 'j': the other side is a streaming DataFrame") \
        and "within=" in msg
    msg = fails(lambda s: s.join(static, on="user", how="full", name="j"))
    assert msg.startswith("step 'j': how='full'") and "every micro-batch" in msg
    msg = fails(lambda s: s.join(static, on="region", name="j"))
    assert msg.startswith("step 'j': key 'region' is not a column of the static side")
    msg = fails(lambda s: s.join(static.withColumnRenamed("user", "front"), on="front",
                                 name="j"))
    assert msg.startswith("step 'j': key 'front' is int in the stream but string")
    msg = fails(lambda s: s.join(static.withColumn("region", F.lit("eu")),
                                 on=["user", "region"], name="j"))
    assert msg.startswith("step 'j': key 'region' is not a column of the stream")
    msg = fails(lambda s: s.join(static.withColumn("seq", F.lit(1)), on="user", name="j"))
    assert msg.startswith("step 'j': column 'seq' is on both sides")
    msg = fails(lambda s: s.join(static.withColumn("r", F.rand()), on="user", name="j"))
    assert msg.startswith("step 'j': column 'r' is not deterministic")
    msg = fails(lambda s: s.join(static, on=F.col("user"), name="j"))
    assert msg.startswith("step 'j': join key Column<")
    msg = fails(lambda s: s.join(s, on="user", name="j"))
    assert msg == ("join 'j': give exactly one of within=, lower= with upper= (interval "
                   "joins) and window= (a window join)")
    msg = fails(lambda s: s.join(static, on="user", within="1 second", name="j"))
    assert msg.startswith("step 'j': within= and window= are for stream-stream joins")
    msg = fails(lambda s: s.join(static, on="user", window="1 second", name="j"))
    assert msg.startswith("step 'j': within= and window= are for stream-stream joins")
