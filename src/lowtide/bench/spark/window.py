"""``lowtide bench spark --shape window``: an exact lowtide window against Spark's own
watermark window, on the same generator data, in one SparkSession.

Both queries add the same typed columns in the JVM (two keys, a decimal, a long above
2**53, a string, a timestamp), then aggregate them per (user, region, 1-second window):
count, sum of the decimal, max of the long, min of the string, max of the timestamp.
Spark: ``withWatermark("ts", "1 second").groupBy("user", "region", window("ts",
"1 second")).agg(...)`` to the ``noop`` sink (append mode). lowtide: the same columns
as ``with_column`` steps, ``window("1 second", key=["user", "region"]).agg(...)`` and
the tracked null sink. Both use the RocksDB state store. Rounds alternate the two; the
first warms up and is not counted. Throughput is input rows per second of batch time
after warm-up, CPU rows per CPU second of the whole process tree (see
:mod:`.measure`); the ratios are lowtide / Spark, median over rounds.
"""

from __future__ import annotations

import shutil
import tempfile
from typing import Any

import numpy as np

from lowtide.bench.spark.measure import (
    CPU,
    BenchConfig,
    Measured,
    _measure,
    _spec,
    session,
)
from lowtide.spark.operators import ROCKSDB
from lowtide.spark.pipeline import Pipeline, register_sources, stop_between_batches

WINDOW = "1 second"
KEYS = ("user", "region")
SHAPES = ("maps", "window")


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
    return (result.writeStream.outputMode("append").format("noop")
            .option("checkpointLocation", checkpoint).start())


def run_spark(spark: Any, cfg: BenchConfig, workdir: str) -> Measured:
    query = spark_query(spark, cfg, tempfile.mkdtemp(dir=workdir))
    try:
        return _measure(query, cfg)
    finally:
        stop_between_batches(query)


def run_lowtide(spark: Any, cfg: BenchConfig, workdir: str) -> Measured:
    pipe = Pipeline(spark, "bench-window", freeze_gc=cfg.freeze_gc)
    stream = pipe.generate(_spec(cfg))
    for name, col in typed_columns():
        stream = stream.with_column(name, col)
    stream = stream.window(WINDOW, key=list(KEYS), name="window").agg(
        n="count", total=("amount", "sum"), top=("big", "max"),
        first_name=("name", "min"), last_ts=("ts", "max"))
    try:
        query = stream.to_null(checkpoint=tempfile.mkdtemp(dir=workdir))
        try:
            return _measure(query.query, cfg)
        finally:
            query.stop()
    finally:
        pipe.close()


def run(cfg: BenchConfig) -> dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix="lowtide-bench-window-")
    spark = session(cfg)
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    register_sources(spark)
    rates: dict[str, list[tuple[float, float]]] = {"spark": [], "lowtide": []}
    try:
        for r in range(cfg.rounds):
            for name, runner in (("spark", run_spark), ("lowtide", run_lowtide)):
                m = runner(spark, cfg, workdir)
                rate, cpu_rate = m.rows / max(m.secs, 1e-9), CPU["rows"] / max(CPU["last"], 1e-9)
                counted = r > 0 or cfg.rounds == 1
                if counted:
                    rates[name].append((rate, cpu_rate))
                note = "" if counted else "  (warm-up, not counted)"
                print(f"round {r + 1} {name:>8}: {rate:>10,.0f} rows/s {cpu_rate:>9,.0f} rows"
                      f" per CPU s  ({m.batches} batches, {m.rows:,} rows){note}", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    sp, lt = np.array(rates["spark"]), np.array(rates["lowtide"])
    ratios = lt / sp
    return {
        "bench": "spark", "shape": "window",
        "throughput_ratio": round(float(np.median(ratios[:, 0])), 4),
        "cpu_ratio": round(float(np.median(ratios[:, 1])), 4),
        "round_ratios": [round(float(x), 3) for x in ratios[:, 0]],
        "round_cpu_ratios": [round(float(x), 3) for x in ratios[:, 1]],
        "rows_per_s_lowtide": round(float(lt[:, 0].mean()), 1),
        "rows_per_s_spark": round(float(sp[:, 0].mean()), 1),
        "rows_per_cpu_s_lowtide": round(float(lt[:, 1].mean()), 1),
        "rows_per_cpu_s_spark": round(float(sp[:, 1].mean()), 1),
    }


def report(result: dict[str, Any]) -> None:
    """The human table; the caller prints the JSON line last."""
    print(f"{'query':<26} {'rows/s':>10} {'rows/CPU s':>11}")
    print(f"{'Spark watermark window':<26} {result['rows_per_s_spark']:>10,.0f}"
          f" {result['rows_per_cpu_s_spark']:>11,.0f}")
    print(f"{'lowtide exact window':<26} {result['rows_per_s_lowtide']:>10,.0f}"
          f" {result['rows_per_cpu_s_lowtide']:>11,.0f}")
    print(f"lowtide / Spark: throughput {result['throughput_ratio']:.3f} (rounds "
          f"{result['round_ratios']}), CPU {result['cpu_ratio']:.3f} (rounds "
          f"{result['round_cpu_ratios']}); medians over the counted rounds")
