"""The coordinator of a sharded deployment: what agents and subscribers talk to.

It tells agents where the shards are (in its Welcome), watches every shard over a
lane, feeds their reports to the core ShardAggregator, serves subscriptions with the
aggregated, guarded min times, and sends ShardReleases back so shards can drop old
windows and the flushes every shard has applied.

It keeps no state of its own worth logging: after a restart the shards' first
reports (which carry every flush not yet known complete) rebuild the aggregate, and
min times resume from where the shards are.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from lowtide.core.messages import MinTimeUpdate, ShardReport
from lowtide.core.sharding import ShardAggregator
from lowtide.service.auth import nonce
from lowtide.service.client.connection import ConnectionConfig, Reply, ServerConnection
from lowtide.service.engine.base import Engine, EngineConfig, StateRequest, StepResult
from lowtide.service.errors import ServiceError
from lowtide.wire.messages import (
    WIRE_VERSION,
    ErrorCode,
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
RELEASE_EVERY_MS = 5
_WATCH_REQ = 1


class CoordinatorEngine(Engine):
    def __init__(
        self, config: EngineConfig, shard_urls: tuple[str, ...], lane: ConnectionConfig, post: Post
    ) -> None:
        super().__init__(config)
        self.shards = shard_urls
        self.aggregator = ShardAggregator(config.graph, len(shard_urls))
        self._post = post
        self._updates: list[MinTimeUpdate] = []
        self._vectors: list[dict[int, int]] = [{} for _ in shard_urls]
        self._sent_mins: tuple[int, ...] | None = None
        self._sent_reached: dict[int, int] = {}
        self._shard_status: list[dict[str, Any] | None] = [None] * len(shard_urls)
        self._next_status_ms = 0
        self._next_release_ms = 0
        self._reqs = iter(range(_WATCH_REQ + 1, 1 << 62))
        self._lanes = [
            ServerConnection(url, self._hello(k), lane, lambda _w: None, self._pusher(k))
            for k, url in enumerate(shard_urls)
        ]
        for shard_lane in self._lanes:
            shard_lane.start()
            shard_lane.submit_standing(_WATCH_REQ, WatchShard(_WATCH_REQ))

    def _hello(self, shard: int) -> Callable[[], Hello]:
        """Shard ``shard``'s Hello: its graph, grid and place, which the shard checks and
        its Welcome must echo (a shard's port taken over by another server is refused)."""
        name, graph = f"coordinator-{os.getpid()}", graph_spec(self.graph)
        grid = (self.config.grid.delta_ms, self.config.grid.window_slots)
        where = (shard, len(self.shards))
        return lambda: Hello(WIRE_VERSION, Role.COORDINATOR, nonce(), name, graph, grid, where)

    def _pusher(self, shard: int) -> Callable[[Message], None]:
        def push(msg: Message) -> None:
            if isinstance(msg, ShardReportFrame) and msg.report.shard == shard:
                report = msg.report
                self._post(lambda: self.receive(report))

        return push

    def move(self, shard: int, url: str) -> None:
        """Shard ``shard`` restarted at ``url``: watch it there, and tell agents (in the
        Welcome they get when they reconnect)."""
        self.shards = (*self.shards[:shard], url, *self.shards[shard + 1 :])
        self._lanes[shard].url = url

    async def aclose(self) -> None:
        for lane in self._lanes:
            await lane.close()

    # ------------------------------------------------------------ state task
    def receive(self, report: ShardReport) -> None:
        self._vectors[report.shard] = dict(report.node_times)
        self._updates.extend(self.aggregator.receive(report))

    def _apply(self, msg: StateRequest) -> None:
        raise ServiceError(ErrorCode.BAD_REQUEST, "acks and fronts go to the shards")

    def step(self, now_ms: int) -> StepResult:
        updates, self._updates = tuple(self._updates), []
        if updates and now_ms >= self._next_release_ms:
            # Promptly: until released, a shard keeps completed windows and rescans
            # them on every step, which costs it more than the acks themselves.
            self._next_release_ms = now_ms + RELEASE_EVERY_MS
            self._send_release()
        return StepResult(updates)

    def current(self, segment: str | None) -> MinTimeUpdate:
        if segment is None:
            return MinTimeUpdate(None, self.aggregator.min_time())
        return MinTimeUpdate(segment, self.aggregator.min_times()[self.graph.index(segment)])

    def tick(self, now_ms: int) -> None:
        super().tick(now_ms)
        self._send_release()
        if now_ms >= self._next_status_ms:
            self._next_status_ms = now_ms + STATUS_EVERY_MS
            for k, lane in enumerate(self._lanes):
                self._ask_status(k, lane)

    def _send_release(self) -> None:
        """Announced min times, and per node the counter every shard has reached,
        when either moved since the last release."""
        reached: dict[int, int] = {}
        for node in set().union(*self._vectors):
            low = min(v.get(node, 0) for v in self._vectors)
            if low > self._sent_reached.get(node, 0):
                reached[node] = low
        mins = self.aggregator.min_times()
        if not reached and mins == self._sent_mins:
            return
        frame = ShardReleaseFrame(self.aggregator.release(), tuple(sorted(reached.items())))
        for lane in self._lanes:
            lane.post(frame)
        self._sent_mins = mins
        self._sent_reached.update(reached)

    def _ask_status(self, shard: int, lane: ServerConnection) -> None:
        req = next(self._reqs)
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        lane.submit(req, StatusRequest(req), fut)

        def done(f: asyncio.Future[Reply]) -> None:
            reply = None if f.cancelled() or f.exception() else f.result()
            if isinstance(reply, Status):
                self._post(lambda: self._shard_status.__setitem__(shard, _parse(reply)))

        fut.add_done_callback(done)

    def status(self) -> dict[str, Any]:
        mins = self.aggregator.min_times()
        known = [s for s in self._shard_status if s is not None]
        segments = []
        for s, name in enumerate(self.graph.names):
            parts = [k["segments"][s] for k in known]
            segments.append(
                {
                    "segment": name,
                    "min_time": mins[s],
                    "bound": min((p["bound"] for p in parts), default=mins[s]),
                    "open_windows": sum(p["open_windows"] for p in parts),
                    "in_flight": sum(p["in_flight"] for p in parts),
                    "stuck_windows": sum(p.get("stuck_windows", 0) for p in parts),
                    "received": sum(p.get("received", 0) for p in parts),
                    "sent": sum(p.get("sent", 0) for p in parts),
                }
            )
        return {
            "global_min": self.aggregator.min_time(),
            "acks_applied": sum(k.get("acks_applied", 0) for k in known),
            "dedup_hits": sum(k.get("dedup_hits", 0) for k in known),
            "dedup_keys": sum(k.get("dedup_keys", 0) for k in known),
            "segments": segments,
            "fronts": known[0]["fronts"] if known else {},
            # every shard sees every front operation: shard 0 speaks for them
            "fronts_declared": known[0].get("fronts_declared", {}) if known else {},
            "front_events": known[0].get("front_events", {}) if known else {},
            "stuck": sorted({w for k in known for w in k["stuck"]}),
            "stuck_detail": sorted(
                (d for k in known for d in k.get("stuck_detail", [])),
                key=lambda d: (d["window_start"], d["segment"]),
            ),
            "shards": [
                {"url": url, "connected": lane.connected.is_set(), "status": st}
                for url, lane, st in zip(self.shards, self._lanes, self._shard_status, strict=True)
            ],
        }

    def export(self) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
        return {}, {}

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray[Any, Any]]) -> None:
        return None


def _parse(reply: Status) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(reply.json)
    return body
