"""Global time: slots of delta_ms, grouped into tracking windows; time is injected.

A front labels an item with ``slot = clock_ms // delta_ms`` and its own id. The tracker
works on *windows* of ``window_slots`` slots, and every min time it announces is a
window boundary expressed in slots: "no item with slot < t is in flight".

>>> grid = TimeGrid(delta_ms=10, window_slots=4)
>>> grid.slot_of(1_234)
123
>>> grid.window_of(123), grid.window_start(30)
(30, 120)
>>> grid.label(1_234, front=7)
GlobalTime(slot=123, front=7)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

DEFAULT_DELTA_MS = 10
#: Exclusive upper limit of slot values: leaves headroom in int64 for window arithmetic.
TIME_LIMIT = 1 << 62
#: The end of an input: a front whose input is finished promises this time (its last
#: heartbeat), so every window holding its records can complete. 2200-01-01T00:00:00Z:
#: past any time a clock front labels, within what datetimes, pandas and Spark hold.
END_MS = 7_258_118_400_000


@dataclass(frozen=True, order=True)
class GlobalTime:
    """An item's label: ordered by slot, ties broken by front id."""

    slot: int
    front: int


@dataclass(frozen=True)
class TimeGrid:
    """How clock milliseconds map to slots and slots to tracking windows."""

    delta_ms: int = DEFAULT_DELTA_MS
    window_slots: int = 1

    def __post_init__(self) -> None:
        if self.delta_ms <= 0:
            raise ValueError(f"delta_ms must be positive, got {self.delta_ms}")
        if self.window_slots <= 0:
            raise ValueError(f"window_slots must be positive, got {self.window_slots}")

    def slot_of(self, clock_ms: int) -> int:
        return clock_ms // self.delta_ms

    def label(self, clock_ms: int, front: int) -> GlobalTime:
        return GlobalTime(self.slot_of(clock_ms), front)

    def window_of(self, slot: int) -> int:
        return slot // self.window_slots

    def window_start(self, window: int) -> int:
        return window * self.window_slots

    def slot_start_ms(self, slot: int) -> int:
        return slot * self.delta_ms

    @property
    def end_slot(self) -> int:
        """The slot of :data:`END_MS`, the heartbeat of a front whose input ended."""
        return self.slot_of(END_MS)

    def at_end(self, time: int) -> bool:
        """Whether a heartbeat, bound or min time (a window boundary at or below
        :attr:`end_slot`) says the input ended: nothing more will come.

        >>> grid = TimeGrid(10, 4)
        >>> grid.at_end(grid.end_slot // 4 * 4), grid.at_end(grid.end_slot - 4)
        (True, False)
        """
        return time > self.end_slot - self.window_slots


class Clock(Protocol):
    """Where the I/O layers get the time from; the core only ever receives ``now_ms``."""

    def now_ms(self) -> int: ...


class ManualClock:
    """A clock that moves only when told to: for tests and simulations.

    >>> clock = ManualClock(100)
    >>> clock.advance(5)
    105
    """

    def __init__(self, start_ms: int = 0) -> None:
        self._now_ms = start_ms

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, delta_ms: int) -> int:
        if delta_ms < 0:
            raise ValueError("a clock does not go back")
        self._now_ms += delta_ms
        return self._now_ms
