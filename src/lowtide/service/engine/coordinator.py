"""The coordinator of a sharded deployment: what agents and subscribers talk to.

It tells agents where the shards are (in its Welcome), feeds the shards' reports to the
core ShardAggregator, serves subscriptions with the aggregated, guarded min times, and
makes the ShardReleases that let shards drop old windows and the flushes every shard
has applied. A plain engine like the others: its server's
:class:`~lowtide.service.server.shard_watch.ShardWatch` holds the connections to the
shards, hands it their reports and status documents, and sends its releases.

It keeps no state of its own worth logging: after a restart the shards' first
reports (which carry every flush not yet known complete) rebuild the aggregate, and
min times resume from where the shards are.

>>> from lowtide.core.graph import SegmentGraph
>>> from lowtide.core.messages import ShardReport
>>> coordinator = CoordinatorEngine(EngineConfig(SegmentGraph.of(("src", ()))), ("a", "b"))
>>> coordinator.receive(ShardReport(0, (40,), (), ()))
>>> coordinator.step(0).updates  # shard 1 has not reported: nothing is known
()
>>> coordinator.receive(ShardReport(1, (30,), (), ()))
>>> step = coordinator.step(0)
>>> [(u.segment, u.time) for u in step.updates], step.release.release.min_times
([('src', 30), (None, 30)], (30,))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lowtide.core.messages import MinTimeUpdate, ShardReport
from lowtide.core.sharding import ShardAggregator
from lowtide.service.engine.base import Engine, EngineConfig, StateRequest, StepResult
from lowtide.service.errors import ServiceError
from lowtide.wire.messages import ErrorCode, ShardReleaseFrame

RELEASE_EVERY_MS = 5


class CoordinatorEngine(Engine):
    def __init__(self, config: EngineConfig, shard_urls: tuple[str, ...]) -> None:
        super().__init__(config)
        self.shards = shard_urls
        self.aggregator = ShardAggregator(config.graph, len(shard_urls))
        self._updates: list[MinTimeUpdate] = []
        self._vectors: list[dict[int, int]] = [{} for _ in shard_urls]
        self._sent_mins: tuple[int, ...] | None = None
        self._sent_reached: dict[int, int] = {}
        self._shard_status: list[dict[str, Any] | None] = [None] * len(shard_urls)
        self._next_release_ms = 0

    def move(self, shard: int, url: str) -> None:
        """Shard ``shard`` restarted at ``url``: agents learn it in the Welcome they get
        when they reconnect."""
        self.shards = (*self.shards[:shard], url, *self.shards[shard + 1 :])

    def receive(self, report: ShardReport) -> None:
        self._vectors[report.shard] = dict(report.node_times)
        self._updates.extend(self.aggregator.receive(report))

    def observe_shard(self, shard: int, status: dict[str, Any]) -> None:
        """Shard ``shard``'s status document, for :meth:`status` to sum up."""
        self._shard_status[shard] = status

    def _apply(self, msg: StateRequest) -> None:
        raise ServiceError(ErrorCode.BAD_REQUEST, "acks and fronts go to the shards")

    def step(self, now_ms: int) -> StepResult:
        updates, self._updates = tuple(self._updates), []
        release = None
        if updates and now_ms >= self._next_release_ms:
            # Promptly: until released, a shard keeps completed windows and rescans
            # them on every step, which costs it more than the acks themselves.
            self._next_release_ms = now_ms + RELEASE_EVERY_MS
            release = self._release()
        return StepResult(updates, release=release)

    def current(self, segment: str | None) -> MinTimeUpdate:
        """The global min time, a segment's or a key range's (``"<segment>#<r>"``)."""
        return MinTimeUpdate(segment, self.aggregator.min_time(segment))

    def tick(self, now_ms: int) -> StepResult:
        return StepResult(release=self._release())

    def _release(self) -> ShardReleaseFrame | None:
        """Announced min times, and per node the counter every shard has reached,
        when either moved since the last release (else None)."""
        reached: dict[int, int] = {}
        for node in set().union(*self._vectors):
            low = min(v.get(node, 0) for v in self._vectors)
            if low > self._sent_reached.get(node, 0):
                reached[node] = low
        release = self.aggregator.release()  # every row's: a key range may move alone
        if not reached and release.min_times == self._sent_mins:
            return None
        frame = ShardReleaseFrame(release, tuple(sorted(reached.items())))
        self._sent_mins = release.min_times
        self._sent_reached.update(reached)
        return frame

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
                    # each key range's combined min time (rule 15): the segment's is
                    # their minimum; a shard's own are claims about its windows only
                    "key_ranges": list(self.aggregator.range_min_times(name)),
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
            # ShardWatch adds whether each is connected
            "shards": [
                {"url": url, "status": st}
                for url, st in zip(self.shards, self._shard_status, strict=True)
            ],
        }

    def export(self) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
        return {}, {}

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray[Any, Any]]) -> None:
        return None

