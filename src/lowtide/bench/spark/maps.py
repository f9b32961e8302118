"""The default shape of ``lowtide bench spark``: tracked vs untracked maps (see the
package's docstring), and the prototype variants that split the cost up."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import threading
import time
from typing import Any

import numpy as np

from lowtide.bench.spark.measure import (
    BY_PROCESS,
    CPU,
    FULL_GCS,
    BenchConfig,
    Measured,
    _measure,
    _spec,
    _summary,
    _Tally,
    round_order,
    session,
    user_map,
)
from lowtide.spark.pipeline import await_idle, stop_between_batches
from lowtide.spark.sources import (
    GEN_SCHEMA,
    UNTRACKED_SCHEMA,
    GenSource,
    GenStreamReader,
    gen_rows,
)
from lowtide.spark.tracking import attach, pack, reference_slot


def _untracked_stage(batches: Any) -> Any:
    for b in batches:
        yield user_map(b)


#: a bench pipeline warns of a stuck window only after this long: on a loaded machine a
#: micro-batch holds its rows in flight past the default 5 s (hundreds of warnings in
#: a join run), which says nothing about tracking
BENCH_STUCK_MS = 600_000

#: Prototype variants: what parts of tracking cost, measured without the rest.
#: ``columns``: untracked maps carrying the tracking column ``lt_track`` (as the tracked
#: pipeline does) without computing or sending acks; ``tracked-noop``: the tracked maps
#: with the JVM ``noop`` sink (no sink acks); ``foreach``: the untracked pipeline written
#: through ``foreachBatch`` running a ``noop`` write (how tracked sinks other than the
#: null sink write), without tracking; ``tracked-unconfirmed``: the tracked pipeline
#: whose tasks do not wait for the tracker's confirmation (rule 6 off: what the wait
#: costs; not safe to run in production); ``tracked-nometrics``: the tracked pipeline
#: without its observed progress metrics (``Pipeline(progress_metrics=False)``);
#: ``untracked-hash``: the untracked maps with each ``repartition`` hashing a column
#: (``seq``) instead of Spark's round robin, as a tracked ``repartition`` hashes its
#: tracking column: what tracking costs apart from the cheaper shuffle.
VARIANTS = ("untracked", "tracked", "columns", "tracked-noop", "foreach", "tracked-unconfirmed",
            "tracked-nometrics", "untracked-hash")


class _ColumnsReader(GenStreamReader):  # type: ignore[misc]
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__({**options, "tracking": "false"})

    def read(self, partition: Any) -> Any:
        batch, times, acks = gen_rows(self.spec, partition, self.grid)
        if len(times):
            yield attach(batch, pack(times, acks, reference_slot(self.grid)))


class ColumnsSource(GenSource):  # type: ignore[misc]
    """The generator's rows with the tracking column and no tracker."""

    @classmethod
    def name(cls) -> str:
        return "lowtide_gen_columns"

    def schema(self) -> str:
        return GEN_SCHEMA

    def streamReader(self, schema: Any) -> _ColumnsReader:
        return _ColumnsReader({k.lower(): v for k, v in self.options.items()})


def _noop_write(df: Any, batch_id: int) -> None:
    df.write.format("noop").mode("overwrite").save()


def run_untracked(
    spark: Any, cfg: BenchConfig, workdir: str, variant: str = "untracked"
) -> Measured:
    """Untracked maps; ``columns``, ``foreach``, ``untracked-hash``: see VARIANTS."""
    from lowtide.spark.pipeline import register_sources

    register_sources(spark)
    reader = spark.readStream.option("spec", _spec(cfg).to_json())
    if variant == "columns":
        spark.dataSource.register(ColumnsSource)
        df = reader.format(ColumnsSource.name()).load()
    else:
        df = reader.format("lowtide_gen").option("tracking", "false").load()
    schema = GEN_SCHEMA if variant == "columns" else UNTRACKED_SCHEMA
    by = ("seq",) if variant == "untracked-hash" else ()
    for _ in range(cfg.stages):
        df = df.repartition(cfg.partitions, *by).mapInArrow(_untracked_stage, schema)
    writer = df.writeStream.option("checkpointLocation", tempfile.mkdtemp(dir=workdir))
    if variant == "foreach":
        query = writer.foreachBatch(_noop_write).start()
    else:
        query = writer.format("noop").start()
    try:
        return _measure(query, cfg)
    finally:
        stop_between_batches(query)


def _tracked_stream(pipe: Any, cfg: BenchConfig) -> Any:
    stream = pipe.generate(_spec(cfg))
    for k in range(cfg.stages):
        stream = stream.repartition(cfg.partitions).map(user_map, UNTRACKED_SCHEMA,
                                                        name=f"stage{k + 1}")
    return stream


def run_tracked_noop(spark: Any, cfg: BenchConfig, workdir: str) -> Measured:
    """Tracked maps, the JVM ``noop`` sink: the sink's acks and their job are left out."""
    from lowtide.spark.pipeline import Pipeline

    # nothing ever acks the sink segment here: not a loss to warn about
    pipe = Pipeline(spark, "bench", stuck_after_ms=3_600_000, freeze_gc=cfg.freeze_gc)
    try:
        built = pipe.build(_tracked_stream(pipe, cfg))
        ckpt = tempfile.mkdtemp(dir=workdir)
        query = built.df.writeStream.format("noop").option("checkpointLocation", ckpt).start()
        try:
            return _measure(query, cfg)
        finally:
            stop_between_batches(query)
    finally:
        pipe.close()


def run_tracked(
    spark: Any, cfg: BenchConfig, workdir: str, confirm: bool = True, metrics: bool = True
) -> tuple[Measured, dict[int, float]]:
    from lowtide.spark.pipeline import Pipeline

    pipe = Pipeline(spark, "bench", freeze_gc=cfg.freeze_gc, confirm=confirm,
                    stuck_after_ms=BENCH_STUCK_MS,
                    progress_metrics=metrics)
    stream = _tracked_stream(pipe, cfg)
    trace = os.path.join(workdir, f"trace-{time.time_ns()}.txt")
    ckpt = tempfile.mkdtemp(dir=workdir)
    graph = stream.graph()
    updates: list[tuple[int, int]] = []
    stop = threading.Event()
    query = None
    try:
        handle = pipe.start_tracker(graph)
        sub = handle.agent.subscribe("sink")

        def watch() -> None:
            try:
                while not stop.is_set():
                    try:
                        u = sub.next_update(0.1)
                    except TimeoutError:
                        continue
                    updates.append((time.time_ns(), u.time))
            finally:
                sub.close()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        query = stream.to_null(checkpoint=ckpt, trace_file=trace)
        result = _measure(query.query, cfg)
        query.stop()
        time.sleep(0.2)
        stop.set()
        watcher.join(5)
    finally:
        stop.set()
        if query is not None:
            query.stop()
        pipe.close()
    return result, notification_delays(first_updates(trace, updates))


def _ack_starts(trace: str) -> list[tuple[int, int]]:
    """(ns, batch) sorted: per batch with rows, when its sink acks started going out
    (the null sink's lines are per task: the batch's last one)."""
    if not os.path.exists(trace):
        return []
    starts: dict[int, int] = {}
    with open(trace) as f:
        for line in f:
            batch, start_ns, _done_ns, rows = (int(x) for x in line.split())
            if rows:
                starts[batch] = max(start_ns, starts.get(batch, start_ns))
    return sorted((ns, b) for b, ns in starts.items())


def first_updates(trace: str, updates: list[tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """Per batch: (its acks' start, arrival of the first sink update after it) in ns,
    if that update came before the next batch's acks started."""
    starts = _ack_starts(trace)
    times = np.array([ns for ns, _t in updates], np.int64)
    out = {}
    for i, (start_ns, batch) in enumerate(starts):
        k = int(np.searchsorted(times, start_ns))
        if k < len(times) and (i + 1 == len(starts) or times[k] < starts[i + 1][0]):
            out[batch] = (start_ns, int(times[k]))
    return out


def notification_delays(arrived: dict[int, tuple[int, int]]) -> dict[int, float]:
    """Per batch, ms from its acks' start to its update (``first_updates``)."""
    return {b: (ns - start_ns) / 1e6 for b, (start_ns, ns) in arrived.items()}


def _run_variant(
    spark: Any, cfg: BenchConfig, workdir: str, variant: str
) -> tuple[Measured, dict[int, float]]:
    if variant in ("tracked", "tracked-unconfirmed", "tracked-nometrics"):
        return run_tracked(spark, cfg, workdir, confirm=variant != "tracked-unconfirmed",
                           metrics=variant != "tracked-nometrics")
    if variant == "tracked-noop":
        return run_tracked_noop(spark, cfg, workdir), {}
    return run_untracked(spark, cfg, workdir, variant), {}


def _rounds(spark: Any, cfg: BenchConfig, workdir: str,
            fewest: dict[str, int]) -> dict[str, _Tally]:
    """Run every variant once per round, in an order rotated each round
    (:func:`round_order`); round 1 warms the JVM up. ``fewest``: per variant, the
    batches of its counted run that had the fewest."""
    tally = {v: _Tally() for v in ("untracked", *cfg.variants) if v}
    for r in range(cfg.rounds):
        counted = r > 0 or cfg.rounds == 1
        rates: dict[str, tuple[float, float]] = {}
        for variant in round_order(tuple(tally), r):
            gcs = len(FULL_GCS.ms)
            m, d = _run_variant(spark, cfg, workdir, variant)
            rows, secs, n = m.rows, m.secs, m.batches
            rates[variant] = rows / max(secs, 1e-9), CPU["rows"] / max(CPU["last"], 1e-9)
            if counted:
                t = tally[variant]
                t.rows, t.secs, t.batches = t.rows + rows, t.secs + secs, t.batches + n
                t.cpu_rows, t.cpu_s = t.cpu_rows + CPU["rows"], t.cpu_s + CPU["last"]
                t.by_process.add(BY_PROCESS, CPU["rows"])
                t.add_delays(m, d, f"round {r + 1}")
                t.full_gcs_ms += FULL_GCS.ms[gcs:]
                fewest[variant] = min(fewest.get(variant, n), n)
            note = "" if counted else "  (warm-up, not counted)"
            print(f"round {r + 1} {variant:>12}: {rates[variant][0]:>10,.0f} rows/s "
                  f"{rates[variant][1]:>9,.0f} rows per CPU s  ({n} batches, {rows:,} rows)"
                  f"{note}", flush=True)
        base = rates["untracked"]
        for variant, (rate, cpu_rate) in rates.items():
            if counted and variant != "untracked" and base[0] > 0:
                tally[variant].ratios.append(rate / base[0])
                tally[variant].cpu_ratios.append(cpu_rate / base[1])
    return tally


def same_plan(tally: dict[str, _Tally]) -> dict[str, float]:
    """The tracked maps against ``untracked-hash``, the untracked maps on the physical
    plan a tracked ``repartition`` runs (a hash, no sort): what tracking costs apart
    from the cheaper shuffle. Throughput: median of the per-round ratios; CPU: pooled
    rows per CPU second, as the ratios against ``untracked``."""
    tracked, hashed = tally.get("tracked"), tally.get("untracked-hash")
    if tracked is None or hashed is None or not hashed.cpu_s:
        return {"same_plan_throughput_ratio": float("nan"), "same_plan_cpu_ratio": float("nan")}
    rounds = [t / h for t, h in zip(tracked.ratios, hashed.ratios, strict=True) if h > 0]
    return {"same_plan_throughput_ratio": round(float(np.median(rounds)), 4) if rounds
            else float("nan"),
            "same_plan_cpu_ratio": round(tracked.cpu_rate() / hashed.cpu_rate(), 4)}


def run(cfg: BenchConfig) -> dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix="lowtide-bench-spark-")
    spark = session(cfg)
    gc.callbacks.append(FULL_GCS)
    fewest: dict[str, int] = {}
    try:
        tally = _rounds(spark, cfg, workdir, fewest)
        gc.collect()  # what one would cost the tracker now (frozen objects skipped)
        full_gc_now_ms = FULL_GCS.ms[-1]
    finally:
        gc.callbacks.remove(FULL_GCS)
        await_idle()
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    un = tally["untracked"]
    variants = {v: _summary(t, un) for v, t in tally.items() if v != "untracked"}
    tr = variants.get("tracked", {})
    tracked = tally.get("tracked", _Tally())
    worst_other = max(tracked.uncounted, default=(float("nan"), ""))
    delays = tracked.delays
    p50 = float(np.percentile(delays, 50)) if delays else float("nan")
    p99 = float(np.percentile(delays, 99)) if delays else float("nan")
    return {
        "bench": "spark",
        "throughput_ratio": tr.get("throughput_ratio", float("nan")),
        "pooled_ratio": tr.get("pooled_ratio", float("nan")),
        "round_ratios": tr.get("round_ratios", []),
        "rows_per_cpu_s_tracked": tr.get("rows_per_cpu_s", float("nan")),
        "rows_per_cpu_s_untracked": round(un.cpu_rate(), 1),
        "cpu_ratio": tr.get("cpu_ratio", float("nan")),
        "cpu_ratio_without_jit": tr.get("cpu_ratio_without_jit", float("nan")),
        **same_plan(tally),
        "rows_per_s_tracked": tr.get("rows_per_s", float("nan")),
        "rows_per_s_untracked": round(un.rate(), 1),
        "notify_p50_ms": round(p50, 2),
        "notify_p99_ms": round(p99, 2),
        "notified_batches": len(delays),
        "notify_max_ms": round(tracked.slowest[0], 2),
        "notify_slowest": tracked.slowest[1],
        "notify_uncounted_max_ms": round(worst_other[0], 2),
        "notify_uncounted_slowest": worst_other[1],
        "notify_uncounted_batches": len(tracked.uncounted),
        "driver_full_gcs": len(tracked.full_gcs_ms),
        "driver_full_gc_max_ms": round(max(tracked.full_gcs_ms, default=0.0), 2),
        "driver_full_gc_now_ms": round(full_gc_now_ms, 2),
        "variants": variants,
        "untracked_us_per_row_by_process": un.by_process.us_per_row(),
        # every counted run had at least cfg.min_batches (see measure._measure)
        "fewest_batches": fewest,
    }


