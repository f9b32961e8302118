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
    if not fronts:
        return []
    lead = max(t for _seg, t in fronts.values())
    return sorted(
        int(f)
        for f, (_seg, t) in fronts.items()
        if (lead - t) * grid.delta_ms > behind_ms or now_ms - t * grid.delta_ms > silent_ms
    )


def utc_text(ms: int) -> str:
    """A wall time (Unix ms) as an ISO UTC timestamp, to the second.

    >>> utc_text(1_764_122_400_000)
    '2025-11-26T02:00:00+00:00'
    """
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")
