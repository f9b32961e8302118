"""A pipeline's progress as the tracker reports it: per segment min time, lag, rows/s
and inbound segments (the graph, for unions and fan-out), fronts' heartbeat lag,
stalled fronts, stuck windows, segments no live front will close (open ends) and the
late records each front reported."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.service.clock import wall_ms
from lowtide.service.progress import (
    RowRates,
    late_lines,
    late_records,
    open_ends,
    stalled_fronts,
)


@dataclass
class SegmentProgress:
    segment: str
    min_time: int
    lag_ms: int | None
    rows_per_s: float | None
    in_flight: int | None = None
    bound: int | None = None
    #: the segments whose receivers send into this one (none: fronts feed it)
    inbound: tuple[str, ...] = ()


@dataclass
class PipelineStatus:
    wall_ms: int
    global_min: int
    segments: list[SegmentProgress]
    fronts: dict[str, Any] = field(default_factory=dict)
    stalled_fronts: list[int] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    #: a query's first batch still running: "batch 0 planning" / "batch 0 running ..."
    starting: str | None = None
    #: declared fronts that have not registered yet: front -> (segment, held at slot)
    waiting_fronts: dict[str, Any] = field(default_factory=dict)
    #: registrations refused for being behind their segment (a producer that started
    #: late, undeclared), declared fronts retired by their deadline, the latest of them
    fronts_refused: int = 0
    fronts_retired: int = 0
    front_events: list[str] = field(default_factory=list)
    #: dead fronts the tracker waits for (dead_fronts="wait"): "front F dead, ... since T"
    dead_fronts: list[str] = field(default_factory=list)
    #: overdue windows a running batch may still deliver: "waiting for query Q batch N"
    waiting: list[str] = field(default_factory=list)
    #: the latest sink windows later than the SLA (Pipeline(sla=...)), what holds each
    late_windows: list[str] = field(default_factory=list)
    #: per front, what it did with late records (late_clamped, late_rejected,
    #: late_raised, out_of_range), as it reported them
    late: dict[str, dict[str, int]] = field(default_factory=dict)
    #: source segments no live front will move: what stays open there, one line each
    open_ends: list[str] = field(default_factory=list)

    def render(self, delta_ms: int) -> str:
        lines = [f"starting: {self.starting}"] if self.starting else []
        lines += [f"{'segment':<16} {'min time':>14} {'lag ms':>9} {'rows/s':>10} {'in flight':>9}"
                 "  from"]
        for s in self.segments:
            lag = "-" if s.lag_ms is None else str(s.lag_ms)
            rps = "-" if s.rows_per_s is None else f"{s.rows_per_s:.0f}"
            fl = "-" if s.in_flight is None else str(s.in_flight)
            ups = ", ".join(s.inbound) or "-"
            lines.append(f"{s.segment:<16} {s.min_time:>14} {lag:>9} {rps:>10} {fl:>9}  {ups}")
        for f, (seg, t) in sorted(self.fronts.items(), key=lambda kv: int(kv[0])):
            if TimeGrid(delta_ms).at_end(t):
                lines.append(f"front {f:<10} {seg:<8} ended (its input is complete)")
                continue
            flag = "  STALLED" if int(f) in self.stalled_fronts else ""
            lag = self.wall_ms - t * delta_ms
            lines.append(f"front {f:<10} {seg:<8} heartbeat lag {lag} ms{flag}")
        for f, (seg, t, *_rest) in sorted(self.waiting_fronts.items(), key=lambda kv: int(kv[0])):
            lines.append(f"front {f:<10} {seg:<8} declared, not registered: holds it at {t}")
        if self.fronts_refused:
            lines.append(f"FRONTS REFUSED: {self.fronts_refused} registration(s) behind their "
                         "segment (records of a producer that started late were not written)")
        lines.extend(f"FRONT: {e}" for e in self.front_events)
        lines.extend(f"WAITS FOR: {d}" for d in self.dead_fronts)
        lines.extend(f"waiting (not lost): {w}" for w in self.waiting)
        lines.extend(f"LATE: {w}" for w in self.late_windows[-5:])
        lines.extend(f"STUCK: {s}" for s in self.stuck)
        lines.extend(f"OPEN: {s}" for s in self.open_ends)
        lines.extend(late_lines({"front_events": {"late": self.late}}))
        return "\n".join(lines)


def status_of(doc: dict[str, Any], grid: TimeGrid, rates: RowRates | None = None,
              stall_after_ms: int = 2_000, graph: SegmentGraph | None = None) -> PipelineStatus:
    """A :class:`PipelineStatus` from the tracker's status document. Rows/s per segment
    come from the tracker's cumulative ``received`` count of each segment; inbound
    segments from ``graph`` (the document has indices only)."""
    now = int(doc.get("now_ms") or wall_ms())
    segs = []
    for s in doc.get("segments", []):
        ended = grid.at_end(s["min_time"])
        lag = now - s["min_time"] * grid.delta_ms if s["min_time"] > 0 and not ended else None
        rps = None
        total = s.get("received")
        if rates is not None and total is not None:
            rps = rates.observe(s["segment"], time.monotonic(), int(total))
        ups: tuple[str, ...] = ()
        if graph is not None and s["segment"] in graph:
            ups = tuple(graph.names[j] for j in graph.inbound[graph.index(s["segment"])])
        segs.append(SegmentProgress(s["segment"], s["min_time"], lag, rps,
                                    s.get("in_flight"), s.get("bound"), ups))
    fronts = doc.get("fronts", {})
    stalled = stalled_fronts(fronts, now, grid, stall_after_ms)
    events = doc.get("front_events", {})
    return PipelineStatus(now, doc.get("global_min", 0), segs, fronts, sorted(stalled),
                          list(doc.get("stuck", [])), None, doc.get("fronts_declared", {}),
                          int(events.get("behind", 0)), int(events.get("retired", 0)),
                          list(events.get("recent", [])),
                          [d["text"] for d in doc.get("fronts_dead", {}).values()],
                          list(doc.get("waiting", [])),
                          [w["text"] for w in (doc.get("freshness") or {}).get("late", [])],
                          late_records(doc), open_ends(doc))
