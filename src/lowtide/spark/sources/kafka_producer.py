"""A front's records into a Kafka topic (confluent-kafka; no pyspark).

``KafkaProducerConfig(topic, bootstrap).build(front).send(records)``:

1. ``front.label(records)``: labels, and the send-acks go to the tracker first;
2. each record is produced with headers ``lt_time``/``lt_ack``/``lt_front`` (the contract:
   :mod:`lowtide.spark.sources.labels`); bytes are the value as given, table rows
   become one JSON object each (label fields included);
3. the producer waits for the broker's delivery reports; records that failed are
   produced again with the *same* labels (``retries`` times), so a record is never
   written under a second identity;
4. a clock front's records carry their label time as Kafka timestamp
   (``lt_time * delta_ms``), so the tracker's "complete below t" is a set of offsets
   (``lowtide retention kafka``);
5. ``front.written(batch)`` once every record was delivered: only then may the front's
   heartbeats pass the batch. A batch that still fails raises
   :class:`DeliveryFailed` and stays in flight at the front, so its ingest segment
   stops there and the tracker reports the records missing (fail closed); a record
   that was delivered after all shows as an extra item, never as a silent gap.

The producer is idempotent (``enable.idempotence``): the client's own retries do not
write duplicates. The client's own log lines (librdkafka's, e.g. a broker still
starting) go to the Python logger ``lowtide.kafka.client``, not straight to stderr.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from lowtide.core.errors import LowtideError
from lowtide.spark.sources import records as rec
from lowtide.spark.sources.front import Front, Labelled
from lowtide.spark.sources.labels import ACK_COLUMN, FRONT_COLUMN, TIME_COLUMN, header_value

__all__ = ["KAFKA_CLIENT_LOGGER", "DeliveryFailed", "KafkaFrontProducer",
           "KafkaProducerConfig", "row_values"]

#: where the Kafka client's log lines go (set its level to hear fewer or more)
KAFKA_CLIENT_LOGGER = "lowtide.kafka.client"


class DeliveryFailed(LowtideError, RuntimeError):
    """The broker did not confirm every record of a batch (it stays in flight)."""


def row_values(records: Any) -> list[bytes]:
    """The Kafka values of a batch: bytes as given, table rows as JSON objects
    (timestamps in ISO 8601 with milliseconds)."""
    if rec.kind(records) == "bytes":
        return [bytes(r) for r in records]
    return [line.encode() for line in rec.json_lines(records)]


@dataclass(frozen=True)
class KafkaProducerConfig:
    """Where a front's records go. ``partition``: a fixed partition (one producer per
    partition), else the client's partitioner (by ``key_column`` if given);
    ``client``: extra confluent-kafka settings."""

    topic: str
    bootstrap: str
    partition: int | None = None
    key_column: str | None = None
    retries: int = 3
    timeout_s: float = 30.0
    client: tuple[tuple[str, str], ...] = ()

    def build(self, front: Front, producer: Any = None) -> KafkaFrontProducer:
        """The helper for ``front`` (``producer``: an existing confluent_kafka Producer)."""
        if producer is None:
            from confluent_kafka import Producer

            settings = {"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
                        "linger.ms": 5, **dict(self.client)}
            producer = Producer(settings, logger=logging.getLogger(KAFKA_CLIENT_LOGGER))
        return KafkaFrontProducer(self, front, producer)


class KafkaFrontProducer:
    def __init__(self, config: KafkaProducerConfig, front: Front, producer: Any) -> None:
        self.config = config
        self.front = front
        self.producer = producer

    def _keys(self, records: Any) -> list[bytes | None]:
        column = self.config.key_column
        if column is None:
            return [None] * rec.count(records)
        frame = records.to_pandas() if rec.kind(records) == "arrow" else records
        return [str(v).encode() for v in frame[column]]

    def send(self, records: Any) -> Labelled:
        """Label, produce, wait for delivery, then let the front heartbeat past the batch;
        returns the labelled batch (``.rejected``: late records not written)."""
        batch = self.front.label(records)
        pending = list(self._messages(batch))
        for _attempt in range(1 + self.config.retries):
            pending = self._deliver(pending)
            if not pending:
                self.front.written(batch)
                return batch
        raise DeliveryFailed(
            f"{len(pending)} of {len(batch)} records to {self.config.topic!r} were not "
            f"confirmed after {1 + self.config.retries} attempts: the front holds its "
            "heartbeats below them; check the broker, then restart the producer")

    def _messages(self, batch: Labelled) -> Iterator[tuple[Any, bytes, list[Any], int]]:
        values = row_values(batch.records)
        keys = self._keys(batch.records)
        # a clock front's label time is the record's Kafka timestamp, so "complete below
        # t" maps to offsets (offsets_for_times); event times stay out of the broker's
        # time-based retention (old events would be deleted on arrival)
        delta_ms = self.front.grid.delta_ms if self.front.time_from is None else 0
        front = (FRONT_COLUMN, header_value(self.front.front))
        for key, value, t, a in zip(keys, values, batch.times, batch.acks, strict=True):
            headers = [(TIME_COLUMN, header_value(t)), (ACK_COLUMN, header_value(a)), front]
            yield key, value, headers, int(t) * delta_ms

    def _deliver(self, messages: list[Any]) -> list[Any]:
        """Produce ``messages`` and wait for their reports; returns those that failed."""
        failed: list[Any] = []
        delivered: list[Any] = []
        extra = {} if self.config.partition is None else {"partition": self.config.partition}
        for m in messages:
            key, value, headers, timestamp_ms = m
            self._produce(key, value, headers, {**extra, "timestamp": timestamp_ms},
                          lambda err, _msg, m=m: (failed if err else delivered).append(m))
        self.producer.flush(self.config.timeout_s)
        unreported = len(messages) - len(delivered) - len(failed)
        if unreported:
            raise DeliveryFailed(
                f"{unreported} records to {self.config.topic!r} have no delivery report "
                f"after {self.config.timeout_s:.0f} s: the front holds its heartbeats "
                "below them")
        return failed

    def _produce(self, key: Any, value: bytes, headers: list[Any], extra: dict[str, int],
                 on_delivery: Any) -> None:
        while True:
            try:
                self.producer.produce(self.config.topic, value=value, key=key,
                                      headers=headers, on_delivery=on_delivery, **extra)
                return
            except BufferError:  # the client's queue is full: let it drain, then retry
                self.producer.poll(0.1)
            except Exception as exc:  # refused before sending (e.g. unknown partition)
                on_delivery(exc, None)
                return

    def close(self) -> None:
        self.producer.flush(self.config.timeout_s)

