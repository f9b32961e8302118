"""Prometheus metrics of one server, in a registry of its own (several servers may
share a process, e.g. in tests or an embedded driver).

Gauges are refreshed by the state task on each tick, so a scrape never touches the
tracker state itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from lowtide.core.messages import MinTimeUpdate
from lowtide.core.time import TimeGrid

GLOBAL = "_global"


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["segment"]
        self.min_time = Gauge("lowtide_min_time_slots", "announced min time", labels, registry=r)
        self.lag = Gauge("lowtide_lag_ms", "wall clock minus min time", labels, registry=r)
        self.open_windows = Gauge(
            "lowtide_open_windows", "windows not yet complete", labels, registry=r
        )
        self.stuck = Gauge("lowtide_stuck_windows", "windows stuck past their bound", registry=r)
        self.acks = Counter("lowtide_acks", "ack entries applied", registry=r)
        self.dedup_hits = Counter(
            "lowtide_dedup_hits", "requests applied before, not again", registry=r
        )
        self.errors = Counter("lowtide_errors", "refused requests", ["code"], registry=r)
        self.refused = Counter("lowtide_refused_peers", "peers refused at handshake", registry=r)
        self.connections = Gauge("lowtide_connections", "open connections", registry=r)
        self.notifications = Counter("lowtide_min_time_updates", "min time updates", registry=r)
        self.rows = Counter(
            "lowtide_rows", "rows acked per segment", ["segment", "direction"], registry=r
        )
        self._totals: dict[tuple[str, ...], int] = {}

    def updates(self, updates: Iterable[MinTimeUpdate], now_ms: int, grid: TimeGrid) -> None:
        for u in updates:
            segment = GLOBAL if u.segment is None else u.segment
            self.min_time.labels(segment).set(u.time)
            self.lag.labels(segment).set(now_ms - grid.slot_start_ms(u.time))
            self.notifications.inc()

    def observe(self, status: dict[str, Any], now_ms: int, grid: TimeGrid) -> None:
        """Refresh from a server status (a coordinator's sums up its shards')."""
        for seg in status["segments"]:
            name = seg["segment"]
            self.open_windows.labels(name).set(seg["open_windows"])
            self.min_time.labels(name).set(seg["min_time"])
            self.lag.labels(name).set(now_ms - grid.slot_start_ms(seg["min_time"]))
            for direction in ("received", "sent"):
                total = int(seg.get(direction, 0))
                self._catch_up(self.rows.labels(name, direction), (name, direction), total)
        self.min_time.labels(GLOBAL).set(status["global_min"])
        self.lag.labels(GLOBAL).set(now_ms - grid.slot_start_ms(status["global_min"]))
        self.stuck.set(len(status["stuck"]))
        self._catch_up(self.acks, ("acks",), int(status.get("acks_applied", 0)))
        self._catch_up(self.dedup_hits, ("dedup_hits",), int(status.get("dedup_hits", 0)))

    def _catch_up(self, counter: Counter, key: tuple[str, ...], total: int) -> None:
        """Counters follow the engine's own totals: one source, whatever the role. A
        total that falls (a shard restarted from zero) is a new base, not a stall."""
        if total < self._totals.get(key, 0):
            self._totals[key] = total
        if total > self._totals.get(key, 0):
            counter.inc(total - self._totals.get(key, 0))
            self._totals[key] = total

    def render(self) -> bytes:
        return generate_latest(self.registry)
