"""A second query of a Kafka topic, attached while its producers run (issue 34 point 5,
rule 16): the producers' fronts share a ``joins_dir`` with the queries, each running
front joins the new query between two of its batches (no restart), and the query keeps
each front's records from its join time on. Both queries complete through the
producers' last promise; the first equals the batch recomputation of every record, the
second that of each producer's records from its join time. Detached, the fronts leave
it and the first query runs on."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

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
    results_of,
)

pytestmark = pytest.mark.spark


def producing(producer: KafkaProducerConfig, front: int, stop: threading.Event,
              every_s: float, out: list[pd.DataFrame]) -> threading.Thread:
    def run() -> None:
        i = 0
        while not stop.is_set():
            rows = pd.DataFrame({"k": [f"k{j % 3}" for j in range(i, i + 12)],
                                 "v": list(range(i, i + 12))})
            out.append(producer.send(rows).records.assign(front=front))
            i += 1
            time.sleep(every_s)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_query_attached_to_a_topic_joins_its_running_producers(
        spark, kafka_broker, kafka_topic, tmp_path: Path) -> None:
    needs_kafka_connector(spark)
    topic, joins = kafka_topic(2), str(tmp_path / "joins")
    pipe = lowtide.Pipeline(spark, "kafka-join", grid=GRID, stuck_after_ms=60_000)

    def per_key(name: str) -> Any:  # a running query
        df = kafka_labelled(spark, kafka_broker.bootstrap, topic, front=True)
        return (pipe.read_stream(df, name=f"in_{name}", joins_dir=joins)
                .window(f"{WINDOW_MS} milliseconds", key="k", name=f"win_{name}")
                .agg(n="count", total=("v", "sum"))
                .write_parquet(str(tmp_path / name), checkpoint=str(tmp_path / f"c{name}"),
                               name=f"out_{name}", trigger="300 milliseconds"))

    queries = [per_key("a")]
    fronts = [Front(None, i, pipe.tracker_ref, segment="in_a", joins_dir=joins,
                    heartbeat_ms=20) for i in range(2)]
    producers = [KafkaProducerConfig(topic, kafka_broker.bootstrap, partition=i).build(f)
                 for i, f in enumerate(fronts)]
    written: list[pd.DataFrame] = []
    stop = threading.Event()
    starts: dict[int, int] = {}
    try:
        threads = [producing(p, i, stop, 0.2 + 0.3 * i, written)
                   for i, p in enumerate(producers)]
        time.sleep(2.0)
        queries.append(per_key("b"))            # later; the producers run on
        deadline = time.monotonic() + 180
        while not all("in_b" in f.segments for f in fronts):
            assert queries[1].exception() is None, queries[1].exception()
            assert time.monotonic() < deadline, "the fronts did not join"
            time.sleep(0.1)
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join()
        last_end = (max(int(w["lt_time"].max()) for w in written) // SIZE + 1) * SIZE
        for query in queries:
            query.wait_for_min_time(last_end, timeout_s=240)
            assert not query.stuck()
        starts = {i: json.loads((Path(joins) / "joins" / "in_b" / f"f{i}.json").read_text())
                  ["time"] for i in range(2)}
        pipe.detach(queries[1])                 # the fronts leave it, the first runs on
        assert all(f.segments == ("in_a",) for f in fronts)
    finally:
        stop.set()
        close_all(pipe, queries, producers, fronts)
    assert all(starts[w["front"].iloc[0]] > int(w["lt_time"].max()) for w in written[:2])
    after = [w[w["lt_time"] >= starts[w["front"].iloc[0]]] for w in written]
    assert 0 < sum(map(len, after)) < sum(map(len, written))
    assert_equal_to_batch(results_of(tmp_path / "a"), written)
    assert_equal_to_batch(results_of(tmp_path / "b"), [w for w in after if len(w)])
