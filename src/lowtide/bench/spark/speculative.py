"""``lowtide bench spark --shape speculative``: early results, then exact ones, against
the same window exact-only and Spark's update-mode watermark window, one run each.

Latency (real-time input): 4 fronts at ``LATENCY_RATE`` rows/s each, the last one
lagging ``LAG_MS`` (its rows reach Spark that much after they are labelled); 8 keys,
1-second windows, ``count`` and ``sum``. Each query writes to a ``foreachBatch``
function that stamps its rows with the wall time they arrived. Times are from the
window's end (its label time, the fronts' clock):

* lowtide speculative (``.speculative()``, every batch): *first result*, the first
  version of a (key, window) that arrived at or after the window's end (earlier ones
  miss rows of the window's last batch); *final*, its final version. The changelog is
  folded (:func:`lowtide.spark.sinks.apply_changelog`): every window complete at the
  sink must fold to its final row (``changelog_equals_final``), and the finals must
  equal a batch recomputation of the generator's rows (``matches_batch``);
* Spark: ``withWatermark(ts, 1 second)`` and ``outputMode("update")``: its first
  update at or after the window's end, and how many input rows its last updates are
  missing (the lagging front's rows, dropped as late).

Throughput (backlogged input, :mod:`.measure`): the speculative window against the
same window exact-only, both to the tracked null sink, after a warm-up run, two rounds
alternating; ``throughput_ratio`` = speculative / exact-only input rows per second,
the median of the rounds'. Each round also runs the speculative window on the keyed
runtime (``throughput_ratio_keyed``): the plan of a window that falls back (e.g.
``key_ranges``), and of every speculative window before it moved onto Spark's
aggregation. Windows ending within ``WARMUP_MS`` of the first rows at a
sink are not counted (the first batches start Python workers and state stores).
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from lowtide.bench.spark.measure import BenchConfig, Measured, _spec, session
from lowtide.core.time import TimeGrid
from lowtide.spark.operators import ROCKSDB
from lowtide.spark.pipeline import Pipeline, register_sources, stop_between_batches
from lowtide.spark.sinks import apply_changelog, finals
from lowtide.spark.sources import GeneratorSpec, label_ms, rows_before

FRONTS, LATENCY_RATE, LAG_MS, KEYS = 4, 100.0, 5000, BenchConfig.keys
WARMUP_MS = 5000  # windows ending this soon after the first rows reached the sink: not counted
WINDOW_MS = 1000
GRID = TimeGrid()
STUCK_MS = 60_000  # a loaded machine's slow batch is not a loss


def latency_spec() -> GeneratorSpec:
    return GeneratorSpec(fronts=FRONTS, rate=LATENCY_RATE, payload_bytes=4,
                         lag_ms={FRONTS - 1: LAG_MS})


class Arrivals:
    """A ``foreachBatch`` function: each batch's rows with the wall ms they arrived."""

    def __init__(self) -> None:
        self.frames: list[Any] = []
        self._lock = threading.Lock()

    def first_ms(self, query: Any, timeout_s: float = 600) -> float:
        """When the first rows arrived (waiting for them)."""
        deadline = time.monotonic() + timeout_s
        while not self.frames:
            if query.exception() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no rows reached the sink: {query.exception()}")
            time.sleep(0.1)
        return float(self.frames[0]["arrived_ms"].iloc[0])

    def __call__(self, df: Any, batch_id: int) -> None:
        with warnings.catch_warnings():
            # a batch the query's stop cancels fails here; PySpark would first print
            # the JVM's stack trace as a UserWarning
            warnings.simplefilter("ignore", UserWarning)
            rows = df.toPandas()
        if len(rows):
            rows["arrived_ms"] = time.time() * 1000
            with self._lock:
                self.frames.append(rows)

    def rows(self) -> Any:
        import pandas as pd

        rows = pd.concat(self.frames, ignore_index=True)
        end = pd.to_datetime(rows["window_end"], utc=True)
        rows["end_ms"] = (end - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(milliseconds=1)
        return rows


def user_columns(df: Any, keys: int) -> Any:
    from pyspark.sql import functions as F

    return (df.withColumn("user", ((F.col("seq") + F.col("front")) % keys).cast("string"))
            .withColumn("amount", F.col("seq") % 64))


def _t0(checkpoint: str) -> int:
    """The generator's t0 in the first offsets logged (one line per source: a window
    planned in the JVM adds its clock's)."""
    for line in (Path(checkpoint) / "offsets" / "0").read_text().strip().splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "t0" in doc:
            return int(doc["t0"])
    raise RuntimeError(f"no generator offsets in {checkpoint}/offsets/0")


def wait_for_t0(checkpoint: str, query: Any, timeout_s: float = 600) -> int:
    """The generator's t0, from the first offset the query logged (the first batch can
    take minutes on a loaded machine: Python workers and state stores start)."""
    deadline = time.monotonic() + timeout_s
    while not (Path(checkpoint) / "offsets" / "0").exists():
        if query.exception() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the query logged no first batch: {query.exception()}")
        time.sleep(0.1)
    time.sleep(0.1)
    return _t0(checkpoint)


def run_lowtide(spark: Any, seconds: float, workdir: str, keys: int = KEYS) -> dict[str, Any]:
    """The speculative window on real-time input until ``seconds`` of windows past
    the lag are final; its changelog with arrival times, t0 and the sink's min time."""
    pipe = Pipeline(spark, "bench-speculative", stuck_after_ms=STUCK_MS)
    sink, ckpt = Arrivals(), tempfile.mkdtemp(dir=workdir)
    stream = (user_columns(pipe.generate(latency_spec()), keys)
              .window(f"{WINDOW_MS} milliseconds", key="user", name="window")
              .agg(n="count", total=("amount", "sum")).speculative())
    try:
        query = stream.foreach_batch(sink, checkpoint=ckpt, trigger="200 milliseconds")
        t0 = wait_for_t0(ckpt, query.query)
        first = sink.first_ms(query.query)
        target = GRID.slot_of(int(first) + WARMUP_MS + LAG_MS + int(seconds * 1000))
        query.wait_for_min_time(target, timeout_s=seconds + 600)
        query.stop()
        complete = query.min_time()
    finally:
        pipe.close()
    return {"rows": sink.rows(), "t0": t0, "complete_ms": complete * GRID.delta_ms,
            "from_ms": first + WARMUP_MS, "keys": keys}


def run_spark(spark: Any, seconds: float, workdir: str, keys: int = KEYS) -> tuple[Any, int]:
    """Spark's update-mode watermark window on the same input, ``LAG_MS`` +
    ``seconds`` of it; its updates with arrival times, and its generator's t0."""
    from pyspark.sql import functions as F

    sink = Arrivals()
    df = user_columns(spark.readStream.format("lowtide_gen").option("tracking", "false")
                  .option("spec", latency_spec().to_json()).load(), keys)
    result = (df.withColumn("ts", F.timestamp_millis(F.col("event_ms")))
              .withWatermark("ts", "1 second")
              .groupBy("user", F.window("ts", f"{WINDOW_MS} milliseconds"))
              .agg(F.count(F.lit(1)).alias("n"), F.sum("amount").alias("total"))
              .select("user", F.col("window.start").alias("window_start"),
                      F.col("window.end").alias("window_end"), "n", "total"))
    ckpt = tempfile.mkdtemp(dir=workdir)
    query = (result.writeStream.outputMode("update").foreachBatch(sink)
             .option("checkpointLocation", ckpt)
             .trigger(processingTime="200 milliseconds").start())
    try:
        t0 = wait_for_t0(ckpt, query)
        first = sink.first_ms(query)
        time.sleep((WARMUP_MS + LAG_MS) / 1000 + seconds + 3)
    finally:
        stop_between_batches(query)
    rows = sink.rows()
    return rows[rows["end_ms"] >= first + WARMUP_MS], t0


def batch_windows(t0: int, below_ms: int, keys: int = KEYS,
                  spec: GeneratorSpec | None = None) -> Any:
    """The batch recomputation: (user, window end ms) -> (n, total) over every row the
    generator (``spec``, else :func:`latency_spec`'s) labelled before ``below_ms``."""
    import pandas as pd

    spec, parts = spec or latency_spec(), []
    for f in spec.front_ids():
        seq = np.arange(rows_before(t0, spec.rate_of(f), below_ms - 1), dtype=np.int64)
        ms = label_ms(t0, spec.rate_of(f), seq)
        parts.append(pd.DataFrame({"user": ((seq + f) % keys).astype(str),
                                   "end_ms": (ms // WINDOW_MS + 1) * WINDOW_MS,
                                   "amount": seq % 64}))
    rows = pd.concat(parts, ignore_index=True)
    return rows.groupby(["user", "end_ms"]).agg(n=("amount", "size"), total=("amount", "sum"))


def first_after_end(rows: Any) -> Any:
    """Per (user, window end): ms from the end to the first row arriving at or after it."""
    later = rows[rows["arrived_ms"] >= rows["end_ms"]]
    return (later.groupby(["user", "end_ms"])["arrived_ms"].min()
            - later.groupby(["user", "end_ms"])["end_ms"].first())


def speculative_figures(run: dict[str, Any]) -> dict[str, Any]:
    """First result and final, from the window's end (p50 over the windows complete at
    the sink); tombstones; the changelog folded against the finals and the batch."""
    rows, complete_ms = run["rows"], run["complete_ms"]
    # windows complete at the sink, ending after the warm-up
    rows = rows[(rows["end_ms"] <= complete_ms) & (rows["end_ms"] >= run["from_ms"])]
    inserts = rows[rows["op"] == "insert"]
    final = inserts[inserts["is_final"].astype(bool)].set_index(["user", "end_ms"])
    first = first_after_end(inserts)
    folded = apply_changelog(rows.drop(columns=["arrived_ms"])).set_index(["user", "end_ms"])
    exact = finals(rows.drop(columns=["arrived_ms"])).set_index(["user", "end_ms"])
    batch = batch_windows(run["t0"], complete_ms, run.get("keys", KEYS))
    ends = batch.index.get_level_values("end_ms")
    batch = batch[(ends <= complete_ms) & (ends >= run["from_ms"])]
    got = exact[["n", "total"]].sort_index()
    return {
        "windows": len(final),
        "first_result_p50_ms": round(float(np.median(first)), 1),
        "final_p50_ms": round(float(np.median(final["arrived_ms"] - final.index.get_level_values(
            "end_ms"))), 1),
        "tombstones": int((rows["op"] == "tombstone").sum()),
        "changelog_equals_final": bool(folded["is_final"].astype(bool).all() and folded[
            ["n", "total"]].sort_index().equals(exact[["n", "total"]].sort_index())),
        "matches_batch": bool(got.index.equals(batch.index)
                              and (got.to_numpy(np.int64) == batch.to_numpy(np.int64)).all()),
    }


def spark_figures(rows: Any, t0: int, keys: int = KEYS) -> dict[str, Any]:
    """Spark's first update after each window's end (p50) and the rows its last
    updates miss, over the windows it updated after its end."""
    last = rows.sort_values("arrived_ms").groupby(["user", "end_ms"])[["n"]].last()
    batch = batch_windows(t0, int(last.index.get_level_values("end_ms").max()), keys)
    both = last.join(batch[["n"]], rsuffix="_batch", how="inner")
    return {"spark_first_result_p50_ms": round(float(np.median(first_after_end(rows))), 1),
            "spark_rows_missing": int((both["n_batch"] - both["n"]).sum())}


#: the throughput's variants: the window exact-only, speculative on Spark's
#: aggregation (the plan every tracked sink gets), speculative on the keyed runtime
#: (what a window that falls back gets)
VARIANTS = ("exact", "speculative", "keyed")


def throughput(spark: Any, cfg: BenchConfig, workdir: str
               ) -> tuple[list[dict[str, tuple[float, float]]], dict[str, tuple[float, float]]]:
    """Input rows per second and per CPU second of the query's processes of each of
    :data:`VARIANTS` (backlogged input, the tracked null sink) after a warm-up run, two
    rounds alternating, the order rotated: (each round's figures by variant; per
    variant the median of its rounds' ratios to the exact-only window's, for rows/s and
    rows per CPU s)."""
    from lowtide.bench.spark.measure import CPU, measure_pipeline, round_order
    from lowtide.spark.operators import on_keyed_runtime

    def window(variant: str) -> tuple[float, float]:
        pipe = Pipeline(spark, "bench-speculative-rate", freeze_gc=cfg.freeze_gc,
                        stuck_after_ms=STUCK_MS)
        stream = user_columns(pipe.generate(_spec(cfg)), cfg.keys).window(
            f"{WINDOW_MS} milliseconds", key="user", name="window").agg(
            n="count", total=("amount", "sum"))
        if variant != "exact":
            stream = stream.speculative()
        if variant == "keyed":
            stream = on_keyed_runtime(stream)
        rate = _rate(measure_pipeline(pipe, stream, cfg, workdir))
        return rate, CPU["rows"] / CPU["last"] if CPU["last"] else 0.0

    window("exact")  # warm-up
    rounds = [{v: window(v) for v in round_order(VARIANTS, r)} for r in range(2)]

    def ratio(v: str, i: int) -> float:
        return float(np.median([r[v][i] / r["exact"][i] for r in rounds if r["exact"][i]]
                               or [0.0]))

    return rounds, {v: (ratio(v, 0), ratio(v, 1)) for v in VARIANTS}


def _rate(m: Measured) -> float:
    return m.rows / m.secs if m.secs else 0.0


def run(cfg: BenchConfig) -> dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix="lowtide-bench-speculative-")
    spark = session(cfg)
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
    register_sources(spark)
    lowtide_run = run_lowtide(spark, cfg.seconds, workdir, cfg.keys)
    spark_rows, spark_t0 = run_spark(spark, cfg.seconds, workdir, cfg.keys)
    rounds, ratios = throughput(spark, cfg, workdir)
    return {"bench": "spark", "shape": "speculative",
            **speculative_figures(lowtide_run),
            **spark_figures(spark_rows, spark_t0, cfg.keys),
            "rounds": [{v: [round(x) for x in r[v]] for v in VARIANTS} for r in rounds],
            "throughput_ratio": round(ratios["speculative"][0], 3),
            "throughput_ratio_keyed": round(ratios["keyed"][0], 3),
            "cpu_ratio": round(ratios["speculative"][1], 3),
            "cpu_ratio_keyed": round(ratios["keyed"][1], 3)}


def main(cfg: BenchConfig) -> int:
    r = run(cfg)
    print(f"{FRONTS} fronts at {LATENCY_RATE:.0f} rows/s, front {FRONTS - 1} lagging "
          f"{LAG_MS} ms, {cfg.keys} keys, {WINDOW_MS} ms windows ({r['windows']} complete)")
    print(f"{'query':<36} {'first result p50':>17} {'final p50':>10}")
    print(f"{'lowtide speculative':<36} {r['first_result_p50_ms']:>14} ms "
          f"{r['final_p50_ms']:>7} ms")
    print(f"{'Spark update mode, watermark 1 s':<36} {r['spark_first_result_p50_ms']:>14} ms "
          f"{'never':>10}  ({r['spark_rows_missing']} rows missing from its last updates)")
    print(f"tombstones {r['tombstones']}; changelog folds to the finals: "
          f"{r['changelog_equals_final']}; finals equal the batch: {r['matches_batch']}")
    print("throughput (backlogged), rows/s and rows per CPU second by round:")
    for i, rnd in enumerate(r["rounds"], start=1):
        print(f"  round {i}: " + ", ".join(f"{v} {a:,} ({c:,})" for v, (a, c) in rnd.items()))
    print(f"speculative / exact-only: {r['throughput_ratio']} ({r['cpu_ratio']} per CPU s); "
          f"on the keyed runtime: {r['throughput_ratio_keyed']} "
          f"({r['cpu_ratio_keyed']})")
    keys = ("bench", "shape", "first_result_p50_ms", "final_p50_ms", "tombstones",
            "changelog_equals_final", "matches_batch", "throughput_ratio",
            "spark_first_result_p50_ms", "spark_rows_missing", "throughput_ratio_keyed",
            "cpu_ratio", "cpu_ratio_keyed")
    print(json.dumps({k: r[k] for k in keys}))
    return 0
