"""The web view's document: what the page draws, made from a server's status, pure.

The server refreshes its status once per ``metrics_every_ms`` (a full status walks
every open window); :class:`WebView` turns each into one document, with the rows/s of
the segments between refreshes and the charts' history (:mod:`.charts`), encoded once
when a browser first asks for it, so any number of browsers polling the page cost the
tracker nothing more. Every time in it is wall-clock UTC (ms), never a slot: lines the
tracker wrote with slots get them as UTC timestamps (:func:`utc_slots`).

>>> from lowtide.core.graph import SegmentGraph
>>> g = SegmentGraph.of(("src", ()), ("mid", ("src",)), ("sink", ("mid",)))
>>> [s["depth"] for s in view_document(
...     {"segments": [{"segment": n, "min_time": 0} for n in g.names]}, g)["segments"]]
[0, 1, 2]
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.service.freshness import Freshness, Sla
from lowtide.service.progress import (
    RowRates,
    doc_grid,
    late_records,
    open_ends,
    stalled_fronts,
)
from lowtide.service.web.charts import ChartRing

MS_PER_S = 1000.0
_SLOTS = re.compile(r"\bslots \[(\d+), (\d+)\)|\bslot (\d+)")
#: a front's line in the tracker's recent events once it was retired (dead, or
#: declared and never registered)
_RETIRED = re.compile(r"(?:retired: )?front (\d+) (?:retired at|was declared on)")


def utc_ms_text(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def utc_slots(text: str, delta_ms: int) -> str:
    """A tracker's line with its slots as UTC times.

    >>> utc_slots("segment 'a', slots [100, 101): 2 item(s) missing", 10)
    "segment 'a', [1970-01-01T00:00:01.000+00:00, 1970-01-01T00:00:01.010+00:00): 2 item(s) missing"
    >>> utc_slots("its heartbeat at slot 90", 10)
    'its heartbeat at 1970-01-01T00:00:00.900+00:00'
    """

    def utc(m: re.Match[str]) -> str:
        if m[3] is not None:
            return utc_ms_text(int(m[3]) * delta_ms)
        return f"[{utc_ms_text(int(m[1]) * delta_ms)}, {utc_ms_text(int(m[2]) * delta_ms)})"

    return _SLOTS.sub(utc, text)


def depths(graph: SegmentGraph) -> list[int]:
    """Each segment's column in the drawing: the longest path from a source to it.
    Inbound segments come first in a graph's order, so one pass suffices (a loop's
    edges back to an earlier segment do not count: rule 11)."""
    out: list[int] = []
    for inbound in graph.inbound:
        out.append(1 + max((out[i] for i in inbound if i < len(out)), default=-1))
    return out


def lag_ms(min_time: int, now_ms: int, grid: TimeGrid) -> int | None:
    """Wall clock minus the start of the min time; None before anything was announced
    (a min time of 0 is the epoch, not a lag of 56 years) and once the input ended."""
    if min_time <= 0 or grid.at_end(min_time):
        return None
    return now_ms - min_time * grid.delta_ms


def view_document(
    status: dict[str, Any],
    graph: SegmentGraph | None,
    rates: RowRates | None = None,
    pipeline: str = "default",
) -> dict[str, Any]:
    """The page's data: the graph with per segment figures, stuck windows, fronts and
    shards. ``rates`` (kept across refreshes) gives rows/s from ``received`` totals."""
    now = int(status.get("now_ms", 0))
    grid = doc_grid(status)
    delta = grid.delta_ms
    global_min = int(status.get("global_min", 0))
    return {
        "pipeline": pipeline,
        "server": status.get("server"),
        "url": status.get("url"),
        "now_ms": now,
        "delta_ms": delta,
        "graph_known": graph is not None,
        "global_min": global_min,
        "global_lag_ms": lag_ms(global_min, now, grid),
        "connections": status.get("connections", 0),
        "ha": status.get("ha"),  # a group's tracker: its role and epoch (rule 18)
        "acks_applied": status.get("acks_applied", 0),
        "segments": _segments(status, graph, rates or RowRates(), now, grid),
        "stuck": [_stuck(w, delta) for w in status.get("stuck_detail", [])],
        "fronts": _fronts(status.get("fronts", {}), now, grid, status.get("fronts_dead", {}))
        + _declared(status.get("fronts_declared", {}), now, delta) + _retired(status, delta),
        "open_windows": _open_windows(status, graph, now),
        "waiting": [utc_slots(w, delta) for w in status.get("waiting", [])],
        "front_events": [utc_slots(e, delta)
                         for e in status.get("front_events", {}).get("recent", [])],
        "late": [{"front": int(f), **c} for f, c in sorted(
            late_records(status).items(), key=lambda kv: int(kv[0]))],
        "open_ends": [utc_slots(e, delta) for e in open_ends(status)],
        "shards": [
            {"url": s["url"], "connected": bool(s["connected"])} for s in status.get("shards", [])
        ],
    }


def _segments(
    status: dict[str, Any], graph: SegmentGraph | None, rates: RowRates, now: int,
    grid: TimeGrid,
) -> list[dict[str, Any]]:
    if graph is None:
        return []
    by_name = {s["segment"]: s for s in status.get("segments", [])}
    out = []
    for name, inbound, depth in zip(graph.names, graph.inbound, depths(graph), strict=True):
        seg = by_name.get(name, {})
        min_time = int(seg.get("min_time", 0))
        received = seg.get("received")
        rate = None if received is None else rates.observe(name, now / MS_PER_S, int(received))
        out.append(
            {
                "name": name,
                "inbound": [graph.names[i] for i in inbound],
                "depth": depth,
                "min_time": min_time,
                "min_time_ms": min_time * grid.delta_ms,
                "lag_ms": lag_ms(min_time, now, grid),
                "rows_per_s": rate,
                "received": received,
                "sent": seg.get("sent"),
                "open_windows": int(seg.get("open_windows", 0)),
                "in_flight": int(seg.get("in_flight", 0)),
                "stuck_windows": int(seg.get("stuck_windows", 0)),
                "key_ranges": [{"min_time": t, "min_time_ms": t * grid.delta_ms,
                                "lag_ms": lag_ms(t, now, grid)}
                               for t in seg.get("key_ranges", [])],
            }
        )
    return out


def _stuck(window: dict[str, Any], delta: int) -> dict[str, Any]:
    return {**window, "start_ms": int(window["window_start"]) * delta,
            "end_ms": int(window["window_end"]) * delta,
            "text": utc_slots(window.get("text", ""), delta)}


def _front(front: int, segment: str, heartbeat_ms: int | None, now: int, state: str,
           detail: str = "") -> dict[str, Any]:
    """A row of the fronts table; ``state``: ok, lagging, dead (waited for), retired,
    declared (not registered) or ended; ``detail``: the tracker's line, if any."""
    return {"front": front, "segment": segment, "heartbeat_ms": heartbeat_ms,
            "heartbeat_lag_ms": None if heartbeat_ms is None else now - heartbeat_ms,
            "state": state, "detail": detail}


def _fronts(fronts: dict[str, Any], now: int, grid: TimeGrid,
            dead: dict[str, Any]) -> list[dict[str, Any]]:
    """The live fronts; ``dead``: those the dead-front policy waits for."""
    lagging = set(stalled_fronts(fronts, now, grid))
    out = []
    for front, (segment, t) in sorted(fronts.items(), key=lambda kv: int(kv[0])):
        ended = grid.at_end(int(t))
        state = ("dead" if front in dead else "ended" if ended
                 else "lagging" if int(front) in lagging else "ok")
        detail = utc_slots(dead[front]["text"], grid.delta_ms) if front in dead else ""
        out.append(_front(int(front), segment, None if ended else int(t) * grid.delta_ms,
                          now, state, detail))
    return out


def _declared(declared: dict[str, Any], now: int, delta: int) -> list[dict[str, Any]]:
    """Declared fronts that have not registered: they hold their segment where they
    were declared (-1: where it starts, not known yet)."""
    return [_front(int(front), segment, int(t) * delta if int(t) >= 0 else None, now,
                   "declared", "declared, not registered: its segment waits for it")
            for front, (segment, t, *_rest) in sorted(declared.items(),
                                                      key=lambda kv: int(kv[0]))]


def _retired(status: dict[str, Any], delta: int) -> list[dict[str, Any]]:
    """Fronts the tracker retired (the latest events name them; they are gone from
    its fronts), with the event's line."""
    live = set(status.get("fronts", {})) | set(status.get("fronts_declared", {}))
    out: dict[int, dict[str, Any]] = {}
    for line in status.get("front_events", {}).get("recent", []):
        m = _RETIRED.match(line)
        if m is not None and m[1] not in live:
            segment = re.search(r"on '([^']*)'", line)
            out[int(m[1])] = _front(int(m[1]), segment[1] if segment else "", None,
                                    int(status.get("now_ms", 0)), "retired",
                                    utc_slots(line, delta))
    return [out[f] for f in sorted(out)]


def _open_windows(status: dict[str, Any], graph: SegmentGraph | None,
                  now: int) -> list[dict[str, Any]]:
    """Each sink's ended windows not complete yet, with their ETA: the tracker's SLA
    watch's when it has an SLA (``late_ms``: past it), else windows of the SLA's
    default length (no SLA: ``late_ms`` None)."""
    fresh = status.get("freshness")
    if fresh is not None:
        return list(fresh.get("open", []))
    if graph is None:
        return []
    sla = Sla(sla_ms=1)  # only its windows count here: nothing is late without an SLA
    return [{**w.as_dict(), "late_ms": None}
            for w in Freshness(sla).open_windows(status, graph, now)]


class WebView:
    """The latest view document of one server, as the bytes the page fetches."""

    def __init__(self, pipeline: str = "default", charts: ChartRing | None = None) -> None:
        self.pipeline = pipeline
        self._rates = RowRates()
        self.charts = charts or ChartRing()
        self._doc: dict[str, Any] = {}
        self._body: bytes | None = None

    def observe(self, status: dict[str, Any], graph: SegmentGraph | None) -> None:
        doc = view_document(status, graph, self._rates, self.pipeline)
        self.charts.record(doc["now_ms"], doc["segments"])
        self._doc, self._body = doc, None

    @property
    def body(self) -> bytes:
        """The document with its charts, encoded on the first request after a refresh."""
        if self._body is None:
            doc = {**self._doc, "charts": self.charts.document()} if self._doc else {}
            self._body = json.dumps(doc, separators=(",", ":")).encode()
        return self._body
