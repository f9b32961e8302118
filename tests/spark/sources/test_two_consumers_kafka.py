"""One Kafka topic, two Spark queries (issue 25 point 6): each query is a consumer with
its own ingest segment, and the producers' fronts send every record into both
(``segment=("in_a", "in_b")``, rule 11). Both queries read every record, both sinks
complete through the producers' last promise, and both equal the batch recomputation:
fan-out across queries neither stalls nor reports duplicates."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import lowtide
from lowtide.spark.sources.front import Front
from lowtide.spark.sources.kafka_producer import KafkaProducerConfig
from tests.spark.sources.helpers import (
    GRID,
    SIZE,
    WINDOW_MS,
    assert_equal_to_batch,
    close_all,
    kafka_labelled,
    needs_kafka_connector,
    producing,
    results_of,
)

pytestmark = pytest.mark.spark


def test_two_queries_of_one_topic_both_complete(spark, kafka_broker, kafka_topic,
                                                 tmp_path: Path) -> None:
    needs_kafka_connector(spark)
    topic = kafka_topic(2)
    pipe = lowtide.Pipeline(spark, "kafka-two", grid=GRID, stuck_after_ms=60_000)
    branches = {name: pipe.read_stream(kafka_labelled(spark, kafka_broker.bootstrap, topic),
                                       name=f"in_{name}")
                .window(f"{WINDOW_MS} milliseconds", key="k", name=f"win_{name}")
                .agg(n="count", total=("v", "sum")) for name in ("a", "b")}
    plan = pipe.plan(*((stream, f"out_{name}") for name, stream in branches.items()))
    pipe.start_tracker(plan.graph)
    fronts = [Front(None, i, pipe.tracker_ref, segment=("in_a", "in_b"), heartbeat_ms=20)
              for i in range(2)]
    producers = [KafkaProducerConfig(topic, kafka_broker.bootstrap, partition=i).build(f)
                 for i, f in enumerate(fronts)]
    queries = [stream.write_parquet(str(tmp_path / name), checkpoint=str(tmp_path / f"c{name}"),
                                    name=f"out_{name}", trigger="300 milliseconds")
               for name, stream in branches.items()]
    written: list[pd.DataFrame] = []
    try:
        threads = [producing(producers[0], 5, 0.2, written),
                   producing(producers[1], 2, 1.0, written)]  # partition 1 lags
        for t in threads:
            t.join()
        last_end = (max(int(w["lt_time"].max()) for w in written) // SIZE + 1) * SIZE
        for query in queries:
            query.wait_for_min_time(last_end, timeout_s=240)
            assert not query.stuck()
    finally:
        close_all(pipe, queries, producers, fronts)
    assert len(written) == 7
    for name in branches:
        assert_equal_to_batch(results_of(tmp_path / name), written)
