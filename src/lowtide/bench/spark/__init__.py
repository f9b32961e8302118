"""``lowtide bench spark``: what tracking costs a PySpark pipeline, and how soon the
tracker notifies after a batch ends (``--shape maps``, the default); or lowtide against
Spark's own query on the same shape: an exact window against Spark's watermark window
(``--shape window``, :mod:`.window`), two sources and a union, an exact interval join
against Spark's watermark stream-stream join (``--shape union|join``, :mod:`.shapes`);
early results then exact ones against the exact-only window and Spark's update mode
(``--shape speculative``, :mod:`.speculative`).

The maps pipeline: the generator (``fronts`` partitions, ``rows_per_batch`` rows per
micro-batch, always backlogged) then ``stages`` times ``repartition(partitions)`` +
a map over Arrow batches, then a sink. Untracked: plain ``mapInArrow`` and the JVM
``noop`` sink, no tracking columns. Tracked: the same user function as a tracked map
(acks, tracking columns, one idempotent ack batch per task) and the tracked null sink
(Spark's ``noop``, acked by the last map's tasks). Both run in the same SparkSession,
alternating, ``rounds`` times, which one runs first rotated each round.

Throughput is rows / batch time over the batches after warm-up (triggers run back to
back). The first round warms the JVM up and is not counted. The reported ratio is the
median of the per-round ratios (tracked / the untracked run of the same round), which
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
import json
from typing import Any

from lowtide.bench.spark import kafka, shapes, speculative, window
from lowtide.bench.spark.maps import (
    VARIANTS,
    first_updates,
    notification_delays,
    run,
    run_untracked,
)
from lowtide.bench.spark.measure import (
    CPU,
    BenchConfig,
    FullCollections,
    Measured,
    _measure,
    _spec,
    _Tally,
    report_versus,
    session,
    user_map,
    versus,
)
from lowtide.bench.spark.shapes import SHAPES

__all__ = [  # what rr.py and the tests use
    "CPU",
    "VARIANTS",
    "BenchConfig",
    "FullCollections",
    "Measured",
    "_Tally",
    "_measure",
    "_spec",
    "first_updates",
    "main",
    "notification_delays",
    "register",
    "run",
    "run_untracked",
    "session",
    "user_map",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = BenchConfig()
    p.add_argument("--fronts", type=int, default=d.fronts)
    p.add_argument("--rows-per-batch", type=int, default=d.rows_per_batch)
    p.add_argument("--payload-bytes", type=int, default=d.payload_bytes)
    p.add_argument("--stages", type=int, default=d.stages)
    p.add_argument("--partitions", type=int, default=d.partitions)
    p.add_argument("--seconds", type=float, default=d.seconds, help="measured per run")
    p.add_argument("--warmup-batches", type=int, default=d.warmup_batches)
    p.add_argument("--min-batches", type=int, default=d.min_batches,
                   help="micro-batches each run counts after warm-up, at the least (a run "
                   "lasts longer than --seconds until it has them)")
    p.add_argument("--rounds", type=int, default=d.rounds,
                   help="untracked/tracked pairs; the first one warms up and is not counted, "
                   "and each side runs first in turn: an odd number gives each as many "
                   "first runs (the earlier run of a round pays more of the JIT's warm-up)")
    p.add_argument("--master", default=d.master)
    p.add_argument("--no-freeze-gc", dest="freeze_gc", action="store_false",
                   help="the tracked pipeline does not gc.freeze() the driver's objects")
    p.add_argument("--shape", choices=SHAPES, default="maps",
                   help="maps: tracked vs untracked maps (default); window: an exact "
                   "window vs Spark's watermark window, typed aggregates over two keys; "
                   "union: two sources, a union and a map vs the same in plain Spark; join: "
                   "an exact interval join vs Spark's watermark stream-stream join; "
                   "speculative: early results then finals vs exact-only and Spark's update "
                   "mode")
    p.add_argument("--sink", choices=("null", "parquet"), default=d.sink,
                   help="window: both sides to the null sink (default) or to Parquet files")
    p.add_argument("--keys", type=int, default=d.keys,
                   help="speculative: distinct keys of the window (each changed key is "
                   "a changelog row per micro-batch)")
    p.add_argument("--source", choices=("generator", "kafka"), default="generator",
                   help="kafka: tracked vs untracked on one topic of a real broker")
    kafka.add_arguments(p)
    p.add_argument("--variants", default=",".join(d.variants),
                   help="comma-separated, each measured against untracked: "
                   + ", ".join(VARIANTS[1:]))


def main(args: argparse.Namespace) -> int:
    if args.source == "kafka":
        return kafka.main(args)
    cfg = BenchConfig(
        fronts=args.fronts, rows_per_batch=args.rows_per_batch,
        payload_bytes=args.payload_bytes, stages=args.stages, partitions=args.partitions,
        seconds=args.seconds, warmup_batches=args.warmup_batches, rounds=args.rounds,
        master=args.master, freeze_gc=args.freeze_gc, min_batches=args.min_batches,
        variants=tuple(v for v in args.variants.split(",") if v), keys=args.keys,
        sink=args.sink,
    )
    if args.sink != "null" and args.shape != "window":
        raise SystemExit(f"lowtide bench spark: --sink {args.sink} is for --shape window")
    unknown = set(cfg.variants) - set(VARIANTS)
    if unknown:
        raise SystemExit(f"unknown variants {sorted(unknown)}; choose from {VARIANTS}")
    try:  # a run that cannot give a ratio (too few micro-batches) says why, one line
        if args.shape == "speculative":
            return speculative.main(cfg)
        if args.shape == "maps":
            return report_maps(run(cfg), cfg)
        if args.shape == "window":
            versus_result = window.run(cfg)
        else:
            versus_result = versus(cfg, args.shape, *shapes.RUNNERS[args.shape])
    except RuntimeError as err:
        raise SystemExit(f"lowtide bench spark: {err}") from None
    report_versus(versus_result)
    print(json.dumps(versus_result))
    return 0


def report_maps(result: dict[str, Any], cfg: BenchConfig) -> int:
    """The maps shape's table; its JSON line last."""
    print(f"{'variant':<13} {'rows/s':>10} {'wall ratio':>10} {'rows/CPU s':>11}"
          f" {'CPU ratio':>9}  per-round CPU ratios")
    print(f"{'untracked':<13} {result['rows_per_s_untracked']:>10,.0f} {'':>10}"
          f" {result['rows_per_cpu_s_untracked']:>11,.0f}")
    for v, r in result["variants"].items():
        print(f"{v:<13} {r['rows_per_s']:>10,.0f} {r['throughput_ratio']:>10.3f}"
              f" {r['rows_per_cpu_s']:>11,.0f} {r['cpu_ratio']:>9.3f}  {r['round_cpu_ratios']}")
    print("wall ratio: median of per-round ratios; CPU ratio: rows per CPU second (driver,"
          " JVM, Python workers), unaffected by other load on the machine; target >= 0.95")
    print("CPU ratio without the JVM's JIT compiler (both sides share one JVM, whose"
          " compiler works for either whenever it gets to it): " + ", ".join(
              f"{v} {r['cpu_ratio_without_jit']:.3f}" for v, r in result["variants"].items()))
    if "untracked-hash" in result["variants"] and "tracked" in result["variants"]:
        print("tracked against untracked-hash, the same physical plan (a tracked repartition"
              " hashes its tracking column where Spark's round robin sorts every row first):"
              f" throughput {result['same_plan_throughput_ratio']:.3f},"
              f" CPU {result['same_plan_cpu_ratio']:.3f}")
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
    print("CPU us per input row by process: " + "; ".join(
        f"{v} " + ", ".join(f"{k} {x:.3f}" for k, x in by.items())
        for v, by in (("untracked", result["untracked_us_per_row_by_process"]),
                      *((v, r["us_per_row_by_process"])
                        for v, r in result["variants"].items()))))
    print("micro-batches per counted run, at the fewest: " + ", ".join(
        f"{v} {n}" for v, n in result["fewest_batches"].items())
        + f" (each run counts at least {cfg.min_batches}: --min-batches)")
    print(json.dumps({k: result[k] for k in (
        "bench", "throughput_ratio", "cpu_ratio", "cpu_ratio_without_jit",
        "same_plan_throughput_ratio", "same_plan_cpu_ratio",
        "rows_per_s_tracked", "rows_per_s_untracked",
        "notify_p50_ms", "notify_p99_ms", "notify_max_ms", "notify_uncounted_max_ms",
        "driver_full_gc_max_ms", "driver_full_gc_now_ms", "fewest_batches", "variants",
        "untracked_us_per_row_by_process")}))
    return 0


def register(subparsers: Any, bench_subparsers: Any) -> None:
    b = bench_subparsers.add_parser(
        "spark", help="tracked vs untracked 3-stage PySpark pipeline; notification delay")
    add_arguments(b)
    b.set_defaults(handler=main)
