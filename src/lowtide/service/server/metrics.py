"""Prometheus metrics of one server, in a registry of its own (several servers may
share a process, e.g. in tests or an embedded driver).

Names follow Prometheus' conventions: base units (``_seconds``, a min time as a
``_timestamp_seconds``), ``_total`` counters, a help text each, and a ``pipeline``
label on every series (one server tracks one pipeline; a dashboard over several
servers tells them apart by it) plus ``segment`` where a value is per segment. The
global min time is the segment ``_global``.

Gauges are refreshed by the state task on each tick, so a scrape never touches the
tracker state itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from lowtide import __version__
from lowtide.core.messages import MinTimeUpdate
from lowtide.core.time import TimeGrid
from lowtide.service.net import HttpReply, HttpRequest
from lowtide.service.progress import late_records

GLOBAL = "_global"
MS_PER_S = 1000.0


class ServerMetrics:
    def __init__(self, pipeline: str = "default") -> None:
        self.registry = CollectorRegistry()
        self.pipeline = pipeline
        seg = ["pipeline", "segment"]
        self.min_time = self._gauge(
            "lowtide_min_time_timestamp_seconds",
            "start of the announced min time (Unix time): nothing older is in flight",
            seg,
        )
        self.lag = self._gauge(
            "lowtide_lag_seconds", "wall clock minus the start of the min time", seg
        )
        self.open_windows = self._gauge(
            "lowtide_open_windows", "tracking windows not yet complete", seg
        )
        self.stuck = self._gauge(
            "lowtide_stuck_windows", "windows incomplete past their bound (items lost)", seg
        )
        self.rows = self._counter(
            "lowtide_rows", "rows acked: received out of / sent into a segment",
            [*seg, "direction"],
        )
        one = ["pipeline"]
        self.acks = self._counter("lowtide_acks", "ack entries applied", one).labels(pipeline)
        self.dedup_hits = self._counter(
            "lowtide_dedup_hits", "keyed batches applied before, not again", one
        ).labels(pipeline)
        self.errors = self._counter("lowtide_errors", "refused requests", [*one, "code"])
        self.refused = self._counter(
            "lowtide_refused_peers", "peers refused at the handshake", one
        ).labels(pipeline)
        self.connections = self._gauge(
            "lowtide_connections", "open client connections", one
        ).labels(pipeline)
        self.notifications = self._counter(
            "lowtide_min_time_updates", "min time updates announced", one
        ).labels(pipeline)
        self.fronts_refused = self._counter(
            "lowtide_fronts_refused",
            "fronts refused for registering behind their segment (started late, undeclared)",
            one,
        ).labels(pipeline)
        self.fronts_retired = self._counter(
            "lowtide_fronts_retired", "declared fronts retired by their deadline", one
        ).labels(pipeline)
        self.fronts_waiting = self._gauge(
            "lowtide_fronts_waiting", "declared fronts not yet registered (they hold their "
            "segment)", one
        ).labels(pipeline)
        self.fronts_dead = self._gauge(
            "lowtide_fronts_dead", "live fronts silent past the front timeout, waited for "
            "(dead_fronts=wait)", one
        ).labels(pipeline)
        self.fronts_dead_retired = self._counter(
            "lowtide_fronts_dead_retired", "live fronts retired as dead "
            "(dead_fronts=retire)", one
        ).labels(pipeline)
        self.windows_waiting = self._gauge(
            "lowtide_waiting_windows", "windows past their bound that a running batch may "
            "still deliver (not losses)", one
        ).labels(pipeline)
        self.windows_late = self._counter(
            "lowtide_windows_late", "sink windows later than the SLA (lowtide serve "
            "--sla-s), each counted once", one
        ).labels(pipeline)
        self.sla_late = self._gauge(
            "lowtide_sla_late_seconds", "how far the oldest open sink window is past its "
            "SLA (<= 0: on time)", one
        ).labels(pipeline)
        self.late = self._gauge(
            "lowtide_front_late_records", "late records a front reported since its producer "
            "started, by what became of them (clamped, rejected, raised, out of range)",
            [*one, "front", "outcome"])
        self._gauge(  # the "info" convention: a dashboard shows which version runs
            "lowtide_build_info", "lowtide's version (the value is always 1)",
            [*one, "version"],
        ).labels(pipeline, __version__).set(1)
        self._totals: dict[tuple[str, ...], int] = {}

    def _gauge(self, name: str, help_text: str, labels: list[str]) -> Gauge:
        return Gauge(name, help_text, labels, registry=self.registry)

    def _counter(self, name: str, help_text: str, labels: list[str]) -> Counter:
        return Counter(name, help_text, labels, registry=self.registry)

    def error(self, code: str) -> None:
        self.errors.labels(self.pipeline, code).inc()

    def updates(self, updates: Iterable[MinTimeUpdate], now_ms: int, grid: TimeGrid) -> None:
        for u in updates:
            self._min_time(GLOBAL if u.segment is None else u.segment, u.time, now_ms, grid)
            self.notifications.inc()

    def _min_time(self, segment: str, slot: int, now_ms: int, grid: TimeGrid) -> None:
        start_ms = grid.slot_start_ms(slot)
        self.min_time.labels(self.pipeline, segment).set(start_ms / MS_PER_S)
        self.lag.labels(self.pipeline, segment).set((now_ms - start_ms) / MS_PER_S)

    def observe(self, status: dict[str, Any], now_ms: int, grid: TimeGrid) -> None:
        """Refresh from a server status (a coordinator's sums up its shards')."""
        p = self.pipeline
        for seg in status["segments"]:
            name = seg["segment"]
            self.open_windows.labels(p, name).set(seg["open_windows"])
            self.stuck.labels(p, name).set(seg.get("stuck_windows", 0))
            self._min_time(name, seg["min_time"], now_ms, grid)
            for r, t in enumerate(seg.get("key_ranges", [])):  # as "<segment>#<range>"
                self._min_time(f"{name}#{r}", t, now_ms, grid)
            for direction in ("received", "sent"):
                total = int(seg.get(direction, 0))
                self._catch_up(self.rows.labels(p, name, direction), (name, direction), total)
        self._min_time(GLOBAL, status["global_min"], now_ms, grid)
        self.stuck.labels(p, GLOBAL).set(len(status["stuck"]))
        self._catch_up(self.acks, ("acks",), int(status.get("acks_applied", 0)))
        self._catch_up(self.dedup_hits, ("dedup_hits",), int(status.get("dedup_hits", 0)))
        events = status.get("front_events", {})
        self._catch_up(self.fronts_refused, ("fronts_refused",), int(events.get("behind", 0)))
        self._catch_up(self.fronts_retired, ("fronts_retired",), int(events.get("retired", 0)))
        self.fronts_waiting.set(len(status.get("fronts_declared", {})))
        self.fronts_dead.set(len(status.get("fronts_dead", {})))
        self._catch_up(self.fronts_dead_retired, ("fronts_dead_retired",),
                       int(events.get("dead_retired", 0)))
        self.windows_waiting.set(len(status.get("waiting", ())))
        for front, counts in late_records(status).items():
            for outcome, n in counts.items():
                self.late.labels(p, front, outcome).set(n)

    def sla(self, late: int, worst_ms: int) -> None:
        """``late`` windows just became late; the oldest open one is ``worst_ms`` past."""
        self.windows_late.inc(late)
        self.sla_late.set(worst_ms / MS_PER_S)

    def _catch_up(self, counter: Any, key: tuple[str, ...], total: int) -> None:
        """Counters follow the engine's own totals: one source, whatever the role. A
        total that falls (a shard restarted from zero) is a new base, not a stall."""
        if total < self._totals.get(key, 0):
            self._totals[key] = total
        if total > self._totals.get(key, 0):
            counter.inc(total - self._totals.get(key, 0))
            self._totals[key] = total

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def http(self, _request: HttpRequest) -> HttpReply:
        """Any request gets the metrics as Prometheus text."""
        return HttpReply(200, self.render(), "text/plain; version=0.0.4")
