"""One RR-N run per tracking mode, in a shared SparkSession: untracked, lowtide
(central or sharded), no local tracker (one message per ack), and aligned
punctuations. :mod:`lowtide.bench.rr` runs them over the graph sizes and reports."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from lowtide.bench.spark import (
    CPU,
    BenchConfig,
    Measured,
    _measure,
    _spec,
    first_updates,
    notification_delays,
    run_untracked,
    user_map,
)
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
    from lowtide.bench.servers import serve_subprocess

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
