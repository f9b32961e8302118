"""Stuck windows: bound passed, XOR still non-zero, for longer than a threshold.

Such a window will not complete by itself: an item was lost (count > 0: sent, never
received), duplicated (count < 0: received more often than sent) or its acks disagree
(count 0, XOR non-zero). The report names the segment and window (rule 9).

Unless something that could still deliver it is outstanding: with the queries' open
batches (:class:`~lowtide.core.open_batches.QueryBatches`), a window that a running
batch may still deliver is *waiting* (:meth:`StuckDetector.waiting`), not stuck, and
its threshold counts from when the last such batch closed: a slow batch is never
reported as a loss, a loss still is, once the batches that could deliver it are done.

>>> import numpy as np
>>> d = StuckDetector(threshold_ms=100)
>>> w = np.array([7]); x = np.array([5], np.uint64); c = np.array([2])
>>> d.observe(1_000, {"parse": (w, x, c)}, window_slots=10)
[]
>>> d.observe(1_100, {"parse": (w, x, c)}, window_slots=10)
[StuckWindow(segment='parse', window_start=70, window_end=80, count=2, xor=5, since_ms=1000)]
>>> d.observe(1_200, {"parse": (w, x, c)}, window_slots=10)  # reported once
[]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lowtide.core.messages import I64, U64
from lowtide.core.open_batches import QueryBatches, Waiting


@dataclass(frozen=True)
class StuckWindow:
    segment: str
    window_start: int
    window_end: int
    count: int
    xor: int
    since_ms: int

    @property
    def missing(self) -> int:
        """Items sent into the segment and never received (0 if none)."""
        return max(self.count, 0)

    @property
    def extra(self) -> int:
        """Items received more often than sent: duplicates (0 if none)."""
        return max(-self.count, 0)

    def describe(self) -> str:
        if self.count > 0:
            what = f"{self.count} item(s) missing"
        elif self.count < 0:
            what = f"{-self.count} extra item(s) (duplicates)"
        else:
            what = "acks disagree (same count, different values)"
        return f"segment {self.segment!r}, slots [{self.window_start}, {self.window_end}): {what}"


@dataclass(frozen=True)
class WaitingWindow:
    """An overdue window that a running batch may still deliver: not a loss (yet)."""

    segment: str
    window_start: int
    window_end: int
    count: int
    waiting: Waiting

    def describe(self) -> str:
        what = (f"{self.count} item(s) not yet received" if self.count > 0
                else f"{-self.count} receipt(s) ahead of their sends")
        return (f"segment {self.segment!r}, slots [{self.window_start}, {self.window_end}): "
                f"{what}, {self.waiting.describe()}")


OpenWindows = Mapping[str, tuple[I64, U64, I64]]


class StuckDetector:
    """``check_every_ms``: how often a step looks (:meth:`due`); None: a tenth of
    ``threshold_ms``, 100 ms to 1 s, so a window is reported at most 10% late and a
    busy tracker does not walk every open window ten times a second."""

    def __init__(self, threshold_ms: int, check_every_ms: int | None = None) -> None:
        if threshold_ms < 0:
            raise ValueError("threshold_ms must be >= 0")
        self.threshold_ms = threshold_ms
        self.every_ms = (check_every_ms if check_every_ms is not None
                         else min(1_000, max(100, threshold_ms // 10)))
        self._next_ms: int | None = None
        # when each window became overdue, and the batches that may still deliver it
        self._since: dict[tuple[str, int], tuple[int, dict[str, int]]] = {}
        self._current: dict[tuple[str, int], StuckWindow] = {}
        self._waiting: dict[tuple[str, int], WaitingWindow] = {}

    def due(self, now_ms: int) -> bool:
        """Whether a step at ``now_ms`` looks for stuck windows (then the next look is
        ``every_ms`` later)."""
        if self._next_ms is not None and now_ms < self._next_ms:
            return False
        self._next_ms = now_ms + self.every_ms
        return True

    def observe(
        self, now_ms: int, open_windows: OpenWindows, window_slots: int,
        batches: QueryBatches | None = None,
    ) -> list[StuckWindow]:
        """Feed the windows that are open although their bound passed; returns the
        windows that just crossed the threshold with nothing outstanding that could
        still deliver them (``batches``: the queries' open batches)."""
        seen: set[tuple[str, int]] = set()
        fresh: list[StuckWindow] = []
        for segment, (windows, xors, counts) in open_windows.items():
            for w, x, c in zip(windows.tolist(), xors.tolist(), counts.tolist(), strict=True):
                key = (segment, w)
                seen.add(key)
                start = self._clock_start(key, now_ms, batches)
                if isinstance(start, Waiting):
                    self._waiting[key] = WaitingWindow(
                        segment, w * window_slots, (w + 1) * window_slots, c, start)
                    continue
                self._waiting.pop(key, None)
                if now_ms - start < self.threshold_ms:
                    continue
                since = self._since[key][0]
                report = StuckWindow(segment, w * window_slots, (w + 1) * window_slots, c, x, since)
                if key not in self._current:
                    fresh.append(report)
                self._current[key] = report
        for key in [k for k in self._since if k not in seen]:
            del self._since[key]
            self._current.pop(key, None)
            self._waiting.pop(key, None)
        return fresh

    def _clock_start(self, key: tuple[str, int], now_ms: int,
                     batches: QueryBatches | None) -> int | Waiting:
        """Where the window's threshold counts from, or the batch that may still
        deliver it while one runs. What may deliver it is fixed when it first becomes
        overdue."""
        if key not in self._since:
            self._since[key] = (now_ms, batches.limits(key[0]) if batches else {})
        since, limits = self._since[key]
        if key in self._current or batches is None or not limits:
            return since
        wait = batches.holding(key[0], limits, now_ms)
        return wait if wait is not None else max(since, batches.released_ms(key[0], limits))

    def waiting(self) -> list[WaitingWindow]:
        """Overdue windows that a running batch may still deliver."""
        return sorted(self._waiting.values(), key=lambda s: (s.window_start, s.segment))

    def current(self) -> list[StuckWindow]:
        return sorted(self._current.values(), key=lambda s: (s.window_start, s.segment))
