"""Freshness: per open window of each sink an ETA, and the windows later than an SLA.

Pure (no I/O, no clock): fed a tracker's status document, the graph and the time.
A sink's windows of ``window_ms`` (wall-clock aligned) that have ended and that its
min time has not passed are *open*. Each gets an ETA from what holds it:

* fronts: a front whose heartbeat is below the window's end lags the wall clock by
  ``lag``; it reaches the end about ``lag`` after the end (a dead front waited for:
  never, the ETA is None);
* batches: then one more batch of the recent batch time (the queries' reported
  open-to-close times) carries the rows to the sink.

A window is *late* once ``sla_ms`` has passed since its end and the sink has not passed
it; each late window is reported once, naming what holds it back: the most upstream
segment whose min time is below the window's end, the front that holds a source
segment there, and the batch running on that segment.

>>> from lowtide.core.graph import SegmentGraph
>>> g = SegmentGraph.of(("ingest", ()), ("sink", ("ingest",)))
>>> doc = {"delta_ms": 10, "segments": [{"segment": "ingest", "min_time": 100},
...        {"segment": "sink", "min_time": 100}], "fronts": {"3": ["ingest", 100]},
...        "open_batches": [], "batch_ms": 2_000}
>>> f = Freshness(Sla(sla_ms=30_000, window_ms=1_000))
>>> [(w.start_ms, w.eta_ms) for w in f.open_windows(doc, g, now_ms=3_500)]  # 2.5 s lag
[(1000, 6500), (2000, 7500)]
>>> [w.describe() for w in f.late(doc, g, now_ms=32_500)]  # doctest: +NORMALIZE_WHITESPACE
["sink 'sink' window [1970-01-01T00:00:01+00:00, +1 s) is 0.5 s later than its SLA
  (30 s): held by front 3 on 'ingest' (heartbeat 31.5 s behind)"]
>>> f.late(doc, g, now_ms=32_600)  # reported once
[]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lowtide.core.graph import SegmentGraph
from lowtide.service.progress import utc_text

#: open windows listed per sink (the oldest)
MAX_OPEN = 20


@dataclass(frozen=True)
class Sla:
    """A sink's window of ``window_ms`` is late ``sla_ms`` after its end."""

    sla_ms: int
    window_ms: int = 1_000

    def __post_init__(self) -> None:
        if self.sla_ms <= 0 or self.window_ms <= 0:
            raise ValueError(f"sla and its window must be > 0 ms, got {self.sla_ms} and "
                             f"{self.window_ms} (e.g. sla='30 seconds')")


@dataclass(frozen=True)
class OpenWindow:
    sink: str
    start_ms: int
    end_ms: int
    eta_ms: int | None  # None: a dead front holds it (never by itself)
    late_ms: int  # how far past its SLA (<= 0: not late)
    sla_ms: int
    held_by: str

    def describe(self) -> str:
        start = utc_text(self.start_ms)
        span = f"+{(self.end_ms - self.start_ms) / 1000:g} s"
        return (f"sink {self.sink!r} window [{start}, {span}) is {self.late_ms / 1000:g} s "
                f"later than its SLA ({self.sla_ms / 1000:g} s): held by {self.held_by}")

    def as_dict(self) -> dict[str, Any]:
        return {"sink": self.sink, "start_ms": self.start_ms, "end_ms": self.end_ms,
                "eta_ms": self.eta_ms, "late_ms": self.late_ms, "held_by": self.held_by}


class Freshness:
    """One SLA over a tracker's sinks; :meth:`late` remembers what it reported."""

    def __init__(self, sla: Sla) -> None:
        self.sla = sla
        self._reported: set[tuple[str, int]] = set()

    def open_windows(self, doc: dict[str, Any], graph: SegmentGraph,
                     now_ms: int) -> list[OpenWindow]:
        """Every sink's ended windows its min time has not passed, oldest first."""
        delta = int(doc.get("delta_ms", 10))
        mins = {s["segment"]: int(s["min_time"]) * delta for s in doc.get("segments", [])}
        w = self.sla.window_ms
        out: list[OpenWindow] = []
        for sink in [n for n in sinks(graph) if mins.get(n, 0) > 0]:  # 0: not started
            start = mins[sink] // w * w
            for s in range(start, min(now_ms // w * w, start + MAX_OPEN * w), w):
                held, front_at = holder(doc, graph, sink, s + w, now_ms)
                eta = None if front_at is None else max(now_ms, front_at) + batch_ms(doc)
                out.append(OpenWindow(sink, s, s + w, eta, now_ms - (s + w) - self.sla.sla_ms,
                                      self.sla.sla_ms, held))
        return out

    def late(self, doc: dict[str, Any], graph: SegmentGraph, now_ms: int) -> list[OpenWindow]:
        """Open windows past their SLA not reported before (each once)."""
        open_now = self.open_windows(doc, graph, now_ms)
        fresh = [o for o in open_now if o.late_ms > 0
                 and (o.sink, o.start_ms) not in self._reported]
        self._reported = {(o.sink, o.start_ms) for o in open_now if o.late_ms > 0}
        return fresh


def sinks(graph: SegmentGraph) -> list[str]:
    """Segments no other segment has as inbound: where the rows leave."""
    inner = {u for ups in graph.inbound for u in ups}
    return [n for i, n in enumerate(graph.names) if i not in inner]


def batch_ms(doc: dict[str, Any]) -> int:
    return int(doc.get("batch_ms") or 0)


def holder(doc: dict[str, Any], graph: SegmentGraph, sink: str, end_ms: int,
           now_ms: int) -> tuple[str, int | None]:
    """What holds ``sink`` below ``end_ms``, and when the fronts will have passed it
    (None: a dead front waited for holds it)."""
    delta = int(doc.get("delta_ms", 10))
    mins = {s["segment"]: int(s["min_time"]) * delta for s in doc.get("segments", [])}
    ups = ancestors(graph, sink)
    held = next((n for n in graph.names if n in ups and mins.get(n, 0) < end_ms), sink)
    slow = sorted((int(t) * delta, int(f)) for f, (seg, t) in doc.get("fronts", {}).items()
                  if seg == held and int(t) * delta < end_ms)
    dead = doc.get("fronts_dead", {})
    parts: list[str] = []
    at: int | None = end_ms
    for hb_ms, f in slow[:1]:
        if str(f) in dead:
            parts.append(f"dead front {f} on {held!r} (since {dead[str(f)]['silent_since']})")
            at = None
        else:
            lag = now_ms - hb_ms
            parts.append(f"front {f} on {held!r} (heartbeat {lag / 1000:g} s behind)")
            at = end_ms + lag
    if not slow:
        parts.append(f"segment {held!r} (items in flight)")
    parts += [f"query {b['query']} batch {b['batch']} running {b['running_ms'] / 1000:.0f} s"
              for b in doc.get("open_batches", []) if held in b.get("segments", ())][:1]
    return ", ".join(parts), at


def ancestors(graph: SegmentGraph, name: str) -> set[str]:
    """``name`` and every segment upstream of it."""
    seen, todo = {name}, [graph.index(name)]
    while todo:
        for u in graph.inbound[todo.pop()]:
            if graph.names[u] not in seen:
                seen.add(graph.names[u])
                todo.append(u)
    return seen
