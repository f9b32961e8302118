"""The engine of a tracker that is not sharded: one core tracker for the whole
pipeline."""

from __future__ import annotations

from typing import Any

import numpy as np

from lowtide.core.messages import MinTimeUpdate
from lowtide.service.engine.base import Engine, EngineConfig, StateRequest, StepResult
from lowtide.service.engine.generations import change_graph
from lowtide.service.engine.tracker_state import (
    apply_front_op,
    export_tracker,
    flush_session,
    import_tracker,
    tracker_status,
)
from lowtide.service.errors import ServiceError
from lowtide.wire.messages import (
    BatchState,
    ChangeGraph,
    ErrorCode,
    FrontOp,
    Ok,
    QueryBatch,
    graph_spec,
)


class CentralEngine(Engine):
    """One tracker for the whole pipeline."""

    steps_hold_confirmed = True

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.tracker = config.tracker_config().build()

    def _apply(self, msg: StateRequest) -> None:
        if isinstance(msg, ChangeGraph):
            self.generations.append(change_graph(self.tracker, msg))
            self.adopt_graph(self.tracker.graph)
            return
        if isinstance(msg, FrontOp):
            apply_front_op(self.tracker, msg, self.now_ms)
            return
        if msg.node_time is not None:
            raise ServiceError(
                ErrorCode.BAD_REQUEST, "node times go to shards, not a central tracker"
            )
        self.tracker.apply_flush(msg.acks, msg.heartbeats, flush_session(msg), self.now_ms)

    def step(self, now_ms: int) -> StepResult:
        step = self.tracker.step(now_ms)
        self.front_events.retire(step.retired, self.graph)
        self.front_events.dead(step.dead, self.graph)
        return StepResult(step.updates, step.stuck, dead=step.dead)

    def report_batch(self, msg: QueryBatch, now_ms: int) -> Ok:
        batches = self.tracker.batches
        if msg.state == BatchState.OPEN:
            batches.open(msg.query, msg.batch, msg.segments, now_ms)
        elif msg.state == BatchState.CLOSED:
            batches.close(msg.query, msg.batch, now_ms, msg.segments)
        else:
            batches.stopped(msg.query)
        return Ok(msg.req)

    def current(self, segment: str | None) -> MinTimeUpdate:
        return MinTimeUpdate(segment, self.tracker.min_time(segment))

    def status(self) -> dict[str, Any]:
        return {**tracker_status(self.tracker, self.graph),
                # what a client changing the graph changes (rule 16)
                "generation": self.tracker.generation, "graph": graph_spec(self.graph),
                "generations": self.generations}

    def export(self) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
        meta, arrays = export_tracker(self.tracker.snapshot())
        doc = {"tracker": meta, "dedup": self.dedup.export(),
               "front_events": self.front_events.export(), "generations": self.generations}
        return doc, arrays

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray[Any, Any]]) -> None:
        self.tracker.restore(import_tracker(meta["tracker"], arrays))
        self.adopt_graph(self.tracker.graph)  # a later generation's (rule 16)
        self.generations = list(meta.get("generations", ()))
        self.dedup.load(meta["dedup"])
        self.front_events.load(meta.get("front_events"))
