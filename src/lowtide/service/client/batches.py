"""Keyed ack batches (rule 6): what a Spark task's batch is known by, its node time in
a sharded deployment (rule 8), and a batch on its way to the tracker."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from lowtide.core.messages import NodeTime

T_co = TypeVar("T_co", covariant=True)
T = TypeVar("T")


@dataclass(frozen=True)
class BatchKey:
    """Rule 6: what a Spark task's ack batch is known by. No attempt number: every
    attempt of a task sends the same acks under the same key."""

    query: str
    batch_id: int
    segment: str
    partition: int

    def text(self) -> str:
        return json.dumps([self.query, self.batch_id, self.segment, self.partition])


def stream_time(key: BatchKey, min_time: int) -> NodeTime:
    """The node time of a keyed batch in a sharded deployment (rule 8).

    Each (query, segment, partition) is a node of its own whose counter is the batch
    id + 1: every attempt of a batch, from any process, then carries the same node
    time, so a batch that one attempt got to some shards and a retry to the others
    completes, and the node count stays that of the streams. It needs batch ids of a
    stream to arrive in increasing order, as Spark's micro-batches do; a shard refuses
    one that comes after a later one."""
    stream = json.dumps([key.query, key.segment, key.partition]).encode()
    node = int.from_bytes(hashlib.blake2b(stream, digest_size=8).digest(), "little") >> 1
    return NodeTime(node, key.batch_id + 1, min_time)


class Outcome(Protocol[T_co]):
    """A call under way (a ``concurrent.futures.Future``, or a caller-driven task)."""

    def result(self) -> T_co: ...


class Pending(Generic[T]):
    """A request on its way to the tracker, sent: :meth:`wait` blocks for its reply."""

    def __init__(self, fut: Outcome[T], result: Callable[[Outcome[T]], T]) -> None:
        self._fut = fut
        self._result = result

    def wait(self) -> T:
        """Block until the tracker answered; raises as the blocking call does."""
        return self._result(self._fut)


class PendingBatch(Pending[bool]):
    """A keyed batch on its way to the tracker (:meth:`Agent.submit_batch`): ``wait()``
    is True if the tracker applied it now, False if it had been applied before."""
