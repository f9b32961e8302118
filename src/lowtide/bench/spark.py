"""``lowtide bench spark``: what tracking costs a PySpark pipeline, and how soon the
tracker notifies after a batch ends.

The pipeline: the generator (``fronts`` partitions, ``rows_per_batch`` rows per
micro-batch, always backlogged) then ``stages`` times ``repartition(partitions)`` +
a map over Arrow batches, then a sink. Untracked: plain ``mapInArrow`` and the JVM
``noop`` sink, no tracking columns. Tracked: the same user function as a tracked map
(acks, tracking columns, one idempotent ack batch per task) and the tracked null sink
(Spark's ``noop``, acked by the last map's tasks). Both run in the same SparkSession,
alternating, ``rounds`` times.

Throughput is rows / batch time over the batches after warm-up (triggers run back to
back). The first round warms the JVM up and is not counted. The reported ratio is the
median of the per-round ratios (tracked / the untracked run just before it), which
holds up when other load on the machine drifts between rounds; the pooled ratio
(all tracked rows/s over all untracked rows/s) is printed too.

CPU basis: CPU seconds of this process and its descendants (driver, JVM, Python
workers) from one batch's end to a later batch's end, over the rows of exactly those
batches. Other load on the machine does not add to it, though heavy load still
inflates it (caches, context switches): compare per-round ratios. ``--variants`` adds
prototypes that split the cost up (see :data:`VARIANTS`).

Notification delay, per tracked batch: from the moment the batch's last map task
starts sending its acks (they include the null sink's receipts: its rows go straight
into Spark's ``noop`` writer) to the moment this process receives the sink segment's
min time update that the batch made possible. p50, p99 and max are over the batches
counted for throughput; the others (each query's warm-up, the batches run while it
stops) are reported apart, with their worst.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from lowtide.spark.pipeline import stop_between_batches
from lowtide.spark.sources import (
    GEN_SCHEMA,
    UNTRACKED_SCHEMA,
    GeneratorSpec,
    GenSource,
    GenStreamReader,
    gen_rows,
)
from lowtide.spark.tracking import attach, pack, reference_slot


@dataclass(frozen=True)
class BenchConfig:
    fronts: int = 2
    rows_per_batch: int = 100_000
    payload_bytes: int = 16
    stages: int = 3
    partitions: int = 2
    seconds: float = 10.0
    warmup_batches: int = 3
    rounds: int = 5
    master: str = "local[2]"
    #: measured against "untracked" in every round; see VARIANTS
    variants: tuple[str, ...] = ("tracked",)
    freeze_gc: bool = True  # Pipeline(freeze_gc=...)


def user_map(batch: Any) -> Any:
    """The benchmark's user function: a cheap vectorised column update."""
    import pyarrow as pa
    import pyarrow.compute as pc

    i = batch.schema.get_field_index("event_ms")
    return batch.set_column(i, pa.field("event_ms", pa.int64()), pc.add(batch.column(i), 1))


def _untracked_stage(batches: Any) -> Any:
    for b in batches:
        yield user_map(b)


def session(cfg: BenchConfig) -> Any:
    py = sys.executable
    os.environ.setdefault("PYSPARK_PYTHON", py)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", py)
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(cfg.master)
        .appName("lowtide-bench-spark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cfg.partitions))
        .config("spark.driver.extraJavaOptions", "-Xss32m")
        # RR-100's plans (100 Python stages) overflow the default 1 GiB heap
        .config("spark.driver.memory", "4g")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "20000")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _spec(cfg: BenchConfig) -> GeneratorSpec:
    per_front = max(1, cfg.rows_per_batch // cfg.fronts)
    # A full batch spans 50 ms of label time (5 slots): far more than the pipeline can
    # do in real time, so every batch is full, and every batch moves the heartbeats
    # (and the sink's min time) forward.
    return GeneratorSpec(fronts=cfg.fronts, rate=per_front * cfg.fronts * 20.0,
                         payload_bytes=cfg.payload_bytes, max_rows_per_batch=per_front)


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and all its descendants (the JVM, the
    Python workers): a cost measure that other load on the machine does not inflate."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    used: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(entry)] = int(fields[1])
        used[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    me = os.getpid()

    def mine(pid: int) -> bool:
        while pid > 1:
            if pid == me:
                return True
            pid = parent.get(pid, 1)
        return False

    return sum(t for pid, t in used.items() if mine(pid))


CPU: dict[str, float] = {}


def _next_batch(query: Any, after: int, deadline: float) -> int:
    """Wait until a batch with id > ``after`` has completed; its id."""
    while True:
        p = query.lastProgress
        done = -1 if p is None else int(p["batchId"])
        if done > after:
            return done
        if query.exception() is not None:
            raise RuntimeError(f"benchmark query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise RuntimeError("benchmark query made no progress in 300 s")
        time.sleep(0.01)


class Measured(NamedTuple):
    """Whole batches after warm-up: the ids ``first < id <= last``."""

    rows: int
    secs: float  # batch time
    batches: int
    first: int
    last: int

    def counts(self, batch: int) -> bool:
        return self.first < batch <= self.last


def _measure(query: Any, cfg: BenchConfig) -> Measured:
    """Rows, seconds of batch time and batches over whole batches after warm-up. The CPU
    window runs from one batch's end to a later batch's end (triggers run back to
    back), so the CPU seconds in ``CPU["last"]`` are those of exactly the ``CPU["rows"]``
    rows counted: no partial batch at either end."""
    deadline = time.monotonic() + 300
    warm = _next_batch(query, cfg.warmup_batches - 2, deadline)
    first = _next_batch(query, warm, deadline)
    cpu0 = cpu_seconds()
    time.sleep(cfg.seconds)
    last = _next_batch(query, int(query.lastProgress["batchId"]), deadline)
    CPU["last"] = cpu_seconds() - cpu0
    progress = [p for p in query.recentProgress if first < p["batchId"] <= last]
    rows = sum(int(p["numInputRows"]) for p in progress)
    CPU["rows"] = float(rows)
    ms = sum(int(p["durationMs"].get("triggerExecution", 0)) for p in progress)
    return Measured(rows, ms / 1000.0, len(progress), first, last)


#: Prototype variants: what parts of tracking cost, measured without the rest.
#: ``columns``: untracked maps carrying the tracking column ``lt_track`` (as the tracked
#: pipeline does) without computing or sending acks; ``tracked-noop``: the tracked maps
#: with the JVM ``noop`` sink (no sink acks); ``foreach``: the untracked pipeline written
#: through ``foreachBatch`` running a ``noop`` write (how tracked sinks other than the
#: null sink write), without tracking; ``tracked-unconfirmed``: the tracked pipeline
#: whose tasks do not wait for the tracker's confirmation (rule 6 off: what the wait
#: costs; not safe to run in production).
VARIANTS = ("untracked", "tracked", "columns", "tracked-noop", "foreach", "tracked-unconfirmed")


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
    """Untracked maps; ``columns``, ``foreach``: see VARIANTS."""
    from lowtide.spark.pipeline import register_sources

    register_sources(spark)
    reader = spark.readStream.option("spec", _spec(cfg).to_json())
    if variant == "columns":
        spark.dataSource.register(ColumnsSource)
        df = reader.format(ColumnsSource.name()).load()
    else:
        df = reader.format("lowtide_gen").option("tracking", "false").load()
    schema = GEN_SCHEMA if variant == "columns" else UNTRACKED_SCHEMA
    for _ in range(cfg.stages):
        df = df.repartition(cfg.partitions).mapInArrow(_untracked_stage, schema)
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
    spark: Any, cfg: BenchConfig, workdir: str, confirm: bool = True
) -> tuple[Measured, dict[int, float]]:
    from lowtide.spark.pipeline import Pipeline

    pipe = Pipeline(spark, "bench", freeze_gc=cfg.freeze_gc, confirm=confirm)
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


class FullCollections:
    """The durations of this process's full (generation 2) garbage collections: the
    embedded tracker's thread stops during them, with the rest of the driver."""

    def __init__(self) -> None:
        self.ms: list[float] = []
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.ms.append((time.perf_counter() - self._start) * 1e3)


FULL_GCS = FullCollections()


@dataclass
class _Tally:
    """One variant's counted runs."""

    rows: int = 0
    secs: float = 0.0
    batches: int = 0
    cpu_rows: float = 0.0
    cpu_s: float = 0.0
    ratios: list[float] = field(default_factory=list)  # wall, per round, vs untracked
    cpu_ratios: list[float] = field(default_factory=list)
    delays: list[float] = field(default_factory=list)  # batches counted for throughput
    slowest: tuple[float, str] = (0.0, "")  # the largest counted delay: which run and batch
    #: the other batches with rows: each query's warm-up, and those run while it stops
    uncounted: list[tuple[float, str]] = field(default_factory=list)
    full_gcs_ms: list[float] = field(default_factory=list)  # the driver's, during counted runs

    def add_delays(self, m: Measured, delays: dict[int, float], run: str) -> None:
        for batch, ms in delays.items():
            where = f"{run}, batch {batch}"
            if m.counts(batch):
                self.delays.append(ms)
                self.slowest = max(self.slowest, (ms, where))
            else:
                phase = "warm-up" if batch <= m.first else "stopping"
                self.uncounted.append((ms, f"{where}, {phase}"))

    def rate(self) -> float:
        return self.rows / max(self.secs, 1e-9)

    def cpu_rate(self) -> float:
        return self.cpu_rows / max(self.cpu_s, 1e-9)


def _run_variant(
    spark: Any, cfg: BenchConfig, workdir: str, variant: str
) -> tuple[Measured, dict[int, float]]:
    if variant in ("tracked", "tracked-unconfirmed"):
        return run_tracked(spark, cfg, workdir, confirm=variant == "tracked")
    if variant == "tracked-noop":
        return run_tracked_noop(spark, cfg, workdir), {}
    return run_untracked(spark, cfg, workdir, variant), {}


def _rounds(spark: Any, cfg: BenchConfig, workdir: str) -> dict[str, _Tally]:
    """Run every variant once per round, untracked first; round 1 warms the JVM up."""
    tally = {v: _Tally() for v in ("untracked", *cfg.variants) if v}
    for r in range(cfg.rounds):
        base = (0.0, 0.0)
        for variant in tally:
            gcs = len(FULL_GCS.ms)
            m, d = _run_variant(spark, cfg, workdir, variant)
            rows, secs, n = m.rows, m.secs, m.batches
            rate, cpu_rate = rows / max(secs, 1e-9), CPU["rows"] / max(CPU["last"], 1e-9)
            counted = r > 0 or cfg.rounds == 1
            if counted:
                t = tally[variant]
                t.rows, t.secs, t.batches = t.rows + rows, t.secs + secs, t.batches + n
                t.cpu_rows, t.cpu_s = t.cpu_rows + CPU["rows"], t.cpu_s + CPU["last"]
                t.add_delays(m, d, f"round {r + 1}")
                t.full_gcs_ms += FULL_GCS.ms[gcs:]
                if variant == "untracked":
                    base = (rate, cpu_rate)
                elif base[0] > 0:
                    t.ratios.append(rate / base[0])
                    t.cpu_ratios.append(cpu_rate / base[1])
            note = "" if counted else "  (warm-up, not counted)"
            print(f"round {r + 1} {variant:>12}: {rate:>10,.0f} rows/s {cpu_rate:>9,.0f} rows"
                  f" per CPU s  ({n} batches, {rows:,} rows){note}", flush=True)
    return tally


def _summary(t: _Tally, base: _Tally) -> dict[str, Any]:
    return {
        # median of the per-round ratios: robust to load that drifts between rounds
        "throughput_ratio": round(float(np.median(t.ratios)), 4) if t.ratios else float("nan"),
        "pooled_ratio": round(t.rate() / base.rate(), 4) if base.rows else float("nan"),
        "round_ratios": [round(r, 3) for r in t.ratios],
        "cpu_ratio": round(t.cpu_rate() / base.cpu_rate(), 4) if base.cpu_s else float("nan"),
        "round_cpu_ratios": [round(r, 3) for r in t.cpu_ratios],
        "rows_per_s": round(t.rate(), 1),
        "rows_per_cpu_s": round(t.cpu_rate(), 1),
    }


def run(cfg: BenchConfig) -> dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix="lowtide-bench-spark-")
    spark = session(cfg)
    gc.callbacks.append(FULL_GCS)
    try:
        tally = _rounds(spark, cfg, workdir)
        gc.collect()  # what one would cost the tracker now (frozen objects skipped)
        full_gc_now_ms = FULL_GCS.ms[-1]
    finally:
        gc.callbacks.remove(FULL_GCS)
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
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = BenchConfig()
    p.add_argument("--fronts", type=int, default=d.fronts)
    p.add_argument("--rows-per-batch", type=int, default=d.rows_per_batch)
    p.add_argument("--payload-bytes", type=int, default=d.payload_bytes)
    p.add_argument("--stages", type=int, default=d.stages)
    p.add_argument("--partitions", type=int, default=d.partitions)
    p.add_argument("--seconds", type=float, default=d.seconds, help="measured per run")
    p.add_argument("--warmup-batches", type=int, default=d.warmup_batches)
    p.add_argument("--rounds", type=int, default=d.rounds,
                   help="untracked/tracked pairs; the first one warms up and is not counted")
    p.add_argument("--master", default=d.master)
    p.add_argument("--no-freeze-gc", dest="freeze_gc", action="store_false",
                   help="the tracked pipeline does not gc.freeze() the driver's objects")
    p.add_argument("--variants", default=",".join(d.variants),
                   help="comma-separated, each measured against untracked: "
                   + ", ".join(VARIANTS[1:]))


def main(args: argparse.Namespace) -> int:
    cfg = BenchConfig(
        fronts=args.fronts, rows_per_batch=args.rows_per_batch,
        payload_bytes=args.payload_bytes, stages=args.stages, partitions=args.partitions,
        seconds=args.seconds, warmup_batches=args.warmup_batches, rounds=args.rounds,
        master=args.master, freeze_gc=args.freeze_gc,
        variants=tuple(v for v in args.variants.split(",") if v),
    )
    unknown = set(cfg.variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    result = run(cfg)
    print(f"{'variant':<13} {'rows/s':>10} {'wall ratio':>10} {'rows/CPU s':>11}"
          f" {'CPU ratio':>9}  per-round CPU ratios")
    print(f"{'untracked':<13} {result['rows_per_s_untracked']:>10,.0f} {'':>10}"
          f" {result['rows_per_cpu_s_untracked']:>11,.0f}")
    for v, r in result["variants"].items():
        print(f"{v:<13} {r['rows_per_s']:>10,.0f} {r['throughput_ratio']:>10.3f}"
              f" {r['rows_per_cpu_s']:>11,.0f} {r['cpu_ratio']:>9.3f}  {r['round_cpu_ratios']}")
    print("wall ratio: median of per-round ratios; CPU ratio: rows per CPU second (driver,"
          " JVM, Python workers), unaffected by other load on the machine; target >= 0.95")
    if "tracked" in result["variants"]:
        print(f"notification after batch end: p50 {result['notify_p50_ms']} ms,"
              f" p99 {result['notify_p99_ms']} ms, max {result['notify_max_ms']} ms"
              f" ({result['notify_slowest']}) over the {result['notified_batches']} batches"
              " counted for throughput (target <= 50 ms); the other"
              f" {result['notify_uncounted_batches']} (each query's warm-up, and batches run"
              f" while it stops): max {result['notify_uncounted_max_ms']} ms"
              f" ({result['notify_uncounted_slowest']})")
    print("the driver's full garbage collections during the counted tracked runs (the"
          f" embedded tracker waits them out): {result['driver_full_gcs']}, longest"
          f" {result['driver_full_gc_max_ms']} ms; one at the end took"
          f" {result['driver_full_gc_now_ms']} ms (freeze_gc={cfg.freeze_gc})")
    print(json.dumps({k: result[k] for k in (
        "bench", "throughput_ratio", "cpu_ratio", "rows_per_s_tracked", "rows_per_s_untracked",
        "notify_p50_ms", "notify_p99_ms", "notify_max_ms", "notify_uncounted_max_ms",
        "driver_full_gc_max_ms", "driver_full_gc_now_ms", "variants")}))
    return 0


def register(subparsers: Any, bench_subparsers: Any) -> None:
    b = bench_subparsers.add_parser(
        "spark", help="tracked vs untracked 3-stage PySpark pipeline; notification delay")
    add_arguments(b)
    b.set_defaults(handler=main)
