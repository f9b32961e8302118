"""The real Kafka source as a tracked entry: a broker started by the suite, a topic of
three partitions, a producer (``lowtide.Front`` + the Kafka helper) per partition, one
lagging; Spark's Kafka source reads the labels from the record headers. Exact windows
equal a batch recomputation of what the producers wrote, under an injected task
failure."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import lowtide
from lowtide.spark.sources.front import Front
from lowtide.spark.sources.kafka_producer import KafkaProducerConfig
from lowtide.spark.sources.labels import KAFKA_HEADER_EXPRS
from tests.spark.sources.test_read_stream import (
    GRID,
    SIZE,
    assert_equal_to_batch,
    exact_windows,
    results_of,
)

pytestmark = pytest.mark.spark


def kafka_labelled(spark: Any, bootstrap: str, topic: str) -> Any:
    """The topic's records: the JSON fields, and the labels from the headers."""
    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", topic).option("startingOffsets", "earliest")
           .option("includeHeaders", "true").load())
    labels = [f"{expr} AS {name}" for name, expr in KAFKA_HEADER_EXPRS.items()]
    return (raw.selectExpr("from_json(CAST(value AS STRING), 'k string, v long') AS r",
                           *labels).selectExpr("r.k AS k", "r.v AS v", "lt_time", "lt_ack"))


def producing(producer: Any, rounds: int, every_s: float, out: list) -> threading.Thread:
    def run() -> None:
        for i in range(rounds):
            rows = pd.DataFrame({"k": [f"k{j % 3}" for j in range(i, i + 12)],
                                 "v": list(range(i, i + 12))})
            out.append(producer.send(rows).records)
            time.sleep(every_s)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def close_all(pipe: Any, queries: list[Any], producers: list[Any], fronts: list[Any]) -> None:
    """Stop the queries, then the producers and their fronts, then the pipeline."""
    for query in queries:
        query.stop()
    for closable in (*producers, *fronts):
        closable.close()
    pipe.close()


def test_kafka_entry_equals_batch(spark, kafka_broker, kafka_topic, tmp_path: Path) -> None:
    if "spark-sql-kafka" not in spark.conf.get("spark.jars", ""):
        pytest.skip("the shared Spark session has no Kafka connector: give tests/conftest.py's "
                    "session SessionConfig(kafka=True, delta=True)'s spark.jars")
    topic = kafka_topic(3)
    pipe = lowtide.Pipeline(spark, "kafka-entry", grid=GRID, stuck_after_ms=60_000)
    stream = exact_windows(pipe, kafka_labelled(spark, kafka_broker.bootstrap, topic))
    pipe.start_tracker(stream.graph())
    fronts = [Front(None, i, pipe.tracker_ref, segment="ingest", heartbeat_ms=20)
              for i in range(3)]
    producers = [KafkaProducerConfig(topic, kafka_broker.bootstrap, partition=i).build(f)
                 for i, f in enumerate(fronts)]
    query = stream.write_parquet(str(tmp_path / "out"), checkpoint=str(tmp_path / "ckpt"),
                                 trigger="300 milliseconds")
    written: list[pd.DataFrame] = []
    try:
        # partitions 0 and 1 every 0.2 s; partition 2 lags: rarely, and last
        threads = [producing(producers[0], 6, 0.2, written),
                   producing(producers[1], 6, 0.2, written),
                   producing(producers[2], 2, 1.5, written)]
        for t in threads:
            t.join()
        last_end = (max(int(w["lt_time"].max()) for w in written) // SIZE + 1) * SIZE
        query.wait_for_min_time(last_end, timeout_s=240)  # the fronts heartbeat on
        assert not query.stuck()
    finally:
        close_all(pipe, [query], producers, fronts)
    assert len(written) == 14
    assert_equal_to_batch(results_of(tmp_path / "out"), written)
