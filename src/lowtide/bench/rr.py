"""``lowtide bench rr``: the tracker paper's RR-N pipelines on real Spark, with every
tracking mode in the same SparkSession so that ratios are fair.

RR-N: the generator's fronts, then N times ``repartition(p)`` + a pass-through map
(``lowtide.bench.spark.user_map``), then a sink. Modes:

* ``none``: untracked (no tracking columns, no acks; the JVM ``noop`` sink);
* ``lowtide``: tracked maps and the tracked null sink, embedded central tracker;
* ``lowtide sharded (2)``: the same against ``lowtide serve --shards 2`` on loopback;
* ``no local tracker``: every ack is its own message (one keyed batch per ack) from
  the maps, on a small input; the count is extrapolated exactly per input row;
* ``punctuations g``: no tracker; marker rows every g items per front, broadcast at
  each shuffle and aligned per partition (:mod:`lowtide.bench.punctuations`).

Counted: rows/s over the batches after warm-up (wall and CPU basis, as ``lowtide bench
spark``); messages that reach the tracker, counted by the tracker (the embedded one's
dedup keys per micro-batch; the shards' dedup counters), or marker rows moved between
stages; notification latency. :data:`REPORT_INTRO` states the definitions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from lowtide.bench.rr_runs import (
    NO_LOCAL,
    NO_MARKERS,
    PER_50K,
    ROUTED,
    SHARDED,
    TRACKER_MODES,
    Sample,
    punct,
    run_lowtide,
    run_no_local,
    run_none,
    run_punctuations,
    sharded_tracker,
)
from lowtide.bench.spark import (
    BenchConfig,
    session,
)
from lowtide.bench.stats import percentile


@dataclass(frozen=True)
class RRConfig:
    sizes: tuple[int, ...] = (10, 30, 100)
    granularities: tuple[int, ...] = (1, 10, 100)
    fronts: int = 2
    partitions: int = 2
    rows_per_batch: int = 10_000
    seconds: float = 8.0
    warmup_batches: int = 2
    rounds: int = 1
    shards: int = 2
    #: "no local tracker" runs on this many rows per batch (one message per ack)
    small_rows_per_batch: int = 100
    small_seconds: float = 4.0
    #: graph sizes whose estimated untracked batch time exceeds this are skipped
    max_batch_s: float = 20.0
    #: modes run at the sizes after the first one (empty: every mode)
    later_modes: tuple[str, ...] = ()
    master: str = "local[2]"

    def bench(self, stages: int, small: bool = False) -> BenchConfig:
        return BenchConfig(
            fronts=self.fronts, payload_bytes=16, stages=stages, partitions=self.partitions,
            rows_per_batch=self.small_rows_per_batch if small else self.rows_per_batch,
            seconds=self.small_seconds if small else self.seconds,
            warmup_batches=self.warmup_batches, rounds=1, master=self.master,
        )

    def modes(self) -> list[str]:
        return ["none", *TRACKER_MODES, NO_LOCAL, ROUTED,
                *(punct(g) for g in self.granularities)]

    def modes_at(self, n: int) -> list[str]:
        if n == self.sizes[0] or not self.later_modes:
            return self.modes()
        return [m for m in self.modes() if m in self.later_modes]


QUICK = RRConfig(sizes=(3, 10), rows_per_batch=4_000, seconds=1.5, warmup_batches=1,
                 small_rows_per_batch=40, small_seconds=1.5, max_batch_s=8.0,
                 later_modes=("none", "lowtide"))


# ------------------------------------------------------------------ the bench


def run_mode(spark: Any, cfg: RRConfig, n: int, mode: str, workdir: str, routing: Any) -> Sample:
    bc = cfg.bench(n)
    if mode == "none":
        return run_none(spark, bc, workdir)
    if mode == "lowtide":
        return run_lowtide(spark, bc, workdir, mode)
    if mode == SHARDED:
        with sharded_tracker(cfg.shards) as url:
            return run_lowtide(spark, bc, workdir, mode, url, cfg.shards)
    if mode == NO_LOCAL:
        return run_no_local(spark, cfg.bench(n, small=True), workdir)
    if mode == ROUTED:
        return run_punctuations(spark, bc, workdir, NO_MARKERS, routing, ROUTED)
    return run_punctuations(spark, bc, workdir, int(mode.split()[-1]), routing)


def _progress(s: Sample) -> None:
    extra = "" if s.messages is None else f", {s.messages:,} tracker messages"
    if s.marker_rows is not None:
        extra = f", {sum(s.marker_rows):,} marker rows"
    print(f"RR-{s.stages} {s.mode:>20}: {s.rows / max(s.secs, 1e-9):>10,.0f} rows/s"
          f" ({s.batches} batches, {s.rows:,} rows, {s.batch_ms:.0f} ms per batch{extra})",
          file=sys.stderr, flush=True)


def too_slow(cfg: RRConfig, n: int, measured: dict[int, float]) -> str | None:
    """Why graph size ``n`` is skipped: its untracked batch time, extrapolated linearly
    in N from the largest size measured, would exceed ``max_batch_s``."""
    if not measured:
        return None
    m = max(measured)
    est_s = measured[m] / 1000 * n / m
    if est_s <= cfg.max_batch_s:
        return None
    return (f"estimated untracked batch time {est_s:.1f} s (RR-{m}: {measured[m]:.0f} ms per"
            f" batch, linear in N) exceeds {cfg.max_batch_s:.0f} s on this machine")


def run_config(cfg: RRConfig) -> dict[str, Any]:
    """Every mode at every feasible size, in one SparkSession; ``rounds`` times."""
    from lowtide.bench.punctuations import route_keys

    workdir = tempfile.mkdtemp(prefix="lowtide-bench-rr-")
    spark = session(cfg.bench(1))
    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "10000")
    samples: list[tuple[int, Sample]] = []
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}  # a point that failed is reported; the others still run
    untracked_ms: dict[int, float] = {}
    try:
        routing = route_keys(spark, cfg.partitions)
        run_none(spark, replace(cfg.bench(1), seconds=1.0), workdir)  # JVM warm-up
        for n in cfg.sizes:
            why = too_slow(cfg, n, untracked_ms)
            if why is not None:
                skipped[str(n)] = why
                print(f"RR-{n} skipped: {why}", file=sys.stderr, flush=True)
                continue
            for r in range(cfg.rounds):
                for mode in cfg.modes_at(n):
                    try:
                        s = run_mode(spark, cfg, n, mode, workdir, routing)
                    except Exception as exc:
                        failed[f"RR-{n} {mode}"] = f"{type(exc).__name__}: {exc}"[:300]
                        print(f"RR-{n} {mode} failed: {exc}"[:300], file=sys.stderr, flush=True)
                        continue
                    if mode == "none":
                        untracked_ms[n] = s.batch_ms
                    samples.append((r, s))
                    _progress(s)
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    result = summarize(cfg, samples, skipped)
    result["failed"] = failed
    result["load_avg_1m"] = round(os.getloadavg()[0], 1)
    return result


def punctuation_rows(markers: int, stages: int, p: int) -> int:
    """Marker rows moved by RR-N: p copies into the first shuffle, p per partition (p*p)
    into each later one, one per last-stage partition (p) to the sink."""
    return markers * p * (2 + (stages - 1) * p)


def _entry(cfg: RRConfig, mode: str, n: int, runs: list[tuple[int, Sample]],
           base: dict[int, Sample]) -> dict[str, Any]:
    ss = [s for _r, s in runs]
    rows, secs = sum(s.rows for s in ss), sum(s.secs for s in ss)
    cpu = sum(s.cpu_s for s in ss)
    ratios = [s.rows / s.secs / (base[r].rows / base[r].secs) for r, s in runs
              if r in base and s.secs and base[r].secs and base[r].rows]
    total = sum(s.rows_total for s in ss)
    delays = [d for s in ss for d in s.after_last_row_ms]
    commit = [d for s in ss for d in s.after_commit_ms]
    front = [d for s in ss for d in s.from_front_ms]
    out: dict[str, Any] = {
        "mode": mode, "stages": n, "rows_per_s": round(rows / max(secs, 1e-9), 1),
        "rows_per_cpu_s": round(sum(s.rows_cpu for s in ss) / max(cpu, 1e-9), 1),
        "ratio": round(float(np.median(ratios)), 4) if ratios and mode != NO_LOCAL else None,
        "batch_ms": round(float(np.median([s.batch_ms for s in ss])), 1),
        "batches": sum(s.batches for s in ss), "rows_total": total,
        "notify_p50_ms": percentile(delays, 50), "notify_p99_ms": percentile(delays, 99),
        "notified": len(delays),
        "after_commit_p50_ms": percentile(commit, 50), "from_front_p50_ms": percentile(front, 50),
    }
    if ss[0].messages is not None:
        msgs = sum(s.messages or 0 for s in ss)
        out.update(messages=msgs, expected_messages=sum(s.expected_messages or 0 for s in ss),
                   messages_per_50k=round(msgs / max(total, 1) * PER_50K, 1))
    if mode == NO_LOCAL:  # every ack its own message: source send, 2 per map, sink receive
        out["messages_per_50k"] = PER_50K * (2 * n + 2)
        out["extrapolated"] = ("50K x (2N + 2) acks, one message each; measured on"
                               f" {cfg.small_rows_per_batch} rows per batch")
    if ss[0].marker_rows is not None and mode != ROUTED:
        per_shuffle = [sum(x) for x in zip(*(s.marker_rows or [] for s in ss), strict=True)]
        markers = sum(s.markers for s in ss)
        out.update(markers=markers, marker_rows_per_shuffle=per_shuffle,
                   messages=sum(per_shuffle),
                   expected_messages=punctuation_rows(markers, n, cfg.partitions),
                   messages_per_50k=round(sum(per_shuffle) / max(total, 1) * PER_50K, 1))
    cpu_base = [b for b in base.values() if b.cpu_s]
    if cpu_base and cpu and mode != NO_LOCAL:
        un = sum(b.rows_cpu for b in cpu_base) / sum(b.cpu_s for b in cpu_base)
        out["cpu_ratio"] = round(out["rows_per_cpu_s"] / un, 4)
    return out


def summarize(cfg: RRConfig, samples: list[tuple[int, Sample]],
              skipped: dict[str, str]) -> dict[str, Any]:
    sizes = sorted({s.stages for _r, s in samples})
    results = []
    for n in sizes:
        bases = {m: {r: s for r, s in samples if s.stages == n and s.mode == m}
                 for m in ("none", ROUTED)}
        for mode in cfg.modes():
            runs = [(r, s) for r, s in samples if s.stages == n and s.mode == mode]
            baseline = ROUTED if mode.startswith("punctuations") and bases[ROUTED] else "none"
            if runs:
                results.append(_entry(cfg, mode, n, runs, bases[baseline]))
                results[-1]["baseline"] = baseline
    return {
        "bench": "rr", "graph_sizes": sizes, "graph_sizes_skipped": skipped,
        "modes": cfg.modes(), "config": asdict(cfg), "results": results,
    }


def _fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "n/a"
    return (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}") + unit



# ------------------------------------------------------------------ command


def print_table(result: dict[str, Any]) -> None:
    head = (f"{'N':>4} {'mode':<22} {'rows/s':>10} {'ratio':>6} {'cpu':>6} {'msgs/50K':>10}"
            f" {'msgs':>9} {'expected':>9} {'notify p50':>10} {'p99':>8}")
    print(head)
    for r in result["results"]:
        print(f"{r['stages']:>4} {r['mode']:<22} {r['rows_per_s']:>10,.0f}"
              f" {_fmt(r['ratio']):>6} {_fmt(r.get('cpu_ratio')):>6}"
              f" {_fmt(r.get('messages_per_50k')):>10} {r.get('messages', '-'):>9}"
              f" {r.get('expected_messages', '-'):>9} {_fmt(r['notify_p50_ms'], ' ms'):>10}"
              f" {_fmt(r['notify_p99_ms']):>8}")
    for n, why in result["graph_sizes_skipped"].items():
        print(f"RR-{n} skipped: {why}")
    for point, why in result.get("failed", {}).items():
        print(f"{point} failed: {why}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="N = 3 and 10, short runs")
    p.add_argument("--sizes", help="graph sizes N, comma separated (default 10,30,100)")
    p.add_argument("--granularities", help="punctuation granularities g (default 1,10,100)")
    p.add_argument("--rows-per-batch", type=int)
    p.add_argument("--seconds", type=float, help="measured per run")
    p.add_argument("--rounds", type=int)
    p.add_argument("--max-batch-s", type=float, help="skip sizes with slower batches")
    p.add_argument("--master")


def config_of(args: argparse.Namespace) -> RRConfig:
    cfg = QUICK if args.quick else RRConfig()
    ints = lambda text: tuple(int(x) for x in text.split(","))  # noqa: E731
    changes: dict[str, Any] = {
        "sizes": ints(args.sizes) if args.sizes else None,
        "granularities": ints(args.granularities) if args.granularities else None,
        "rows_per_batch": args.rows_per_batch, "seconds": args.seconds,
        "rounds": args.rounds, "max_batch_s": args.max_batch_s, "master": args.master,
    }
    return replace(cfg, **{k: v for k, v in changes.items() if v is not None})


def run(quick: bool) -> dict[str, Any]:
    """The final JSON object of ``lowtide bench rr [--quick]`` (progress on stderr)."""
    return run_config(QUICK if quick else RRConfig())


def main(args: argparse.Namespace) -> int:
    result = run_config(config_of(args))
    print_table(result)
    print(json.dumps(result))
    return 0


def register(subparsers: Any, bench_subparsers: Any) -> None:
    p = bench_subparsers.add_parser(
        "rr", help="RR-N on Spark: tracking modes vs punctuations (throughput, traffic, latency)")
    add_arguments(p)
    p.set_defaults(handler=main)
