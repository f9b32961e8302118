"""The leader's step log in a Kafka topic, written by a transactional producer (rule 18).

It keeps :class:`~lowtide.service.persistence.state_log.StateLog`'s contract, "log
before confirm" (rule 6): each group of requests and its Commit marker go into one
Kafka transaction, and the server confirms them, and announces what their step made,
only once ``commit_transaction`` returned. A standby that took over called
``init_transactions`` with the same transactional id: Kafka then fails this producer's
next commit as fenced, so a deposed leader never confirms again, and it stops serving
(:class:`LeadLost`).

A topic message is one kind byte and its body: ``G`` the graph (JSON, generation 0;
later generations are ChangeGraph records), ``E`` a new leader's epoch, ``B`` a
heartbeat (a leader with nothing to log writes one every quarter lease, so that a
standby sees it alive and a woken leader learns at once that it was fenced), ``S``
write-ahead log records (:func:`lowtide.wire.log.record`). A group larger than
:data:`CHUNK_BYTES` spans several ``S`` messages of one transaction; its Commit
record ends it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from lowtide.core.graph import SegmentGraph
from lowtide.service.engine.base import Logged
from lowtide.service.ha.config import HaConfig
from lowtide.wire.log import record
from lowtide.wire.messages import Commit, graph_spec

log = logging.getLogger("lowtide.service.ha")

GRAPH, EPOCH, BEAT, STEPS = b"G", b"E", b"B", b"S"
CHUNK_BYTES = 512 * 1024
#: a topic message may be this large (one batch of acks is one record)
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class LeadLost(Exception):
    """This tracker may no longer confirm anything: another one took over (fenced)
    or its log is unreachable. The message is one line."""


def kafka() -> Any:
    """confluent_kafka, or a one-line error naming the extra to install."""
    try:
        import confluent_kafka
        import confluent_kafka.admin
    except ImportError:
        raise ValueError("--ha needs confluent-kafka: pip install 'lowtide[kafka]'") from None
    return confluent_kafka


class LeaderLog:
    """What the leader logs: :meth:`append` and :meth:`commit` as the state dir's log
    does, :meth:`beat` on the server's ticks. ``producer``: one whose
    ``init_transactions`` returned (the takeover's)."""

    def __init__(self, config: HaConfig, producer: Any, epoch: int, now_ms: int) -> None:
        self.config = config
        self.epoch = epoch
        self._producer = producer
        self._pending: list[bytes] = []
        self._written_ms = now_ms
        self._transact([EPOCH + str(epoch).encode()], now_ms)

    def log_graph(self, graph: SegmentGraph, now_ms: int) -> None:
        """Generation 0, once, before any group that uses it."""
        self._transact([GRAPH + json.dumps(graph_spec(graph)).encode()], now_ms)

    def append(self, msg: Logged) -> None:
        self._pending.append(record(msg))

    def mark(self, now_ms: int) -> None:
        """A Commit marker even without requests (a step that retired a dead front)."""
        self.commit(now_ms, force=True)

    def commit(self, now_ms: int, force: bool = False) -> bool:
        """Write the pending group and its Commit marker in one transaction; False if
        there was none. Raises :class:`LeadLost` when it cannot: nothing of the group
        is then confirmed, by this tracker or any other."""
        if not self._pending and not force:
            return False
        self._pending.append(record(Commit(now_ms)))
        chunks: list[list[bytes]] = []
        size = CHUNK_BYTES
        for rec in self._pending:
            if size + len(rec) > CHUNK_BYTES:
                chunks.append([STEPS])
                size = 0
            chunks[-1].append(rec)
            size += len(rec)
        self._pending = []
        self._transact([b"".join(chunk) for chunk in chunks], now_ms)
        return True

    def beat(self, now_ms: int) -> None:
        if now_ms - self._written_ms >= self.config.beat_ms:
            self._transact([BEAT], now_ms)

    def _transact(self, values: list[bytes], now_ms: int) -> None:
        errors = kafka().KafkaException
        timeout_s = 2 * self.config.lease_ms / 1000
        try:
            self._producer.begin_transaction()
            for value in values:
                self._producer.produce(self.config.topic, value, partition=0)
            self._producer.commit_transaction(timeout_s)
        except errors as exc:
            raise lead_lost(exc) from None
        except BufferError as exc:  # the producer's queue is full: the broker is away
            raise LeadLost(f"the step log {self.config.url} is not taking writes ({exc})") from None
        self._written_ms = now_ms

    def close(self) -> None:
        # a transaction left open is aborted by the next leader's init_transactions
        self._producer = None


def lead_lost(exc: Exception) -> LeadLost:
    error = exc.args[0] if exc.args else None
    name = error.name() if error is not None and hasattr(error, "name") else ""
    fenced = name in ("_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH")
    why = ("another tracker of this group took over (fenced)" if fenced
           else f"the step log is unreachable ({error})")
    return LeadLost(why)
