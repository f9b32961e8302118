"""``lowtide bench spark --shape union|join``: lowtide against plain Spark on the same
pipeline shape, in one run (:func:`.measure.versus`).

* ``union``: two generator sources (``fronts`` partitions each, half the rows each),
  ``unionByName``, one map over Arrow batches (the benchmark's user function), the
  ``noop`` sink. lowtide: ``pipe.generate(a).union(pipe.generate(b)).map(...)`` and the
  tracked null sink (acked by the map's tasks).
* ``join``: two generator sources, the left of one front, the right of two (half the
  rows each, the second lagging ``JOIN_LAG_MS``: its rows reach Spark that much after
  they are labelled), a key ``k = seq % JOIN_KEYS`` and an event-time column; each
  batch spans one second of label time, so a row has about one match within
  ``JOIN_WITHIN``. Spark drops a join input row as late when it is older than the
  previous batch's watermark (the largest event time seen before it, less the 1 s
  delay): about ``1 s + 2 batches`` behind, so a lag of 1.5 s dropped nothing; at 5 s
  Spark drops the lagging front's rows (the JSON line's ``spark_dropped_late``),
  lowtide waits for them.
  Spark: both sides ``withWatermark(ts, 1 second)``
  and an inner interval join ``l_k = r_k AND r_ts BETWEEN l_ts - 100 ms AND l_ts + 100
  ms`` (Spark's own stream-stream join), ``noop`` sink. lowtide: ``a.join(b, on="k",
  within="100 milliseconds")``, exact, no watermark, the tracked null sink.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from typing import Any

from lowtide.bench.spark.maps import BENCH_STUCK_MS, _untracked_stage
from lowtide.bench.spark.measure import (
    BenchConfig,
    Measured,
    _spec,
    measure_pipeline,
    measure_query,
    user_map,
)
from lowtide.spark.pipeline import Pipeline
from lowtide.spark.sources import UNTRACKED_SCHEMA, GeneratorSpec

SHAPES = ("maps", "window", "union", "join", "speculative")
JOIN_KEYS = 1000
JOIN_WITHIN = "100 milliseconds"
JOIN_LAG_MS = 5000  # the right side's second front: past Spark's late-row threshold (see above)


def _halves(cfg: BenchConfig) -> tuple[GeneratorSpec, GeneratorSpec]:
    """Two sources with half the rows each, front ids apart."""
    half = replace(cfg, rows_per_batch=max(1, cfg.rows_per_batch // 2))
    a = _spec(half)
    return a, replace(a, first_front=cfg.fronts)


def _join_specs(cfg: BenchConfig) -> tuple[GeneratorSpec, GeneratorSpec]:
    """One front on the left, two on the right (the second lagging), a batch spanning
    one second of label time (so a key repeats every JOIN_KEYS rows of a side: about
    one match per row within JOIN_WITHIN at 5,000 rows per side)."""
    per_side = max(1, cfg.rows_per_batch // 2)
    a = GeneratorSpec(fronts=1, rate=float(per_side), payload_bytes=cfg.payload_bytes,
                      max_rows_per_batch=per_side)
    return a, replace(a, first_front=1, fronts=2, lag_ms={2: JOIN_LAG_MS})


def _start(df: Any, workdir: str) -> Any:
    return (df.writeStream.format("noop")
            .option("checkpointLocation", tempfile.mkdtemp(dir=workdir)).start())


def _read(spark: Any, spec: GeneratorSpec) -> Any:
    return (spark.readStream.format("lowtide_gen").option("tracking", "false")
            .option("spec", spec.to_json()).load())


def spark_union(spark: Any, cfg: BenchConfig, workdir: str) -> Measured:
    a, b = _halves(cfg)
    df = _read(spark, a).unionByName(_read(spark, b)).mapInArrow(_untracked_stage,
                                                                  UNTRACKED_SCHEMA)
    return measure_query(_start(df, workdir), cfg)


def lowtide_union(spark: Any, cfg: BenchConfig, workdir: str) -> Measured:
    a, b = _halves(cfg)
    pipe = Pipeline(spark, "bench-union", freeze_gc=cfg.freeze_gc,
                    stuck_after_ms=BENCH_STUCK_MS)
    stream = pipe.generate(a).union(pipe.generate(b)).map(user_map, UNTRACKED_SCHEMA,
                                                          name="map")
    return measure_pipeline(pipe, stream, cfg, workdir)


def _side_columns(prefix: str) -> list[tuple[str, Any]]:
    from pyspark.sql import functions as F

    return [(f"{prefix}k", F.col("seq") % JOIN_KEYS),
            (f"{prefix}ts", F.timestamp_millis(F.col("event_ms")))]


def _side(df: Any, prefix: str) -> Any:
    from pyspark.sql import functions as F

    return df.select(*[col.alias(name) for name, col in _side_columns(prefix)],
                     F.col("seq").alias(f"{prefix}seq"))


def spark_join(spark: Any, cfg: BenchConfig, workdir: str) -> Measured:
    from pyspark.sql import functions as F

    a, b = _join_specs(cfg)
    left = _side(_read(spark, a), "l_").withWatermark("l_ts", "1 second")
    right = _side(_read(spark, b), "r_").withWatermark("r_ts", "1 second")
    cond = F.expr(f"l_k = r_k AND r_ts BETWEEN l_ts - INTERVAL {JOIN_WITHIN} "
                  f"AND l_ts + INTERVAL {JOIN_WITHIN}")
    return measure_query(_start(left.join(right, cond, "inner"), workdir), cfg)


def lowtide_join(spark: Any, cfg: BenchConfig, workdir: str) -> Measured:
    from pyspark.sql import functions as F

    a, b = _join_specs(cfg)
    pipe = Pipeline(spark, "bench-join", freeze_gc=cfg.freeze_gc,
                    stuck_after_ms=BENCH_STUCK_MS)

    def side(spec: GeneratorSpec, prefix: str) -> Any:
        cols = [F.col("seq").alias(f"{prefix}seq"), F.col("event_ms").alias(f"{prefix}ms")]
        return pipe.generate(spec).select((F.col("seq") % JOIN_KEYS).alias("k"), *cols,
                                          name=f"{prefix}select")

    stream = side(a, "l_").join(side(b, "r_"), on="k", within=JOIN_WITHIN, name="join")
    return measure_pipeline(pipe, stream, cfg, workdir)


RUNNERS = {
    "union": (("Spark union + map", spark_union), ("lowtide union + tracked map",
                                                    lowtide_union)),
    "join": (("Spark watermark interval join", spark_join),
             ("lowtide exact interval join", lowtide_join)),
}
