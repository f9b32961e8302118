"""The wall clock the service injects into the core (which never reads one)."""

from __future__ import annotations

import time


def wall_ms() -> int:
    """Milliseconds since the epoch: fronts label items with this clock, so a min time
    (in slots) can be compared with it to show lag."""
    return time.time_ns() // 1_000_000


class SystemClock:
    """:func:`wall_ms` as the injectable clock of the service and the fronts."""

    def now_ms(self) -> int:
        return wall_ms()
