"""The tracker server's status document: what `lowtide status`, the web view and the
metrics read, built from the engine and the server's parts in one place."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from lowtide.core.time import Clock
from lowtide.service.engine.base import Engine
from lowtide.service.ha.role import TrackerRole
from lowtide.service.server.freshness import SlaWatch
from lowtide.service.server.shard_watch import ShardWatch

if TYPE_CHECKING:
    from lowtide.service.server.config import ServerConfig


def status_document(
    config: ServerConfig,
    url: str,
    connections: int,
    clock: Clock,
    engine: Engine | None,
    *,
    role: TrackerRole | None,
    shard_watch: ShardWatch | None,
    freshness: SlaWatch | None,
) -> dict[str, object]:
    body: dict[str, object] = {
        "server": config.name,
        "url": url,
        "pid": os.getpid(),
        "connections": connections,
    }
    if role is not None:
        body["ha"] = role.document()
    if engine is None:
        return body
    body["acks_applied"] = engine.acks_applied
    body["dedup_keys"] = len(engine.dedup)
    body["dedup_hits"] = engine.dedup.hits
    body.update(engine.status_document())
    if shard_watch is not None:
        shard_watch.annotate(body)
    body["delta_ms"] = config.grid.delta_ms
    body["window_slots"] = config.grid.window_slots
    body["now_ms"] = clock.now_ms()
    if freshness is not None:
        body["freshness"] = freshness.document(body, engine.graph)
    return body
