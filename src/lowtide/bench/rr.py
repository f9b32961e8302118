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
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from lowtide.bench.spark import (
    CPU,
    BenchConfig,
    Measured,
    _measure,
    _spec,
    first_updates,
    notification_delays,
    run_untracked,
    session,
    user_map,
)
from lowtide.bench.stats import percentile
from lowtide.spark.pipeline import stop_between_batches

PER_50K = 50_000  # the paper counts messages per 50K input items
SHARDED = "lowtide sharded (2)"
NO_LOCAL = "no local tracker"
TRACKER_MODES = ("lowtide", SHARDED)
#: the punctuations' baseline: their plan (route column, hash partitioning, no sort
#: before the shuffle) without markers; "none" is Spark's round robin, sorted first
ROUTED = "none (route keys)"
NO_MARKERS = 1 << 60  # a granularity no front reaches


def punct(g: int) -> str:
    return f"punctuations {g}"


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


# ------------------------------------------------------------------ one run per mode


@dataclass
class Sample:
    """One mode on one graph size: the measured batches, then counts over the query."""

    mode: str
    stages: int
    rows: int  # rows in the measured batches
    secs: float  # their batch time
    batches: int
    cpu_s: float
    rows_cpu: float  # rows done during the CPU window
    rows_total: int = 0  # every row the query read (messages are counted over it too)
    messages: int | None = None  # to the tracker, counted by the tracker
    expected_messages: int | None = None  # what the tasks sent, from Spark's progress
    marker_rows: list[int] | None = None  # per shuffle (and the last one: to the sink)
    markers: int = 0  # markers aligned at the sink
    #: notification latency: from the last row (or marker copy) leaving the last stage
    after_last_row_ms: tuple[float, ...] = ()
    after_commit_ms: tuple[float, ...] = ()  # tracker: from the sink's ack start
    from_front_ms: tuple[float, ...] = ()  # markers: from their birth at the front
    batch_ms: float = 0.0  # mean duration of the measured batches
    #: the measured batches' ids, ``first < id <= last``; latencies are over these too
    counted: tuple[int, int] = (-1, -1)

    def counts(self, batch: int) -> bool:
        return self.counted[0] < batch <= self.counted[1]


def _measured(query: Any, cfg: BenchConfig, mode: str) -> Sample:
    return _sample(mode, cfg, _measure(query, cfg))


def _sample(mode: str, cfg: BenchConfig, m: Measured) -> Sample:
    # _measure leaves the CPU seconds and the rows done in the same window in CPU
    return Sample(mode, cfg.stages, m.rows, m.secs, m.batches, CPU.get("last", 0.0),
                  CPU.get("rows", float(m.rows)), batch_ms=m.secs * 1000 / max(m.batches, 1),
                  counted=(m.first, m.last))


def _batch_rows(query: Any) -> dict[int, int]:
    """Rows per batch id over the query's life (idle triggers repeat a batch id)."""
    out: dict[int, int] = {}
    for p in query.recentProgress:
        out[int(p["batchId"])] = max(out.get(int(p["batchId"]), 0), int(p["numInputRows"]))
    return out


def run_none(spark: Any, cfg: BenchConfig, workdir: str) -> Sample:
    return _sample("none", cfg, run_untracked(spark, cfg, workdir))


def tracked_stream(spark: Any, cfg: BenchConfig, tracker: str | None,
                   last_fn: Callable[[Any], Any] = user_map) -> tuple[Any, Any]:
    """(pipeline, stream): RR-N with tracked pass-through maps (``last_fn`` the last)."""
    from lowtide.spark.pipeline import Pipeline
    from lowtide.spark.sources import UNTRACKED_SCHEMA

    pipe = Pipeline(spark, f"rr{cfg.stages}", tracker=tracker)
    stream = pipe.generate(_spec(cfg))
    for k in range(cfg.stages):
        fn = last_fn if k == cfg.stages - 1 else user_map
        stream = stream.repartition(cfg.partitions).map(fn, UNTRACKED_SCHEMA,
                                                        name=f"stage{k + 1}")
    return pipe, stream


def stamped(last_row_ns: Any) -> Callable[[Any], Any]:
    """``user_map`` that notes, per micro-batch, when its last rows left the stage."""

    def fn(batch: Any) -> Any:
        from lowtide.bench.punctuations import batch_id

        out = user_map(batch)
        last_row_ns.add({batch_id(): time.time_ns()})
        return out

    return fn


def tracker_totals(handle: Any, settle_s: float) -> dict[str, Any]:
    """The tracker's status once its message count holds still (a coordinator sums its
    shards' counters about once a second)."""
    last, deadline = -1, time.monotonic() + 10 * settle_s
    while True:
        doc = handle.status()
        now = int(doc.get("dedup_keys", 0)) + int(doc.get("dedup_hits", 0))
        if now == last or time.monotonic() > deadline:
            return doc
        last = now
        time.sleep(settle_s)


def keyed_batches(handle: Any) -> dict[int, int]:
    """Keyed batches the embedded tracker applied, per micro-batch id (its dedup keys
    are ``[query, batch id, segment, partition]``)."""
    svc = handle.service
    keys = svc.call(lambda: svc.server.engine.dedup.export()["keys"])
    out: dict[int, int] = {}
    for text, _ms in keys:
        b = int(json.loads(text)[1])
        out[b] = out.get(b, 0) + 1
    return out


def run_lowtide(spark: Any, cfg: BenchConfig, workdir: str, mode: str,
                tracker: str | None = None, shards: int = 0) -> Sample:
    """One tracked run: on an embedded tracker, or on ``tracker`` (a url) with
    ``shards`` shards behind it."""
    from lowtide.bench.punctuations import PerBatch

    last_row = spark.sparkContext.accumulator({}, PerBatch(use_max=True))
    pipe, stream = tracked_stream(spark, cfg, tracker, stamped(last_row))
    trace = os.path.join(workdir, f"trace-{time.time_ns()}.txt")
    updates: list[tuple[int, int]] = []
    try:
        handle = pipe.start_tracker(stream.graph())
        cancel = handle.agent.on_update(lambda u: updates.append((time.time_ns(), u.time)),
                                        "sink")
        tq = stream.to_null(checkpoint=tempfile.mkdtemp(dir=workdir), trace_file=trace)
        sample = _measured(tq.query, cfg, mode)
        tq.stop()
        doc = tracker_totals(handle, 1.2 if tracker else 0.1)
        per_batch = keyed_batches(handle) if tracker is None else {}
        cancel()
    finally:
        pipe.close()
    _count_messages(sample, cfg, _batch_rows(tq.query), doc, per_batch, shards)
    arrived = {b: a for b, a in first_updates(trace, updates).items() if sample.counts(b)}
    sample.after_commit_ms = tuple(notification_delays(arrived).values())
    sample.after_last_row_ms = tuple((ns - last_row.value[b]) / 1e6
                                     for b, (_start, ns) in arrived.items() if b in last_row.value)
    return sample


def _count_messages(sample: Sample, cfg: BenchConfig, done: dict[int, int], doc: dict[str, Any],
                    per_batch: dict[int, int], shards: int) -> None:
    """Embedded: the tracker's keyed batches of the completed batches, against what
    their tasks sent (sources, one per map task with rows, and one more per last-map
    task: the null sink's receipts). Sharded: the
    shards' totals over the whole query (each task batch is one message per shard), per
    row sent into the first segment as the tracker counted them."""
    tasks = (cfg.stages + 1) * cfg.partitions
    expected = sum(cfg.fronts + tasks * (n > 0) for n in done.values())
    if shards:
        sample.messages = int(doc.get("dedup_keys", 0)) + int(doc.get("dedup_hits", 0))
        sample.rows_total = int(doc["segments"][0].get("sent", 0))
        sample.expected_messages = shards * expected  # completed batches: a lower bound
        return
    sample.messages = sum(v for b, v in per_batch.items() if b in done)
    sample.expected_messages = expected
    sample.rows_total = sum(done.values())


def sharded_tracker(shards: int, timeout_s: float = 60.0) -> Any:
    """``lowtide serve --shards N`` on loopback (it adopts the first client's graph)."""
    from lowtide.bench.service import serve_subprocess

    return serve_subprocess(["--shards", str(shards)], timeout_s)


# ------------------------------------------------------------------ no local tracker


def per_ack_task(ref: Any, name: str, out: str) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A tracked pass-through map without a local tracker: each row's send-ack (child
    first, rule 2) and receive-ack go to the tracker as messages of their own, keyed so
    that a retried task resends nothing new (rule 6)."""
    from lowtide.spark.operators import OpRuntime, apply_op, operator_id

    rt = OpRuntime("map", user_map, ref, name, out, operator_id(name))

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        from lowtide.core.messages import AckBatch
        from lowtide.spark.tracking import (
            TRACK_COL,
            AckAccumulator,
            ack_ids,
            batch_key,
            connect,
            reference_slot,
            slots_of,
            task_identity,
        )

        ident, agent = task_identity(), connect(ref)
        in_idx, out_idx = ref.graph.index(name), ref.graph.index(out)
        row, ref_slot = 0, reference_slot(ref.grid)
        for batch in batches:
            result = apply_op(rt, batch, AckAccumulator(), in_idx, out_idx, ref_slot)
            packed = batch.column(TRACK_COL).to_numpy()
            t, parent = slots_of(packed, ref_slot), ack_ids(packed)
            child = ack_ids(result.column(TRACK_COL).to_numpy())
            for i in range(len(t)):
                for kind, seg, ack, sign in (("s", out_idx, child, 1), ("r", in_idx, parent, -1)):
                    key = batch_key(ident.query, ident.batch_id, f"{name}/{kind}{row + i}",
                                    ident.partition)
                    agent.send_batch(key, AckBatch.from_columns(seg, t[i:i + 1], ack[i:i + 1],
                                                                sign))
            row += len(t)
            yield result

    return run


def run_no_local(spark: Any, cfg: BenchConfig, workdir: str) -> Sample:
    """RR-N whose maps send one message per ack (generator as in ``lowtide``; the sink
    counts its rows in a ``foreachBatch`` aggregation, one keyed batch per micro-batch)."""
    from lowtide.spark.pipeline import register_sources
    from lowtide.spark.sinks import TrackedForeachBatch
    from lowtide.spark.sources import GEN_SCHEMA

    pipe, stream = tracked_stream(spark, cfg, None)
    graph = stream.graph()
    try:
        ref = pipe.start_tracker(graph).ref
        register_sources(spark)
        df = (spark.readStream.format("lowtide_gen").option("spec", _spec(cfg).to_json())
              .option("lowtide.tracker", ref.to_option()).option("lowtide.segment", "stage1")
              .load())
        for k in range(cfg.stages):
            df = df.repartition(cfg.partitions).mapInArrow(
                per_ack_task(ref, graph.names[k], graph.names[k + 1]), GEN_SCHEMA)
        sink = TrackedForeachBatch(None, ref, "sink")
        query = (df.writeStream.option("checkpointLocation", tempfile.mkdtemp(dir=workdir))
                 .foreachBatch(sink).start())
        try:
            sample = _measured(query, cfg, NO_LOCAL)
        finally:
            stop_between_batches(query)
        per_batch = keyed_batches(pipe.tracker)
    finally:
        pipe.close()
    done = _batch_rows(query)
    sample.rows_total = sum(done.values())
    sample.messages = sum(v for b, v in per_batch.items() if b in done)
    sample.expected_messages = sum(cfg.fronts + (n > 0) + 2 * cfg.stages * n
                                   for n in done.values())
    return sample


# ------------------------------------------------------------------ punctuations


def run_punctuations(spark: Any, cfg: BenchConfig, workdir: str, g: int,
                     routing: Any, mode: str | None = None) -> Sample:
    from lowtide.bench.punctuations import (
        PUNCT_SCHEMA,
        ROUTE_COL,
        MarkerSink,
        PerBatch,
        front_task,
        stage_task,
    )
    from lowtide.spark.pipeline import register_sources

    register_sources(spark)
    copies = spark.sparkContext.accumulator({}, PerBatch())  # (batch, stage) -> marker rows
    df = (spark.readStream.format("lowtide_gen").option("spec", _spec(cfg).to_json())
          .option("tracking", "false").load())
    df = df.mapInArrow(front_task(g, routing, copies), PUNCT_SCHEMA)
    for k in range(cfg.stages):
        expected = 1 if k == 0 else cfg.partitions  # upstream partitions carrying a marker
        df = df.repartition(cfg.partitions, ROUTE_COL).mapInArrow(
            stage_task(user_map, g, routing, expected, k + 1, k == cfg.stages - 1, copies),
            PUNCT_SCHEMA)
    sink = MarkerSink(cfg.partitions)
    query = (df.writeStream.option("checkpointLocation", tempfile.mkdtemp(dir=workdir))
             .foreachBatch(sink).start())
    try:
        sample = _measured(query, cfg, mode or punct(g))
    finally:
        stop_between_batches(query)
    done = _batch_rows(query)  # completed batches: a batch cut by stop() is left out
    sample.rows_total = sum(done.values())
    sample.marker_rows = [sum(v for (b, k), v in copies.value.items() if k == stage and b in done)
                          for stage in range(cfg.stages + 1)]
    notes = [n for n in sink.notifications if n.batch in done]
    sample.markers = len(notes)  # with marker_rows: over every completed batch
    notes = [n for n in notes if sample.counts(n.batch)]  # latencies: the measured ones
    sample.after_last_row_ms = tuple((n.aligned_ns - n.last_copy_ns) / 1e6 for n in notes)
    sample.from_front_ms = tuple((n.aligned_ns - n.born_ns) / 1e6 for n in notes)
    return sample


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
