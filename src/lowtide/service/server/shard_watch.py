"""A coordinator's connections to its shards: the network side of
:class:`~lowtide.service.engine.coordinator.CoordinatorEngine`, which stays plain.

Each shard gets a :class:`~lowtide.service.client.connection.ServerConnection` with a
standing ``WatchShard``: the shard answers with a report covering every flush not yet
known complete, then sends one after each step that changes something, and again on
every new connection. Reports and status documents reach the engine through the state
task (``post``), never from here; the engine's releases go to every shard.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from typing import Any

from lowtide.service.auth import nonce
from lowtide.service.client.connection import ConnectionConfig, Reply, ServerConnection
from lowtide.service.engine.coordinator import CoordinatorEngine
from lowtide.wire.messages import (
    WIRE_VERSION,
    Hello,
    Message,
    Role,
    ShardReleaseFrame,
    ShardReportFrame,
    Status,
    StatusRequest,
    WatchShard,
    graph_spec,
)

Post = Callable[[Callable[[], None]], None]
"""Runs a function in the server's state task (the only place engine state changes)."""

STATUS_EVERY_MS = 1_000
_WATCH_REQ = 1


class ShardWatch:
    def __init__(self, engine: CoordinatorEngine, config: ConnectionConfig, post: Post) -> None:
        self._engine = engine
        self._post = post
        self._next_status_ms = 0
        self._reqs = iter(range(_WATCH_REQ + 1, 1 << 62))
        self._shards = [
            ServerConnection(url, self._hello(k), config, lambda _w: None, self._pusher(k))
            for k, url in enumerate(engine.shards)
        ]
        for shard in self._shards:
            shard.start()
            shard.submit_standing(_WATCH_REQ, WatchShard(_WATCH_REQ))

    def _hello(self, shard: int) -> Callable[[], Hello]:
        """Shard ``shard``'s Hello: its graph, grid and place, which the shard checks and
        its Welcome must echo (a shard's port taken over by another server is refused)."""
        engine = self._engine
        name, graph = f"coordinator-{os.getpid()}", graph_spec(engine.graph)
        grid = (engine.config.grid.delta_ms, engine.config.grid.window_slots)
        where = (shard, len(engine.shards))
        return lambda: Hello(WIRE_VERSION, Role.COORDINATOR, nonce(), name, graph, grid, where)

    def _pusher(self, shard: int) -> Callable[[Message], None]:
        def push(msg: Message) -> None:
            if isinstance(msg, ShardReportFrame) and msg.report.shard == shard:
                report = msg.report
                self._post(lambda: self._engine.receive(report))

        return push

    def move(self, shard: int, url: str) -> None:
        """Shard ``shard`` restarted at ``url`` (in the state task): watch it there,
        and tell agents (the engine's Welcome)."""
        self._engine.move(shard, url)
        self._shards[shard].url = url

    def release(self, frame: ShardReleaseFrame) -> None:
        for shard in self._shards:
            shard.post(frame)

    def tick(self, now_ms: int) -> None:
        """Ask every shard for its status now and then (the coordinator's sums it)."""
        if now_ms < self._next_status_ms:
            return
        self._next_status_ms = now_ms + STATUS_EVERY_MS
        for k, shard in enumerate(self._shards):
            self._ask_status(k, shard)

    def _ask_status(self, k: int, shard: ServerConnection) -> None:
        req = next(self._reqs)
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        shard.submit(req, StatusRequest(req), fut)

        def done(f: asyncio.Future[Reply]) -> None:
            reply = None if f.cancelled() or f.exception() else f.result()
            if isinstance(reply, Status):
                body: dict[str, Any] = json.loads(reply.json)
                self._post(lambda: self._engine.observe_shard(k, body))

        fut.add_done_callback(done)

    def annotate(self, status: dict[str, Any]) -> None:
        """Say in a status document whether each shard is connected."""
        for entry, shard in zip(status.get("shards", ()), self._shards, strict=True):
            entry["connected"] = shard.connected.is_set()

    async def close(self) -> None:
        for shard in self._shards:
            await shard.close()
