"""``lowtide bench spark --source kafka``: what tracking costs a query on Spark's real
Kafka source, tracked and untracked reading the same topic in one run.

Per round: a fresh topic of ``--fronts`` partitions, filled by one ``lowtide.Front``
and the Kafka helper per partition (``--records`` rows of ``{"k", "v"}`` JSON, labels
in the headers) for a pipeline with its own embedded tracker; then both queries drain it
from the earliest offset (which one first rotated each round), ``--rows-per-batch`` per
micro-batch (``maxOffsetsPerTrigger``):

* untracked: Kafka -> parse the JSON and the label headers -> ``mapInArrow(user
  function)`` -> Spark's ``noop`` sink;
* tracked: the same parse -> ``Pipeline.read_stream`` (receipts out of the ingest
  segment) -> the user function as a tracked map -> the tracked null sink.

Each round's topic is read once by each query, so the tracked one receives every
record exactly once (a second read would be a second consumer). Throughput is rows /
batch time over the batches after ``--warmup-batches``; CPU is that of this process
and its descendants (driver, JVM, Python workers, the broker) from the end of the
warm-up to the batch that drains the topic, over the same rows. The reported ratios
are medians of the per-round ratios (tracked / untracked), the first round not counted
(it warms the JVM up). The last line is JSON with ``throughput_ratio`` and
``cpu_ratio``.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lowtide.bench.spark.cpu import cpu_seconds
from lowtide.bench.spark.measure import PROGRESS_KEPT
from lowtide.core.time import TimeGrid

VALUE_SCHEMA = "k STRING, v BIGINT"


@dataclass(frozen=True)
class KafkaBenchConfig:
    fronts: int = 3  # partitions, one producer each
    records: int = 300_000  # per round, per query
    rows_per_batch: int = 50_000
    warmup_batches: int = 2
    rounds: int = 3
    master: str = "local[2]"
    #: a drain counting fewer micro-batches after warm-up fails: its ratio would rest
    #: on a batch or two (raise --records or lower --rows-per-batch)
    min_batches: int = 3
    bootstrap: str | None = None  # None: a local broker for the run


def user_fn(batch: Any) -> Any:
    """The user function of both queries: a cheap vectorised column update."""
    import pyarrow as pa
    import pyarrow.compute as pc

    i = batch.schema.get_field_index("v")
    return batch.set_column(i, pa.field("v", pa.int64()), pc.add(batch.column(i), 1))


def user_batches(batches: Any) -> Any:
    """``user_fn`` as ``mapInArrow`` takes it (an iterator of batches)."""
    for batch in batches:
        yield user_fn(batch)


def fill_topic(bootstrap: str, topic: str, ref: Any, cfg: KafkaBenchConfig) -> int:
    """A new topic with ``cfg.records`` labelled records, a producer per partition;
    returns the fronts' smallest last promise."""
    import pandas as pd
    from confluent_kafka.admin import AdminClient, NewTopic

    from lowtide.spark.sources import KAFKA_CLIENT_LOGGER, Front, KafkaProducerConfig

    # a broker just started warns that its coordinator is still loading: not the bench's
    logging.getLogger(KAFKA_CLIENT_LOGGER).setLevel(logging.ERROR)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, cfg.fronts, 1)]).values():
        future.result(timeout=60)
    per = cfg.records // cfg.fronts
    promised = []
    for p in range(cfg.fronts):
        front = Front(None, p, ref, segment="ingest", heartbeat_ms=20)
        out = KafkaProducerConfig(topic, bootstrap, partition=p).build(front)
        for lo in range(0, per, 20_000):
            n = min(20_000, per - lo)
            v = np.arange(lo, lo + n, dtype=np.int64)
            out.send(pd.DataFrame({"k": (v % 16).astype(str), "v": v}))
        out.close()
        promised.append(front.close(unregister=True))
    return min(promised)


def labelled_frame(spark: Any, bootstrap: str, topic: str, rows_per_batch: int) -> Any:
    from lowtide.spark.sources import KAFKA_HEADER_EXPRS

    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", topic).option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", str(rows_per_batch))
           .option("includeHeaders", "true").load())
    labels = [f"{expr} AS {col}" for col, expr in KAFKA_HEADER_EXPRS.items()]
    return (raw.selectExpr(f"from_json(CAST(value AS STRING), '{VALUE_SCHEMA}') AS r", *labels)
            .selectExpr("r.k AS k", "r.v AS v", "lt_time", "lt_ack"))


def drain(query: Any, records: int, warmup: int, min_batches: int = 1
          ) -> tuple[int, float, float]:
    """(rows, batch seconds, CPU seconds) of the batches after ``warmup`` until the
    query has read all ``records``; an error if fewer than ``min_batches`` of them
    had rows."""
    deadline = time.monotonic() + 600
    cpu0: float | None = None
    while True:
        progress = list(query.recentProgress)
        if cpu0 is None and len(progress) >= warmup:
            cpu0 = cpu_seconds()
        if sum(int(p["numInputRows"]) for p in progress) >= records:
            cpu = cpu_seconds() - (cpu0 if cpu0 is not None else 0.0)
            break
        if query.exception() is not None:
            raise RuntimeError(f"benchmark query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise RuntimeError("benchmark query did not drain its topic in 600 s")
        time.sleep(0.01)
    counted = [p for p in progress[warmup:] if int(p["numInputRows"])]
    if len(counted) < min_batches:
        raise RuntimeError(f"the topic drained in {len(counted)} micro-batches after "
                           f"{warmup} of warm-up; a ratio needs {min_batches}: raise "
                           "--records or lower --rows-per-batch")
    rows = sum(int(p["numInputRows"]) for p in counted)
    secs = sum(int(p["durationMs"].get("triggerExecution", 0)) for p in counted) / 1000
    return rows, secs, cpu


def untracked(spark: Any, frame: Any, ckpt: str, cfg: KafkaBenchConfig) -> Any:
    out = frame.mapInArrow(user_batches, frame.schema)
    query = (out.writeStream.format("noop").option("checkpointLocation", ckpt)
             .queryName("untracked").start())
    try:
        return drain(query, cfg.records // cfg.fronts * cfg.fronts, cfg.warmup_batches,
                     cfg.min_batches)
    finally:
        query.stop()


def one_round(spark: Any, bootstrap: str, tmp: Path, r: int, cfg: KafkaBenchConfig) -> dict:
    """Fill a topic, drain it untracked and tracked, which first rotated each round
    (:func:`~lowtide.bench.spark.measure.round_order`); both measurements."""
    from lowtide.bench.spark.measure import round_order
    from lowtide.spark.pipeline import Pipeline

    topic = f"lowtide-bench-{int(time.time())}-{r}"
    pipe = Pipeline(spark, f"bench-kafka-{r}", grid=TimeGrid(10), stuck_after_ms=600_000)
    try:
        stream = (pipe.read_stream(labelled_frame(spark, bootstrap, topic, cfg.rows_per_batch))
                  .map(user_fn, VALUE_SCHEMA, name="map"))
        pipe.start_tracker(stream.graph())
        promised = fill_topic(bootstrap, topic, pipe.tracker_ref, cfg)

        def run_untracked() -> Any:
            return untracked(spark, labelled_frame(spark, bootstrap, topic,
                                                   cfg.rows_per_batch), str(tmp / f"u{r}"), cfg)

        def run_tracked() -> Any:
            query = stream.to_null(checkpoint=str(tmp / f"t{r}"), query_name="tracked")
            try:
                measured = drain(query.query, cfg.records // cfg.fronts * cfg.fronts,
                                 cfg.warmup_batches, cfg.min_batches)
                # every record received once: the sink completes through the last promise
                query.wait_for_min_time(promised, timeout_s=120)
                return measured
            finally:
                query.stop()

        runs = {"untracked": run_untracked, "tracked": run_tracked}
        out = {side: runs[side]() for side in round_order(tuple(runs), r)}
    finally:
        pipe.close()
    return out


def summary(rounds: list[dict]) -> dict[str, Any]:
    counted = rounds[1:] or rounds  # the first round warms the JVM up

    def rate(m: tuple[int, float, float]) -> float:
        return m[0] / max(m[1], 1e-9)

    def cpu_rate(m: tuple[int, float, float]) -> float:
        return m[0] / max(m[2], 1e-9)

    wall = [rate(x["tracked"]) / rate(x["untracked"]) for x in counted]
    cpu = [cpu_rate(x["tracked"]) / cpu_rate(x["untracked"]) for x in counted]
    return {
        "bench": "spark", "source": "kafka",
        "throughput_ratio": round(float(np.median(wall)), 4),
        "cpu_ratio": round(float(np.median(cpu)), 4),
        "round_ratios": [round(x, 3) for x in wall],
        "round_cpu_ratios": [round(x, 3) for x in cpu],
        "rows_per_s_tracked": round(float(np.median([rate(x["tracked"]) for x in counted]))),
        "rows_per_s_untracked": round(float(np.median([rate(x["untracked"])
                                                       for x in counted]))),
    }


def run(cfg: KafkaBenchConfig) -> dict[str, Any]:
    from lowtide.apps.kafka_broker import KafkaBrokerConfig
    from lowtide.spark import SessionConfig

    spark = SessionConfig(master=cfg.master, kafka=True, conf=(
        ("spark.sql.execution.arrow.maxRecordsPerBatch", "20000"), PROGRESS_KEPT)).build()
    tmp = Path(tempfile.mkdtemp(prefix="lowtide-bench-kafka-"))
    broker = None if cfg.bootstrap else KafkaBrokerConfig(tmp / "broker").build()
    bootstrap = cfg.bootstrap or broker.bootstrap  # type: ignore[union-attr]
    try:
        rounds = [one_round(spark, bootstrap, tmp, r, cfg) for r in range(cfg.rounds)]
    finally:
        if broker is not None:
            broker.stop()
        spark.stop()
    out = summary(rounds)
    out.update(records=cfg.records, rows_per_batch=cfg.rows_per_batch, fronts=cfg.fronts,
               rounds=cfg.rounds)
    return out


def main(args: argparse.Namespace) -> int:
    cfg = KafkaBenchConfig(fronts=args.fronts, rows_per_batch=args.rows_per_batch,
                           records=args.records, warmup_batches=args.warmup_batches,
                           rounds=args.rounds, master=args.master, bootstrap=args.bootstrap,
                           min_batches=args.min_batches)
    try:
        result = run(cfg)
    except RuntimeError as err:  # too few micro-batches, a query that failed: one line
        raise SystemExit(f"lowtide bench spark --source kafka: {err}") from None
    print(f"Kafka source, {cfg.records:,} records per round on {cfg.fronts} partitions, "
          f"{cfg.rows_per_batch:,} per batch: tracked {result['rows_per_s_tracked']:,} rows/s, "
          f"untracked {result['rows_per_s_untracked']:,} rows/s; per-round wall ratios "
          f"{result['round_ratios']}, CPU ratios {result['round_cpu_ratios']}")
    print(json.dumps(result))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options only ``--source kafka`` reads (the others are bench spark's)."""
    d = KafkaBenchConfig()
    p.add_argument("--records", type=int, default=d.records,
                   help="--source kafka: records per round (each query reads them all)")
    p.add_argument("--bootstrap", help="--source kafka: your brokers (default: a local one)")
