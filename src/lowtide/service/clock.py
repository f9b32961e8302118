"""The wall clock the service injects into the core (which never reads one)."""

from __future__ import annotations

import time


class SystemClock:
    """Milliseconds since the epoch: fronts label items with the same clock, so a
    min time (in slots) can be compared with it to show lag."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000
