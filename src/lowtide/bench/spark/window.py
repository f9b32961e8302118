"""``lowtide bench spark --shape window``: an exact lowtide window against Spark's own
watermark window, on the same generator data, in one SparkSession.

Both queries add the same typed columns in the JVM (two keys, a decimal, a long above
2**53, a string, a timestamp), then aggregate them per (user, region, 1-second window):
count, sum of the decimal, max of the long, min of the string, max of the timestamp.
Spark: ``withWatermark("ts", "1 second").groupBy("user", "region", window("ts",
"1 second")).agg(...)`` to the ``noop`` sink (append mode). lowtide: the same columns
as ``with_column`` steps, ``window("1 second", key=["user", "region"]).agg(...)`` and
the tracked null sink. With ``--sink parquet`` both write Parquet files instead (Spark's
``format("parquet")``, lowtide's ``write_parquet``: its window's results then come from
the driver, docs/spark.md "Results from the driver"). Both use the RocksDB state
store. Rounds alternate the two (which runs first rotated each round); the first warms
up and is not counted. Throughput is input rows per second of batch time after warm-up,
CPU rows per CPU second of the whole process tree (see :mod:`.measure`); the ratios are
lowtide / Spark, median over rounds.
"""

from __future__ import annotations

import tempfile
from typing import Any

from lowtide.bench.spark.measure import (
    BenchConfig,
    Measured,
    _spec,
    measure_pipeline,
    measure_query,
    versus,
)
from lowtide.spark.pipeline import Pipeline

WINDOW = "1 second"
KEYS = ("user", "region")


def typed_columns() -> list[tuple[str, Any]]:
    """The columns both queries add (JVM expressions over the generator's rows)."""
    from pyspark.sql import functions as F

    seq = F.col("seq")
    return [
        ("user", seq % 64),
        ("region", F.concat(F.lit("r"), (F.col("front") % 4).cast("string"))),
        ("amount", F.expr("CAST((seq % 100000) / 100 AS DECIMAL(12,2))")),
        ("big", F.lit(2**55) + seq),
        ("name", F.concat(F.lit("n"), (seq % 10).cast("string"))),
        ("ts", F.timestamp_millis(F.col("event_ms"))),
    ]


def spark_query(spark: Any, cfg: BenchConfig, checkpoint: str) -> Any:
    """Spark's own event-time window, watermark 1 second, to the ``noop`` sink."""
    from pyspark.sql import functions as F

    df = (spark.readStream.format("lowtide_gen").option("tracking", "false")
          .option("spec", _spec(cfg).to_json()).load())
    for name, col in typed_columns():
        df = df.withColumn(name, col)
    result = (df.withWatermark("ts", WINDOW)
              .groupBy(*KEYS, F.window("ts", WINDOW))
              .agg(F.count(F.lit(1)).alias("n"), F.sum("amount").alias("total"),
                   F.max("big").alias("top"), F.min("name").alias("first_name"),
                   F.max("ts").alias("last_ts")))
    writer = result.writeStream.outputMode("append").option("checkpointLocation", checkpoint)
    if cfg.sink == "parquet":
        return writer.format("parquet").option("path", f"{checkpoint}-out").start()
    return writer.format("noop").start()


def run_spark(spark: Any, cfg: BenchConfig, workdir: str) -> Measured:
    return measure_query(spark_query(spark, cfg, tempfile.mkdtemp(dir=workdir)), cfg)


def run_lowtide(spark: Any, cfg: BenchConfig, workdir: str) -> Measured:
    # the window's hold moves once per micro-batch: on this loaded machine two batches
    # can take longer than the default 5 s after which an open window is reported stuck
    pipe = Pipeline(spark, "bench-window", freeze_gc=cfg.freeze_gc, stuck_after_ms=60_000)
    stream = pipe.generate(_spec(cfg))
    for name, col in typed_columns():
        stream = stream.with_column(name, col)
    stream = stream.window(WINDOW, key=list(KEYS), name="window").agg(
        n="count", total=("amount", "sum"), top=("big", "max"),
        first_name=("name", "min"), last_ts=("ts", "max"))
    to_files = None if cfg.sink == "null" else (
        lambda s, ckpt: s.write_parquet(f"{ckpt}-out", checkpoint=ckpt))
    return measure_pipeline(pipe, stream, cfg, workdir, to_files)


def run(cfg: BenchConfig) -> dict[str, Any]:
    return {**versus(cfg, "window", ("Spark watermark window", run_spark),
                     ("lowtide exact window", run_lowtide)), "sink": cfg.sink}
