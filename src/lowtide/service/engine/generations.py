"""A graph change request applied to a central tracker (rule 16), and what the status
says of it."""

from __future__ import annotations

from typing import Any

from lowtide.core.errors import GraphError, ProtocolError
from lowtide.core.generations import GraphChange, next_graph
from lowtide.core.tracker import Tracker
from lowtide.service.errors import ServiceError
from lowtide.wire.messages import ChangeGraph, ErrorCode, segment_of


def change_of(msg: ChangeGraph) -> GraphChange:
    return GraphChange(msg.generation, tuple(segment_of(e) for e in msg.attach),
                       msg.detach, msg.replace, None if msg.start < 0 else msg.start)


def change_graph(tracker: Tracker, msg: ChangeGraph) -> dict[str, Any]:
    """Apply ``msg`` to ``tracker``, all or nothing; refused (ProtocolError,
    ServiceError) if it does not make the graph its sender expects. Returns the
    status entry of the new generation."""
    change = change_of(msg)
    if msg.fingerprint and change.generation == tracker.generation + 1:
        try:
            made = next_graph(tracker.graph, change).fingerprint()
        except GraphError as err:
            raise ProtocolError(str(err)) from None
        if made != msg.fingerprint:
            raise ServiceError(ErrorCode.GRAPH_MISMATCH,
                               f"graph generation {change.generation} would be {made}, the "
                               f"sender expects {msg.fingerprint}: it changed another graph")
    gone = tracker.change_graph(change)
    return {"generation": tracker.generation, "fingerprint": tracker.graph.fingerprint(),
            "attached": [spec.name for spec in change.attach],
            "detached": [d.describe() for d in gone], "replaced": list(change.replace),
            "start": tracker.min_time(change.attach[0].name) if change.attach else None}
