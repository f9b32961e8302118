"""The web view's document: what the page draws, made from a server's status, pure.

The server refreshes its status once per ``metrics_every_ms`` (a full status walks
every open window); :class:`WebView` turns each into one JSON document, with the rows/s
of the segments between refreshes, so any number of browsers polling the page cost
the tracker nothing more.

>>> from lowtide.core.graph import SegmentGraph
>>> g = SegmentGraph.of(("src", ()), ("mid", ("src",)), ("sink", ("mid",)))
>>> [s["depth"] for s in view_document(
...     {"segments": [{"segment": n, "min_time": 0} for n in g.names]}, g)["segments"]]
[0, 1, 2]
"""

from __future__ import annotations

import json
from typing import Any

from lowtide.core.graph import SegmentGraph
from lowtide.core.time import TimeGrid
from lowtide.service.progress import (
    RowRates,
    doc_grid,
    late_records,
    open_ends,
    stalled_fronts,
)

MS_PER_S = 1000.0


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
        "acks_applied": status.get("acks_applied", 0),
        "segments": _segments(status, graph, rates or RowRates(), now, grid),
        "stuck": list(status.get("stuck_detail", [])),
        "fronts": _fronts(status.get("fronts", {}), now, grid, status.get("fronts_dead", {}))
        + _declared(status.get("fronts_declared", {}), now, delta),
        "waiting": list(status.get("waiting", [])),
        "front_events": status.get("front_events", {}),
        "late": [{"front": int(f), **c} for f, c in sorted(
            late_records(status).items(), key=lambda kv: int(kv[0]))],
        "open_ends": open_ends(status),
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


def _fronts(fronts: dict[str, Any], now: int, grid: TimeGrid,
            dead: dict[str, Any]) -> list[dict[str, Any]]:
    """``dead``: the fronts the dead-front policy waits for (their line says since when)."""
    stalled = set(stalled_fronts(fronts, now, grid))
    delta = grid.delta_ms
    return [
        {
            "front": int(front),
            "segment": segment,
            "heartbeat": int(t),
            "heartbeat_lag_ms": now - int(t) * delta,
            "stalled": int(front) in stalled,
            "dead": dead[front]["text"] if front in dead else None,
            "ended": grid.at_end(int(t)),
        }
        for front, (segment, t) in sorted(fronts.items(), key=lambda kv: int(kv[0]))
    ]


def _declared(declared: dict[str, Any], now: int, delta: int) -> list[dict[str, Any]]:
    """Declared fronts that have not registered: rows of the fronts table that hold
    their segment where they were declared (-1: where it starts, not known yet)."""
    return [
        {
            "front": int(front),
            "segment": segment,
            "heartbeat": int(t),
            "heartbeat_lag_ms": now - int(t) * delta if int(t) >= 0 else None,
            "stalled": False,
            "declared": True,
        }
        for front, (segment, t, *_rest) in sorted(declared.items(), key=lambda kv: int(kv[0]))
    ]


class WebView:
    """The latest view document of one server, as the bytes the page fetches."""

    def __init__(self, pipeline: str = "default") -> None:
        self.pipeline = pipeline
        self._rates = RowRates()
        self.body = b"{}"

    def observe(self, status: dict[str, Any], graph: SegmentGraph | None) -> None:
        doc = view_document(status, graph, self._rates, self.pipeline)
        self.body = json.dumps(doc, separators=(",", ":")).encode()
