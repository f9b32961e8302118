"""Progress figures from a tracker's status document, without rich or I/O: rows/s per
segment from cumulative totals, and which fronts are stalled. One implementation for
``lowtide status`` and the Spark layer's ``pipe.status()``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from lowtide.core.time import TimeGrid


class RowRates:
    """Rows/s per segment from cumulative counts, over the last ``window_s`` seconds
    (counts arrive per task and batch, so shorter windows jump around). A total that
    goes down (the tracker restarted and counts from zero) starts afresh.

    >>> r = RowRates()
    >>> r.observe("sink", 10.0, 100), r.observe("sink", 11.0, 600)
    (None, 500.0)
    """

    def __init__(self, window_s: float = 3.0, min_span_s: float = 0.5) -> None:
        self.window_s, self.min_span_s = window_s, min_span_s
        self._samples: dict[str, list[tuple[float, int]]] = {}

    def observe(self, segment: str, now_s: float, total: int) -> float | None:
        samples = self._samples.setdefault(segment, [])
        if samples and total < samples[-1][1]:
            samples.clear()
        samples.append((now_s, total))
        while len(samples) > 2 and now_s - samples[1][0] >= self.window_s:
            samples.pop(0)
        t0, n0 = samples[0]
        if now_s - t0 < self.min_span_s:
            return None
        return (total - n0) / (now_s - t0)


def stalled_fronts(
    fronts: dict[str, Any],
    now_ms: int,
    grid: TimeGrid,
    behind_ms: int = 2_000,
    silent_ms: int = 60_000,
) -> list[int]:
    """Fronts whose heartbeat trails the most advanced front by more than
    ``behind_ms``, or the wall clock by more than ``silent_ms``. (Micro-batches make
    every heartbeat trail the clock by about a batch, so the pack is the reference.)

    >>> stalled_fronts({"0": ["src", 1_000], "1": ["src", 700]}, 10_000, TimeGrid(10))
    [1]
    """
    going = {f: t for f, (_seg, t) in fronts.items() if not grid.at_end(t)}  # not ended
    if not going:
        return []
    lead = max(going.values())
    return sorted(
        int(f)
        for f, t in going.items()
        if (lead - t) * grid.delta_ms > behind_ms or now_ms - t * grid.delta_ms > silent_ms
    )


def utc_text(ms: int) -> str:
    """A wall time (Unix ms) as an ISO UTC timestamp, to the second.

    >>> utc_text(1_764_122_400_000)
    '2025-11-26T02:00:00+00:00'
    """
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def doc_grid(doc: dict[str, Any]) -> TimeGrid:
    """The time grid a status document was made with."""
    return TimeGrid(int(doc.get("delta_ms", 10)), int(doc.get("window_slots", 1)))


def open_ends(doc: dict[str, Any]) -> list[str]:
    """Source segments that no live or declared front will move on: their fronts were
    unregistered (or retired) below the end of their input, so nothing at or after
    their bound ever completes (the windows holding the last records stay open, and
    are not stuck: no bound passed them). One line each, saying what to do.

    >>> doc = {"segments": [{"segment": "in", "source": True, "bound": 7, "in_flight": 0},
    ...                     {"segment": "win.state", "source": False, "in_flight": 2}]}
    >>> open_ends(doc)[0][:73]
    "segment 'in' has no live front: it stays at slot 7, where its fronts were"
    """
    grid = doc_grid(doc)
    fronted = {seg for seg, *_r in doc.get("fronts", {}).values()}
    fronted |= {seg for seg, *_r in doc.get("fronts_declared", {}).values()}
    held = sum(int(s.get("in_flight", 0)) for s in doc.get("segments", [])
               if not s.get("source"))
    return [
        f"segment {s['segment']!r} has no live front: it stays at slot {s['bound']}, where "
        f"its fronts were unregistered, and {held} item(s) held open downstream (the "
        "windows holding its last records) never complete: end each front's input with "
        "Front.close() (not end=False), or register a front"
        for s in doc.get("segments", [])
        if s.get("source") and s["segment"] not in fronted and int(s["bound"]) > 0
        and not grid.at_end(int(s["bound"]))
    ]


def late_records(doc: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per front, what it did with late records, as it reported them (``late_clamped``,
    ``late_rejected``, ``late_raised``, ``out_of_range``)."""
    late: dict[str, dict[str, int]] = doc.get("front_events", {}).get("late", {})
    return late


def late_lines(doc: dict[str, Any]) -> list[str]:
    """One line per front that reported late records.

    >>> late_lines({"front_events": {"late": {"3": {"late_clamped": 12, "late_rejected": 0,
    ...     "late_raised": 0, "out_of_range": 1}}}})
    ['front 3: late records: 12 clamped, 0 rejected, 0 raised; 1 out of range']
    """
    return [
        f"front {f}: late records: {c.get('late_clamped', 0)} clamped, "
        f"{c.get('late_rejected', 0)} rejected, {c.get('late_raised', 0)} raised; "
        f"{c.get('out_of_range', 0)} out of range"
        for f, c in sorted(late_records(doc).items(), key=lambda kv: int(kv[0]))
    ]

