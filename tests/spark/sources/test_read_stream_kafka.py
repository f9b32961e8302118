"""The real Kafka source as a tracked entry: a broker started by the suite, a topic of
three partitions, a producer (``lowtide.Front`` + the Kafka helper) per partition, one
lagging; Spark's Kafka source reads the labels from the record headers. Exact windows
equal a batch recomputation of what the producers wrote, under an injected task
failure."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import lowtide
from tests.spark.sources.helpers import (
    GRID,
    SIZE,
    assert_equal_to_batch,
    close_all,
    exact_windows,
    kafka_fronts,
    kafka_labelled,
    needs_kafka_connector,
    producing,
    results_of,
)

pytestmark = pytest.mark.spark


def test_kafka_entry_equals_batch(spark, kafka_broker, kafka_topic, tmp_path: Path) -> None:
    needs_kafka_connector(spark)
    topic = kafka_topic(3)
    pipe = lowtide.Pipeline(spark, "kafka-entry", grid=GRID, stuck_after_ms=60_000)
    stream = exact_windows(pipe, kafka_labelled(spark, kafka_broker.bootstrap, topic))
    pipe.start_tracker(stream.graph())
    fronts, producers = kafka_fronts(pipe, kafka_broker.bootstrap, topic, 3)
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
