"""Fronts writing to Kafka: a real broker and a real tracker service; plain
confluent-kafka consumers ack their receipts from the records' headers (the Spark
side is read_stream's). Faults: a delivery that fails, a retry with the same labels."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import ManualClock, TimeGrid
from lowtide.spark.sources.front import Front
from lowtide.spark.sources.kafka_producer import DeliveryFailed, KafkaProducerConfig
from lowtide.spark.sources.labels import from_label, parse_header
from lowtide.spark.tracking import AckAccumulator
from lowtide.spark.tracking.transport import TrackerRef, connect
from tests.spark.helpers import CoreAgent

pytestmark = pytest.mark.socket
GRID = TimeGrid(delta_ms=10)
GRAPH = SegmentGraph.of(("ingest", ()), ("ingest_b", ()), ("sink", ("ingest", "ingest_b")))


def read_and_ack(bootstrap: str, topic: str, partitions: list[int], agent: Any,
                 segment: str, expect: int) -> list[tuple[int, int]]:
    """A consumer of ``partitions`` from the start: acks each record's receipt in its
    segment (lt_ack XOR-ed into lt_time, count -1), one idempotent batch per partition
    run; returns (lt_time, lt_ack) of what it read."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from lowtide.service import BatchKey

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": segment,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    got: dict[int, list[tuple[int, int, int]]] = {p: [] for p in partitions}
    deadline = time.monotonic() + 30
    while sum(map(len, got.values())) < expect and time.monotonic() < deadline:
        for m in consumer.consume(num_messages=100, timeout=0.5):
            if m.error() is None:
                h = dict(m.headers())
                got[m.partition()].append(
                    (m.offset(), parse_header(h["lt_time"]), parse_header(h["lt_ack"])))
    consumer.close()
    for p, rows in got.items():
        if rows:
            acc = AckAccumulator()
            acc.add(GRAPH.index(segment), np.array([r[1] for r in rows]),
                    from_label([r[2] for r in rows]), -1)
            agent.send_batch(BatchKey(segment, rows[0][0], segment, p),
                             acc.build(GRID.window_slots))
    return [(t, a) for rows in got.values() for _o, t, a in rows]


def segment_status(svc: Any, name: str) -> dict[str, Any]:
    return next(s for s in svc.status()["segments"] if s["segment"] == name)


def wait_for(check: Callable[[], bool], timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_producers_per_partition_one_lagging_and_two_consumers_complete_exactly(
        kafka_broker, kafka_topic) -> None:
    from lowtide.service import Agent, TrackerService

    topic = kafka_topic(3)
    with TrackerService.start(GRAPH, grid=GRID) as svc:
        ref = TrackerRef(svc.url, GRAPH, GRID)
        fronts = [Front(None, i, ref, segment=("ingest", "ingest_b"), heartbeat_ms=10)
                  for i in range(3)]
        producers = [KafkaProducerConfig(topic, kafka_broker.bootstrap, partition=i)
                     .build(f) for i, f in enumerate(fronts)]
        for _round in range(3):  # producers 0 and 1 write; producer 2 lags behind
            for i in (0, 1):
                producers[i].send([b"p%d" % i] * 5)
        lagging = producers[2].send(pd.DataFrame({"v": range(4)}))
        consumer = Agent.connect(svc.url, GRAPH)
        try:
            got_a = read_and_ack(kafka_broker.bootstrap, topic, [0, 1], consumer, "ingest", 30)
            assert len(got_a) == 30
            time.sleep(0.1)  # the fronts heartbeat past everything they wrote
            ingest = segment_status(svc, "ingest")
            assert ingest["sent"] == 34 and ingest["received"] == 30
            assert ingest["min_time"] <= int(lagging.times.min())  # partition 2 unread
            got_a += read_and_ack(kafka_broker.bootstrap, topic, [2], consumer, "ingest", 4)
            assert wait_for(lambda: segment_status(svc, "ingest")["min_time"]
                            > int(lagging.times.max()))
            # consumer B has read nothing: its own segment waits, A's does not
            assert segment_status(svc, "ingest_b")["min_time"] <= int(lagging.times.min())
            got_b = read_and_ack(kafka_broker.bootstrap, topic, [0, 1, 2], consumer,
                                 "ingest_b", 34)
            assert sorted(got_a) == sorted(got_b) and len(set(got_b)) == 34
            assert wait_for(lambda: segment_status(svc, "ingest_b")["min_time"]
                            > int(lagging.times.max()))
            for name in ("ingest", "ingest_b"):
                seg = segment_status(svc, name)
                assert seg["sent"] == seg["received"] == 34 and seg["stuck_windows"] == 0
        finally:
            consumer.close()
            for f in fronts:
                f.close()
            connect(ref).close()  # the fronts' shared agent, before its tracker stops


def test_a_failed_delivery_holds_the_front_below_the_batch(kafka_broker, kafka_topic) -> None:
    topic = kafka_topic(1)
    agent, clock = CoreAgent(GRAPH, GRID), ManualClock(1_000_000)
    front = Front(None, 5, agent, grid=GRID, clock=clock, heartbeat_ms=None)
    producer = KafkaProducerConfig(topic, kafka_broker.bootstrap, partition=7, retries=1,
                                   timeout_s=10).build(front)  # no partition 7
    with pytest.raises(DeliveryFailed, match="holds its heartbeats"):
        producer.send([b"x", b"y"])
    clock.advance(500)
    assert front.heartbeat() == 100_000 and front.status()["in_flight"] == 2
    agent.tracker.step(0)
    assert agent.tracker.min_time("ingest") == 100_000  # the records are missing there


class FlakyProducer:
    """A confluent-kafka Producer double whose first delivery of each value fails."""

    def __init__(self) -> None:
        self.queued: list[tuple[Any, bytes, list[Any]]] = []
        self.written: list[tuple[bytes, list[Any]]] = []
        self.failed_once: set[bytes] = set()

    def produce(self, topic: str, value: bytes, key: Any, headers: list[Any],
                on_delivery: Any, **extra: Any) -> None:
        self.queued.append((on_delivery, value, headers))

    def flush(self, timeout: float) -> int:
        for on_delivery, value, headers in self.queued:
            if value not in self.failed_once:
                self.failed_once.add(value)
                on_delivery("broker down", None)
            else:
                self.written.append((value, headers))
                on_delivery(None, None)
        self.queued.clear()
        return 0


def test_records_that_failed_are_produced_again_with_the_same_labels() -> None:
    agent, clock = CoreAgent(GRAPH, GRID), ManualClock(1_000_000)
    front = Front(None, 6, agent, grid=GRID, clock=clock, heartbeat_ms=None)
    flaky = FlakyProducer()
    batch = KafkaProducerConfig("t", "unused").build(front, producer=flaky).send([b"a", b"b"])
    assert [v for v, _h in flaky.written] == [b"a", b"b"]
    labels = [dict(h)["lt_ack"] for _v, h in flaky.written]
    assert [parse_header(x) for x in labels] == batch.acks.tolist()
    assert [parse_header(dict(h)["lt_front"]) for _v, h in flaky.written] == [6, 6]
    assert front.status()["written"] == 2 and front.status()["in_flight"] == 0


def test_retention_kafka_names_the_complete_offsets(kafka_broker, kafka_topic, tmp_path,
                                                     capsys) -> None:
    """A clock front's records carry their label time as Kafka timestamp: the tracker's
    min time maps to exactly the offsets below it."""
    import json

    from lowtide.cli import main

    topic = kafka_topic(1)
    agent, clock = CoreAgent(GRAPH, GRID), ManualClock(1_000_000)
    front = Front(None, 8, agent, grid=GRID, clock=clock, heartbeat_ms=None)
    producer = KafkaProducerConfig(topic, kafka_broker.bootstrap, partition=0).build(front)
    producer.send([b"a", b"b", b"c"])  # slot 100_000
    clock.advance(50)
    producer.send([b"d", b"e"])  # slot 100_005
    expected = {100_005: 3, 100_006: 5, 100_000: 0}
    for global_min, offset in expected.items():
        status = tmp_path / "status.json"
        status.write_text(json.dumps({"delta_ms": 10, "global_min": global_min,
                                      "segments": []}))
        assert main(["retention", "kafka", "--status", str(status), "--topic", topic,
                     "--bootstrap", kafka_broker.bootstrap]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["complete_below_offsets"] == {"0": offset}, global_min
