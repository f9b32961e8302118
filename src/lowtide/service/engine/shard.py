"""A tracker shard's engine (rule 8): the core TrackerShard, plus what a network and a
crash add to it.

Agents send each shard its part of every flush, with the flush's node time. The shard
reports to the coordinator after each step that changes something. It also keeps the
flushes it applied that the coordinator has not yet seen applied by *every* shard
("retained"): a coordinator that (re)connects gets them all in its first report, so
its in-transit cap never misses a flush, whoever restarted.

A flush that carries acks must prove its node time: one without, or whose min time
lies above its own acks, is refused (:class:`Unproven`), and since its items may be
in flight all the same (another shard may have applied the rest of that flush), the
shard's reported min times stay below the refused acks from then on (fail closed:
only a restart from a state dir without that refusal, or a fresh one, lifts it).

Nodes are agent sessions and keyed-batch streams (see
:func:`lowtide.service.client.batches.stream_time`); their vector entries are kept for good, so
that a node's absence from a vector always means "nothing applied here yet".
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from lowtide.core.messages import (
    AckBatch,
    MinTimeUpdate,
    NodeTime,
    ShardFlush,
    ShardReport,
)
from lowtide.core.sharding import ShardLayout, TrackerShard
from lowtide.core.time import TIME_LIMIT
from lowtide.service.engine.base import Engine, EngineConfig, StateRequest, StepResult
from lowtide.service.engine.tracker_state import (
    apply_front_op,
    export_tracker,
    flush_session,
    import_tracker,
    tracker_status,
)
from lowtide.service.errors import ServiceError, Unproven
from lowtide.wire.messages import Batch, ChangeGraph, ErrorCode, FrontOp, ShardReleaseFrame


class ShardEngine(Engine):
    def __init__(self, config: EngineConfig, layout: ShardLayout, index: int) -> None:
        super().__init__(config)
        self.index = index
        self.shard = TrackerShard(config.tracker_config(), layout, index)
        self._retained: dict[tuple[int, int], int] = {}

    def _apply(self, msg: StateRequest) -> None:
        if isinstance(msg, FrontOp):
            apply_front_op(self.shard, msg, self.now_ms)
            return
        if isinstance(msg, ChangeGraph):
            raise ServiceError(ErrorCode.BAD_REQUEST, "a sharded tracker's graph cannot "
                               "change while it runs yet (rule 16): restart it with the "
                               "new graph")
        self._prove(msg)
        nt = msg.node_time
        if nt is not None and nt.counter <= self.shard.node_times().get(nt.node, 0):
            # The core would skip it as a resend, but resends never get this far (the
            # dedup layer answers them): this is a keyed batch overtaken by a later one.
            raise ServiceError(
                ErrorCode.BAD_REQUEST,
                f"batch {msg.key} arrives after a later batch of its stream (node {nt.node})",
            )
        flush = ShardFlush(self.index, nt, msg.acks, msg.heartbeats)
        self.shard.receive(flush, flush_session(msg), self.now_ms)
        if nt is not None:
            self._retained[(nt.node, nt.counter)] = nt.min_time

    def identity(self) -> dict[str, Any]:
        return {**super().identity(), "shard": [self.index, self.shard.layout.n_shards]}

    def _prove(self, msg: Batch) -> None:
        """Rule 8: acks travel with a node time whose min time is at or below them."""
        if len(msg.acks) == 0:
            return
        low = int(msg.acks.time.min())
        hold = low - low % self.config.grid.window_slots
        nt = msg.node_time
        if nt is None:
            raise Unproven(f"acks without a node time (rule 8); min times stay below {hold}",
                           hold)
        if nt.min_time > low:
            raise Unproven(
                f"node {nt.node} flush {nt.counter} claims min time {nt.min_time} above its "
                f"acks at {low} (rule 8); min times stay below {hold}",
                hold,
            )

    def _held(self, report: ShardReport) -> ShardReport:
        if self.hold >= TIME_LIMIT:
            return report
        return replace(report, min_times=tuple(min(t, self.hold) for t in report.min_times))

    def step(self, now_ms: int) -> StepResult:
        report = self.shard.step(now_ms)
        return StepResult(report=None if report is None else self._held(report))

    def release(self, msg: ShardReleaseFrame) -> None:
        self.shard.release(msg.release)
        reached = dict(msg.complete)
        for key in [k for k in self._retained if k[1] <= reached.get(k[0], 0)]:
            del self._retained[key]

    def watch(self) -> ShardReport:
        return self._held(
            ShardReport(
                self.index,
                self.shard.min_times(),
                tuple(sorted(self.shard.node_times().items())),
                tuple((n, c, t) for (n, c), t in sorted(self._retained.items())),
            )
        )

    def current(self, segment: str | None) -> MinTimeUpdate:
        raise ServiceError(ErrorCode.BAD_REQUEST, "subscribe at the coordinator, not at a shard")

    def status(self) -> dict[str, Any]:
        body = tracker_status(self.shard.tracker, self.graph)
        body.update(
            shard=self.index, nodes=len(self.shard.node_times()), retained=len(self._retained)
        )
        return body

    def export(self) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
        meta, arrays = export_tracker(self.shard.tracker.snapshot())
        extra = {
            "node_times": sorted(self.shard.node_times().items()),
            "retained": [[n, c, t] for (n, c), t in sorted(self._retained.items())],
            "hold": self.hold,
            "front_events": self.front_events.export(),
        }
        return {"tracker": meta, "dedup": self.dedup.export(), **extra}, arrays

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray[Any, Any]]) -> None:
        self.shard.tracker.restore(import_tracker(meta["tracker"], arrays))
        self.dedup.load(meta["dedup"])
        self._retained = {(int(n), int(c)): int(t) for n, c, t in meta["retained"]}
        self.hold = int(meta["hold"])
        self.front_events.load(meta.get("front_events"))
        # The core has no setter for node times: an empty flush per node sets them.
        # It is also reported, harmlessly: complete flushes drop out of the cap at once.
        for node, counter in meta["node_times"]:
            min_time = self._retained.get((node, counter), TIME_LIMIT - 1)
            nt = NodeTime(int(node), int(counter), min_time)
            self.shard.receive(ShardFlush(self.index, nt, AckBatch.empty()))
