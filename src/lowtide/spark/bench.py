"""``lowtide bench spark``: what tracking costs a PySpark pipeline, and how soon the
tracker notifies after a batch ends.

The pipeline: the generator (``fronts`` partitions, ``rows_per_batch`` rows per
micro-batch, always backlogged) then ``stages`` times ``repartition(partitions)`` +
a map over Arrow batches, then a sink. Untracked: plain ``mapInArrow`` and the JVM
``noop`` sink, no tracking columns. Tracked: the same user function as a tracked map
(acks, tracking columns, one idempotent ack batch per task) and the tracked null sink
(acks after commit). Both run in the same SparkSession, alternating, ``rounds`` times.

Throughput is rows / batch time over the batches after warm-up (triggers run back to
back). The first round warms the JVM up and is not counted. The reported ratio is the
median of the per-round ratios (tracked / the untracked run just before it), which
holds up when other load on the machine drifts between rounds; the pooled ratio
(all tracked rows/s over all untracked rows/s) is printed too.

Notification delay, per tracked batch: from the moment the sink starts sending its
acks (every task of the batch is done and its output committed) to the
moment this process receives the sink segment's min time update that the batch made
possible.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.spark.generator import GeneratorSpec


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


def _measure(query: Any, cfg: BenchConfig) -> tuple[int, float, int]:
    """(rows, seconds of batch time, batches) over the batches after warm-up; the CPU
    seconds spent meanwhile go to ``CPU["last"]``."""
    deadline = time.monotonic() + 300
    while (query.lastProgress or {}).get("batchId", -1) < cfg.warmup_batches - 1:
        if query.exception() is not None:
            raise RuntimeError(f"benchmark query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise RuntimeError("benchmark query made no progress in 300 s")
        time.sleep(0.05)
    first = query.lastProgress["batchId"]
    cpu0 = cpu_seconds()
    time.sleep(cfg.seconds)
    CPU["last"] = cpu_seconds() - cpu0
    if query.exception() is not None:
        raise RuntimeError(f"benchmark query failed: {query.exception()}")
    progress = [p for p in query.recentProgress if p["batchId"] > first]
    rows = sum(int(p["numInputRows"]) for p in progress)
    ms = sum(int(p["durationMs"].get("triggerExecution", 0)) for p in progress)
    return rows, ms / 1000.0, len(progress)


def stop_between_batches(query: Any, wait_s: float = 10.0) -> None:
    deadline = time.monotonic() + wait_s
    while query.isActive and query.status.get("isTriggerActive") and (
        time.monotonic() < deadline
    ):
        time.sleep(0.005)
    query.stop()


def run_untracked(spark: Any, cfg: BenchConfig, workdir: str) -> tuple[int, float, int]:
    from lowtide.spark.generator import UNTRACKED_SCHEMA
    from lowtide.spark.pipeline import register_sources

    register_sources(spark)
    df = (
        spark.readStream.format("lowtide_gen")
        .option("spec", _spec(cfg).to_json())
        .option("tracking", "false")
        .load()
    )
    for _ in range(cfg.stages):
        df = df.repartition(cfg.partitions).mapInArrow(_untracked_stage, UNTRACKED_SCHEMA)
    ckpt = tempfile.mkdtemp(dir=workdir)
    query = df.writeStream.format("noop").option("checkpointLocation", ckpt).start()
    try:
        return _measure(query, cfg)
    finally:
        stop_between_batches(query)


def run_tracked(
    spark: Any, cfg: BenchConfig, workdir: str
) -> tuple[tuple[int, float, int], list[float]]:
    from lowtide.spark.generator import UNTRACKED_SCHEMA
    from lowtide.spark.pipeline import Pipeline

    pipe = Pipeline(spark, "bench")
    stream = pipe.generate(_spec(cfg))
    for k in range(cfg.stages):
        stream = stream.repartition(cfg.partitions).map(user_map, UNTRACKED_SCHEMA,
                                                        name=f"stage{k + 1}")
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
    return result, notification_delays(trace, updates)


def notification_delays(trace: str, updates: list[tuple[int, int]]) -> list[float]:
    """Per batch: ms from its commit start to the first sink update after it."""
    if not os.path.exists(trace):
        return []
    commits = []
    with open(trace) as f:
        for line in f:
            batch, start_ns, _done_ns, rows = (int(x) for x in line.split())
            if rows:
                commits.append((start_ns, batch))
    commits.sort()
    times = np.array([ns for ns, _t in updates], np.int64)
    out = []
    for i, (start_ns, _batch) in enumerate(commits):
        nxt = commits[i + 1][0] if i + 1 < len(commits) else None
        k = int(np.searchsorted(times, start_ns))
        if k < len(times) and (nxt is None or times[k] < nxt):
            out.append((int(times[k]) - start_ns) / 1e6)
    return out


def run(cfg: BenchConfig) -> dict[str, Any]:
    workdir = tempfile.mkdtemp(prefix="lowtide-bench-spark-")
    spark = session(cfg)
    totals = {"untracked": [0, 0.0, 0], "tracked": [0, 0.0, 0]}
    cpu = {"untracked": [0, 0.0], "tracked": [0, 0.0]}  # rows done, CPU seconds
    ratios: list[float] = []
    last_untracked = 0.0
    delays: list[float] = []
    d: list[float] = []
    try:
        for r in range(cfg.rounds):
            for variant in ("untracked", "tracked"):
                if variant == "untracked":
                    rows, secs, n = run_untracked(spark, cfg, workdir)
                else:
                    (rows, secs, n), d = run_tracked(spark, cfg, workdir)
                counted = r > 0 or cfg.rounds == 1  # round 1 warms the JVM up
                if counted:
                    # rows done during the CPU window: batch rows scaled to the window
                    cpu[variant][0] += rows * min(1.0, cfg.seconds / max(secs, 1e-9))
                    cpu[variant][1] += CPU.get("last", 0.0)
                    t = totals[variant]
                    t[0], t[1], t[2] = t[0] + rows, t[1] + secs, t[2] + n  # type: ignore
                    if variant == "tracked":
                        delays += d
                rate = rows / max(secs, 1e-9)
                if variant == "untracked":
                    last_untracked = rate
                elif counted and last_untracked > 0:
                    ratios.append(rate / last_untracked)
                note = "" if counted else "  (warm-up, not counted)"
                print(f"round {r + 1} {variant:>9}: {rows / max(secs, 1e-9):>12,.0f} rows/s"
                      f"  ({n} batches, {rows:,} rows){note}", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    un = totals["untracked"][0] / max(float(totals["untracked"][1]), 1e-9)
    tr = totals["tracked"][0] / max(float(totals["tracked"][1]), 1e-9)
    cpu_un = cpu["untracked"][0] / max(cpu["untracked"][1], 1e-9)
    cpu_tr = cpu["tracked"][0] / max(cpu["tracked"][1], 1e-9)
    p50 = float(np.percentile(delays, 50)) if delays else float("nan")
    p99 = float(np.percentile(delays, 99)) if delays else float("nan")
    return {
        "bench": "spark",
        # median of the per-round ratios: robust to load that drifts between rounds
        "throughput_ratio": round(float(np.median(ratios)), 4) if ratios else float("nan"),
        "pooled_ratio": round(tr / un, 4) if un else float("nan"),
        "round_ratios": [round(r, 3) for r in ratios],
        "rows_per_cpu_s_tracked": round(cpu_tr, 1),
        "rows_per_cpu_s_untracked": round(cpu_un, 1),
        "cpu_ratio": round(cpu_tr / cpu_un, 4) if cpu_un else float("nan"),
        "rows_per_s_tracked": round(tr, 1),
        "rows_per_s_untracked": round(un, 1),
        "notify_p50_ms": round(p50, 2),
        "notify_p99_ms": round(p99, 2),
        "notified_batches": len(delays),
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


def main(args: argparse.Namespace) -> int:
    cfg = BenchConfig(
        fronts=args.fronts, rows_per_batch=args.rows_per_batch,
        payload_bytes=args.payload_bytes, stages=args.stages, partitions=args.partitions,
        seconds=args.seconds, warmup_batches=args.warmup_batches, rounds=args.rounds,
        master=args.master,
    )
    result = run(cfg)
    print(f"untracked {result['rows_per_s_untracked']:>12,.0f} rows/s")
    print(f"tracked   {result['rows_per_s_tracked']:>12,.0f} rows/s")
    print(f"ratio tracked/untracked: median of rounds {result['throughput_ratio']:.3f}"
          f" (rounds {result['round_ratios']}), pooled {result['pooled_ratio']:.3f}"
          " (target >= 0.95)")
    print(f"CPU cost: tracked {result['rows_per_cpu_s_tracked']:,.0f} rows per CPU second,"
          f" untracked {result['rows_per_cpu_s_untracked']:,.0f}:"
          f" ratio {result['cpu_ratio']:.3f} (unaffected by other load on the machine)")
    print(f"notification after batch end: p50 {result['notify_p50_ms']} ms,"
          f" p99 {result['notify_p99_ms']} ms over {result['notified_batches']} batches"
          " (target <= 50 ms)")
    print(json.dumps({k: result[k] for k in (
        "bench", "throughput_ratio", "rows_per_s_tracked", "rows_per_s_untracked",
        "notify_p50_ms", "notify_p99_ms")}))
    return 0
