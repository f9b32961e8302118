"""Replay by time from a Kafka topic (what ``Pipeline.replay`` reads for a query whose
entry is a labelled Kafka stream, ``pipe.read_stream``).

A clock front writes each record's label time as its Kafka timestamp
(:mod:`lowtide.spark.sources.kafka_producer`), so the broker's timestamp index gives,
per partition, the first offset whose record has a time at or after ``from``
(``offsets_for_times``): no record of the range lies before it. The end is the
partition's high watermark once the fronts promised ``to`` (every record below ``to``
was delivered before that promise), and the label times filter the range exactly, so
several fronts interleaved in one partition replay exactly too.

The replay reads the user's own stream again: the query's Kafka relation, in its
Spark plan, gets ``assign`` and ``startingOffsets`` of the range (the steps above it,
e.g. the headers cast into labels, stay as written), and a filter keeps the records
of ``[from, to)``. On the replay's tracker the driver is the records' front: it sends
their acks into the ingest segment (read by one Spark batch job over the same offsets,
from the label headers) and promises ``to``, so the replay's min times reach ``to``
exactly when every replayed record is through.

Refused (one line each): a partition whose retention already dropped records at or
after ``from`` (its earliest offset holds the range's first record and others were
deleted before it), and records whose Kafka timestamp is not their label time (an
event-time front: the index says nothing about label times).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lowtide.core.errors import LowtideError
from lowtide.core.messages import AckBatch
from lowtide.spark.sources.labels import KAFKA_HEADER_EXPRS, from_label

__all__ = ["REPLAY_FRONT", "REPLAY_OWNER", "KafkaRange", "KafkaReplayRefused", "kafka_options",
           "kafka_range", "range_acks", "reading"]

REPLAY_FRONT = 0  # the driver's front on the replay's own tracker
REPLAY_OWNER = "lowtide-kafka-replay"


class KafkaReplayRefused(LowtideError, ValueError):
    """A Kafka replay that would not be exact."""


@dataclass(frozen=True)
class KafkaRange:
    """The offsets ``[start, end)`` per partition of ``topic`` that hold every record
    with a label time in ``[from_slot, to_slot)`` (and maybe others, filtered out)."""

    topic: str
    from_slot: int
    to_slot: int
    offsets: dict[int, tuple[int, int]]

    def json(self, end: bool = False) -> str:
        return json.dumps({self.topic: {str(p): hi if end else lo
                                        for p, (lo, hi) in self.offsets.items()}})


def _relation(df: Any) -> Any:
    """The one Kafka relation in ``df``'s plan, or None."""
    found = []

    def walk(plan: Any) -> None:
        if plan.nodeName() == "StreamingRelationV2" and plan.sourceName() == "kafka":
            found.append(plan)
        kids = plan.children()
        for i in range(kids.size()):
            walk(kids.apply(i))

    walk(df._jdf.queryExecution().analyzed())
    return found[0] if len(found) == 1 else None


def kafka_options(df: Any) -> dict[str, str] | None:
    """The options of the Kafka topic ``df`` reads (lower-case keys), None if it reads
    no single Kafka relation."""
    rel = _relation(df)
    if rel is None:
        return None
    opts = dict(rel.extraOptions().asCaseSensitiveMap())
    return {k.lower(): v for k, v in opts.items()}


def _consumer(options: dict[str, str]) -> Any:
    from confluent_kafka import Consumer

    client = {k[len("kafka."):]: v for k, v in options.items() if k.startswith("kafka.")}
    return Consumer({**client, "group.id": "lowtide-replay", "enable.auto.commit": False})


def kafka_range(options: dict[str, str], from_slot: int, to_slot: int, delta_ms: int,
                timeout_s: float = 30.0) -> KafkaRange:
    """The range's offsets from the broker's timestamp index (see the module docstring);
    call it once the fronts promised ``to_slot``."""
    from confluent_kafka import TopicPartition

    topic = options.get("subscribe", "")
    if not topic or "," in topic:
        raise KafkaReplayRefused("replay by time reads one topic named by subscribe=; this "
                                 "query reads " + (topic or "by assign= or a pattern"))
    consumer = _consumer(options)
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        parts = sorted(meta.partitions)
        found = consumer.offsets_for_times(
            [TopicPartition(topic, p, from_slot * delta_ms) for p in parts], timeout=timeout_s)
        offsets = {}
        for tp in found:
            if tp.error is not None:
                raise KafkaReplayRefused(f"the broker found no offset of {from_slot * delta_ms} "
                                         f"ms in partition {tp.partition} of {topic!r}: "
                                         f"{tp.error}")
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition),
                                                       timeout=timeout_s)
            start = high if tp.offset < 0 else tp.offset
            if low > 0 and start == low:
                raise KafkaReplayRefused(
                    f"partition {tp.partition} of {topic!r} no longer holds its records "
                    f"before offset {low} (retention): the replay's start may be gone; "
                    "replay from a later time")
            offsets[tp.partition] = (start, high)
    finally:
        consumer.close()
    return KafkaRange(topic, from_slot, to_slot, offsets)


def reading(df: Any, rng: KafkaRange, time_col: str) -> Any:
    """``df`` (a stream over the topic) reading ``rng``'s offsets and keeping the
    records with a label time in its range: the Kafka relation in its plan rebuilt."""
    from pyspark.sql import DataFrame

    spark = df.sparkSession
    jvm = spark._jvm
    rel = _relation(df)
    opts = {k: v for k, v in kafka_options(df).items()  # type: ignore[union-attr]
            if k not in ("subscribe", "subscribepattern", "assign", "startingoffsets",
                         "startingoffsetsbytimestamp", "startingtimestamp")}
    opts["assign"] = json.dumps({rng.topic: sorted(rng.offsets)})
    opts["startingOffsets"] = rng.json()
    jopts = jvm.org.apache.spark.sql.util.CaseInsensitiveStringMap(jvm.java.util.HashMap(opts))
    fields = [rel.productElement(i) for i in range(rel.productArity())]
    fields[[rel.productElementName(i) for i in range(rel.productArity())].index(
        "extraOptions")] = jopts
    new = rel.copy(*fields)

    def rebuild(plan: Any) -> Any:
        if plan.equals(rel):
            return new
        kids = plan.children()
        if kids.size() == 0:
            return plan
        rebuilt = jvm.java.util.ArrayList([rebuild(kids.apply(i)) for i in range(kids.size())])
        return plan.withNewChildren(jvm.org.apache.spark.api.python.PythonUtils.toSeq(rebuilt))

    plan = rebuild(df._jdf.queryExecution().analyzed())
    jdf = jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession, plan)
    out = DataFrame(jdf, spark)
    return out.where(f"`{time_col}` >= {rng.from_slot} AND `{time_col}` < {rng.to_slot}")


def range_acks(spark: Any, options: dict[str, str], rng: KafkaRange, delta_ms: int,
               segment: int) -> AckBatch:
    """The range's records as the ingest segment's acks (XOR and count per time), from
    their label headers; refuses records whose Kafka timestamp is not their label
    time."""
    client = {k: v for k, v in options.items() if k.startswith("kafka.")}
    raw = (spark.read.format("kafka").options(**client)
           .option("assign", json.dumps({rng.topic: sorted(rng.offsets)}))
           .option("startingOffsets", rng.json()).option("endingOffsets", rng.json(end=True))
           .option("includeHeaders", "true").load())
    labels = [f"{e} AS {n}" for n, e in KAFKA_HEADER_EXPRS.items()]
    rows = (raw.selectExpr("unix_millis(timestamp) AS ts_ms", *labels)
            .where(f"lt_time >= {rng.from_slot} AND lt_time < {rng.to_slot}"))
    bad = rows.where(f"ts_ms != lt_time * {delta_ms}").limit(1).collect()
    if bad:
        raise KafkaReplayRefused(
            f"{rng.topic!r} has records whose Kafka timestamp is not their label time (an "
            "event-time front): the broker's index cannot find a time's offsets; replay "
            "from the ingest log, or rerun the query from the earliest offsets")
    per_time = (rows.groupBy("lt_time").agg({"lt_ack": "bit_xor", "*": "count"})
                .toDF("t", "x", "n").orderBy("t").toPandas())
    return AckBatch.from_columns(segment, per_time["t"].to_numpy(),
                                 from_label(per_time["x"].to_numpy()),
                                 per_time["n"].to_numpy())
