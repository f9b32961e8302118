"""A standby tracker: it follows the leader's step log and takes over when the leader
falls silent (rule 18).

It reads the group's topic with ``isolation.level=read_committed``, so it sees exactly
the groups the leader may have confirmed, and replays each through its own engine (as
recovery from a state dir does): it holds the leader's state, every confirmed batch and
every open hold. Once nothing arrived for a lease (a live leader writes a heartbeat
every quarter lease), :meth:`Standby.take_over` calls ``init_transactions`` with the
group's transactional id, which fences the old leader's producer and aborts its open
transaction, and then reads to the end of the log before the new leader serves.

Blocking (librdkafka's calls are): the server runs it on a worker thread.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from lowtide.core.graph import SegmentGraph
from lowtide.service.engine.base import Engine, Logged
from lowtide.service.ha.config import HaConfig
from lowtide.service.ha.leader_log import (
    BEAT,
    EPOCH,
    GRAPH,
    MAX_MESSAGE_BYTES,
    STEPS,
    LeadLost,
    kafka,
    lead_lost,
)
from lowtide.service.persistence.state_log import apply_group
from lowtide.wire.log import read_records
from lowtide.wire.messages import Commit, graph_of

log = logging.getLogger("lowtide.service.ha")

POLL_S = 0.1


class StepLogDamaged(Exception):
    """A committed message of the step log cannot be applied: following on would
    serve a state the leader never had."""


class Standby:
    """Follows ``config``'s topic into an engine (``build`` makes it from the graph)."""

    def __init__(self, config: HaConfig, build: Callable[[SegmentGraph], Engine]) -> None:
        self.config = config
        self._build = build
        self.engine: Engine | None = None
        self.epoch = 0  # the highest leader epoch in the log
        self.groups = 0
        self._group: list[Logged] = []
        ck = kafka()
        ensure_topic(config)
        self._consumer = ck.Consumer(config.settings(**{
            "group.id": f"lowtide-standby-{uuid.uuid4().hex}",  # offsets are never committed
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.message.max.bytes": MAX_MESSAGE_BYTES,
            "fetch.wait.max.ms": min(100, config.beat_ms),  # the lease counts from arrival
            "logger": log,
        }))
        self._partition = ck.TopicPartition(config.topic, 0, ck.OFFSET_BEGINNING)
        self._consumer.assign([self._partition])
        self._heard = time.monotonic()

    def follow(self, stop: threading.Event) -> bool:
        """Apply the log as it grows until the leader is silent for a lease (True) or
        ``stop`` is set (False)."""
        lease_s = self.config.lease_ms / 1000
        while not stop.is_set():
            self.poll()
            if time.monotonic() - self._heard >= lease_s:
                return True
        return False

    def take_over(self) -> Any:
        """Fence the old leader and read to the end of the log; returns the producer
        the new leader writes with (its :class:`LeaderLog`'s). Raises LeadLost if
        another standby fenced this one meanwhile."""
        ck = kafka()
        producer = ck.Producer(self.config.settings(**{
            "transactional.id": self.config.transactional_id,
            "transaction.timeout.ms": max(self.config.lease_ms * 4, 10_000),
            "message.max.bytes": MAX_MESSAGE_BYTES,
            "logger": log,
        }))
        try:
            producer.init_transactions(30)
        except ck.KafkaException as exc:
            raise lead_lost(exc) from None
        self.catch_up()
        return producer

    def catch_up(self, timeout_s: float = 30.0) -> None:
        """Read every committed message there is now (after a fencing, the old
        leader's open transaction is aborted, so the end is known)."""
        _low, high = self._consumer.get_watermark_offsets(self._partition, timeout=timeout_s)
        deadline = time.monotonic() + timeout_s
        while self._position() < high:
            if time.monotonic() > deadline:
                raise LeadLost(f"could not read the step log {self.config.url} to its end "
                               f"(offset {high}) in {timeout_s} s")
            self.poll()

    def _position(self) -> int:
        (found,) = self._consumer.position([self._partition])
        return int(found.offset) if found.offset >= 0 else 0

    def poll(self) -> None:
        msg = self._consumer.poll(POLL_S)
        if msg is None:
            return
        error = msg.error()
        if error is not None:
            if error.code() != kafka().KafkaError._PARTITION_EOF:
                log.warning("step log read failed", extra={"log": self.config.url,
                                                           "error": str(error)})
            return
        self._heard = time.monotonic()
        self.apply(bytes(msg.value() or b""), msg.offset())

    def apply(self, value: bytes, offset: int) -> None:
        kind, body = value[:1], value[1:]
        if kind == GRAPH and self.engine is None:
            self.engine = self._build(graph_of(json.loads(body)))
        elif kind == EPOCH:
            self.epoch = max(self.epoch, int(body))
        elif kind == STEPS and self.engine is not None:
            self._apply_records(body, offset)
        elif kind == STEPS:
            raise StepLogDamaged(f"{self.config.url}: steps at offset {offset} before the "
                                 "graph (its first messages are missing)")
        elif kind != BEAT:
            raise StepLogDamaged(f"{self.config.url}: message at offset {offset} is not a "
                                 "step log message (another program writes this topic?)")

    def _apply_records(self, body: bytes, offset: int) -> None:
        assert self.engine is not None
        read = 0
        for msg, end in read_records(body):
            read = end
            if isinstance(msg, Commit):
                refused = apply_group(self.engine, self._group, msg.now_ms)
                if refused is not None:
                    raise StepLogDamaged(f"{self.config.url} at offset {offset}: {refused}")
                self._group = []
                self.groups += 1
            elif isinstance(msg, Logged):
                self._group.append(msg)
            else:
                raise StepLogDamaged(f"{self.config.url}: unexpected {type(msg).__name__} "
                                     f"record at offset {offset}")
        if read != len(body):
            raise StepLogDamaged(f"{self.config.url}: damaged record in the message at "
                                 f"offset {offset}")

    def close(self) -> None:
        self._consumer.close()


def ensure_topic(config: HaConfig) -> None:
    """The group's topic, one partition (the log's order), kept for ever (the log has
    no snapshots yet), large messages allowed; one that exists is left as it is."""
    ck = kafka()
    admin = ck.admin.AdminClient(config.settings(logger=log))
    topic = ck.admin.NewTopic(config.topic, 1, replication_factor=-1, config={
        "retention.ms": "-1", "retention.bytes": "-1",
        "max.message.bytes": str(MAX_MESSAGE_BYTES)})
    for future in admin.create_topics([topic]).values():
        try:
            future.result(timeout=30)
        except ck.KafkaException as exc:
            if exc.args[0].code() != ck.KafkaError.TOPIC_ALREADY_EXISTS:
                raise LeadLost(f"cannot create the step log topic {config.topic} on "
                               f"{config.bootstrap}: {exc.args[0]}") from None
