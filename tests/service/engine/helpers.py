"""What the engine tests share: a two-segment graph, acks, and a session that numbers
its requests as an agent does (the engines see only these plain messages)."""

from __future__ import annotations

import itertools

from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import Ack, AckBatch, Heartbeat, NodeTime, ShardFlush
from lowtide.core.time import TimeGrid
from lowtide.service.engine.base import EngineConfig
from lowtide.wire.messages import Batch, FrontAction, FrontOp

GRAPH = SegmentGraph.of(("src", ()), ("sink", ("src",)))
SRC, SINK = 0, 1
CONFIG = EngineConfig(GRAPH, TimeGrid(delta_ms=10, window_slots=1))


def send(segment: int, time: int, value: int) -> Ack:
    return Ack(segment, time, value, +1)


def recv(segment: int, time: int, value: int) -> Ack:
    return Ack(segment, time, value, -1)


class Session:
    """One agent's life as an engine sees it: its session id (also the owner of the
    fronts it registers) and request numbers that grow with every request."""

    def __init__(self, session: int) -> None:
        self.session = session
        self._reqs = itertools.count(1)

    def register(self, front: int, segment: str, time: int) -> FrontOp:
        return FrontOp(next(self._reqs), self.session, FrontAction.REGISTER, front, segment,
                       time, self.session)

    def declare(self, front: int, segment: str, time: int, retire_after_ms: int) -> FrontOp:
        return FrontOp(next(self._reqs), self.session, FrontAction.DECLARE, front, segment,
                       time, self.session, retire_after_ms)

    def beat(self, front: int, time: int) -> Heartbeat:
        return Heartbeat(front, time, self.session)

    def flush(self, *acks: Ack, heartbeats: tuple[Heartbeat, ...] = (),
              node_time: NodeTime | None = None) -> Batch:
        """A local tracker's flush: fire and forget, no key."""
        return self.keyed("", *acks, heartbeats=heartbeats, node_time=node_time)

    def part(self, part: ShardFlush) -> Batch:
        """A shard's part of a flush the agent's router split (rule 8)."""
        return Batch(next(self._reqs), self.session, "", part.acks, part.heartbeats,
                     part.node_time)

    def keyed(self, key: str, *acks: Ack, heartbeats: tuple[Heartbeat, ...] = (),
              node_time: NodeTime | None = None) -> Batch:
        """A Spark task's batch under its rule-6 key."""
        return Batch(next(self._reqs), self.session, key, AckBatch.of(list(acks)), heartbeats,
                     node_time)
