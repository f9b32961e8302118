"""Replay by time from a Kafka topic, end to end: a real broker, a topic of two
partitions fed by a front each, an exact windowed query over it; a replay of a time
range into a fresh folder equals the batch recomputation of that range, and a replay
past the fronts' promise, or from a start the topic no longer holds, is refused; a
step loses rows once, the loss names the partitions' offsets, and one repair completes
the sink's windows exactly once."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lowtide
from lowtide.bench.chaos.replay_fault import drop_once
from lowtide.spark.pipeline.replay import ReplayRefused, replay
from lowtide.spark.sources.front import Front
from lowtide.spark.sources.kafka_producer import KafkaProducerConfig
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


def _drop_before(bootstrap: str, topic: str, partition: int, offset: int) -> None:
    """What retention does: the partition's records before ``offset`` are deleted."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, partition, offset)]).values():
        future.result(timeout=30)


@pytest.mark.slow  # ~18 s; a replay from the ingest log by default: test_replay_e2e.py
def test_kafka_replay_equals_batch_of_range(spark, kafka_broker, kafka_topic,
                                            tmp_path: Path) -> None:
    needs_kafka_connector(spark)
    topic = kafka_topic(2)
    pipe = lowtide.Pipeline(spark, "kafka-replay", grid=GRID, stuck_after_ms=60_000)
    stream = exact_windows(pipe, kafka_labelled(spark, kafka_broker.bootstrap, topic))
    pipe.start_tracker(stream.graph())
    fronts, producers = kafka_fronts(pipe, kafka_broker.bootstrap, topic, 2)
    query = stream.write_parquet(str(tmp_path / "out"), checkpoint=str(tmp_path / "ckpt"),
                                 trigger="300 milliseconds")
    written: list[pd.DataFrame] = []
    try:
        for t in [producing(producers[0], 6, 0.2, written),
                  producing(producers[1], 4, 0.3, written)]:
            t.join()
        rows = pd.concat(written, ignore_index=True)
        last_end = (int(rows["lt_time"].max()) // SIZE + 1) * SIZE
        query.wait_for_min_time(last_end, timeout_s=240)
        query.stop()
        times = sorted(rows["lt_time"])
        lo = times[len(times) // 3] // SIZE * SIZE + SIZE // 2  # mid-window: a part of it
        with pytest.raises(ReplayRefused, match="promised only up to"):
            pipe.replay(lo * GRID.delta_ms, (last_end + 100_000) * GRID.delta_ms,
                        str(tmp_path / "early"))
        replayed = pipe.replay(lo * GRID.delta_ms, last_end * GRID.delta_ms,
                               str(tmp_path / "fresh"), timeout_s=240)
        assert (replayed.from_slot, replayed.to_slot) == (lo, last_end)
        assert sorted(replayed.offsets) == [0, 1]
        # what retention does to partition 0: its first records gone, a replay from
        # the start would miss them, one from after them is exact again
        _drop_before(kafka_broker.bootstrap, topic, 0, 3)
        with pytest.raises(ReplayRefused, match="no longer holds"):
            pipe.replay(times[0] * GRID.delta_ms, last_end * GRID.delta_ms,
                        str(tmp_path / "gone"))
    finally:
        close_all(pipe, [query], producers, fronts)
    assert not (tmp_path / "early").exists() or not any((tmp_path / "early").iterdir())
    assert_equal_to_batch(results_of(tmp_path / "out"), written)
    in_range = rows[(rows["lt_time"] >= lo) & (rows["lt_time"] < last_end)]
    assert 0 < len(in_range) < len(rows)
    assert_equal_to_batch(results_of(tmp_path / "fresh"), [in_range])


@pytest.mark.slow  # ~50 s; a repair from the ingest log is in make test (test_replay_e2e.py)
def test_kafka_loss_repaired_exactly_once(spark, kafka_broker, kafka_topic,
                                          tmp_path: Path) -> None:
    needs_kafka_connector(spark)
    topic, out = kafka_topic(2), tmp_path / "out"
    pipe = lowtide.Pipeline(spark, "kafka-repair", grid=GRID, stuck_after_ms=3_000)
    stream = (pipe.read_stream(kafka_labelled(spark, kafka_broker.bootstrap, topic,
                                             extra=("offset",)))
              .transform(lambda d: d.mapInArrow(drop_once(str(tmp_path / "dropped")),
                                                d.schema)))
    pipe.start_tracker(stream.graph())
    fronts, producers = kafka_fronts(pipe, kafka_broker.bootstrap, topic, 2)
    query = stream.write_parquet(str(out), checkpoint=str(tmp_path / "ckpt"),
                                 keep_tracking_columns=True, trigger="300 milliseconds")
    written: list[pd.DataFrame] = []
    try:
        for t in [producing(producers[0], 4, 0.2, written),
                  producing(producers[1], 4, 0.2, written)]:
            t.join()
        rows = pd.concat(written, ignore_index=True)
        last = int(rows["lt_time"].max()) + 1
        deadline = time.monotonic() + 120
        while not (found := [x for x in pipe.losses() if x.segment == "sink"]):
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, f"no loss reported: {pipe.status().stuck}"
            time.sleep(0.3)
        assert "item(s) missing; replay partition" in found[0].describe(GRID)
        repaired = pipe.repair(timeout_s=180)
        assert repaired.rows == sum(x.missing for x in repaired.losses) > 0
        query.wait_for_min_time(last, timeout_s=120)
    finally:
        close_all(pipe, [query], producers, fronts)
    got = pa.concat_tables([pq.read_table(f, columns=["k", "v", "lt_time"])
                            for f in sorted(out.glob("part-*.parquet"))]).to_pandas()
    key = ["k", "v", "lt_time"]
    assert Counter(map(tuple, got[key].values.tolist())) == \
        Counter(map(tuple, rows[key].values.tolist()))


def test_kafka_replay_refuses_event_time_records(spark, kafka_broker, kafka_topic) -> None:
    """An event-time front's records carry the broker's clock as Kafka timestamp, not
    their label time: the index cannot find a time's offsets, so no replay."""
    needs_kafka_connector(spark)
    topic = kafka_topic(1)
    pipe = lowtide.Pipeline(spark, "kafka-event-time", grid=GRID, stuck_after_ms=60_000)
    stream = pipe.read_stream(kafka_labelled(spark, kafka_broker.bootstrap, topic))
    pipe.start_tracker(stream.graph())
    front = Front(None, 0, pipe.tracker_ref, segment="ingest", heartbeat_ms=None,
                  time_from="ts")
    producer = KafkaProducerConfig(topic, kafka_broker.bootstrap, partition=0).build(front)
    try:
        now_ms = int(time.time() * 1000)
        ts = pd.to_datetime([now_ms - 60_000, now_ms - 59_000], unit="ms")
        batch = producer.send(pd.DataFrame({"ts": ts, "k": ["a", "b"], "v": [1, 2]}))
        end = int(max(batch.times)) + 1
        producer.close()
        assert front.close(end=False) >= end  # a pause: its promise past its newest record
        with pytest.raises(ReplayRefused, match="not their label time"):
            replay(pipe, stream, int(min(batch.times)) * GRID.delta_ms, end * GRID.delta_ms,
                   "/nonexistent-replay-out")  # as `lowtide replay --app` does
    finally:
        close_all(pipe, [], [], [])
