"""When a tracker's state task wakes with no request: its ticks.

Requests step the tracker when they come; a tick steps it when none come, for the work
that time alone makes due. In a central tracker that work is coarse: retiring
declared fronts, finding dead fronts (timeouts of seconds), looking for stuck windows
(every tenth of ``stuck_after_ms``, at least 100 ms), metrics each second. It ticks
every :data:`CENTRAL_TICK_MS`, and sooner when a ``MinTimeAt`` question's time comes
first: a window's hold and a receive stamp ask about "now", and must not wait a tick
for their answer. A coordinator releases min times on its ticks, a shard reports to
it and a group's leader renews its lease: they tick every :data:`FAST_TICK_MS`.

Each wake-up costs CPU beyond the work it does, more on a VM whose idle cores sleep:
on the 2-core VM the 250 ms tick saves an embedded tracker's thread about 5 ms of CPU
a second (docs/operating.md, "Ticks").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from lowtide.core.time import Clock

FAST_TICK_MS = 50
CENTRAL_TICK_MS = 250


class Ticker:
    """Calls ``tick`` every ``every_ms``, and at the time :meth:`expect` names when that
    comes first (:meth:`run` is the task)."""

    def __init__(self, every_ms: int, clock: Clock) -> None:
        self.every_ms = every_ms
        self._clock = clock
        self._wake_ms: int | None = None  # when the next tick comes
        self._due_ms: int | None = None  # an earlier time asked for
        self._replan = asyncio.Event()

    def expect(self, due_ms: int | None) -> None:
        """Tick at ``due_ms`` (server clock) if the next tick comes later; None: no
        such time is waiting."""
        self._due_ms = due_ms
        if due_ms is not None and self._wake_ms is not None and due_ms < self._wake_ms:
            self._replan.set()

    def _next_wake_ms(self, now_ms: int) -> int:
        wake = now_ms + self.every_ms
        return wake if self._due_ms is None else min(wake, max(self._due_ms, now_ms + 1))

    async def run(self, tick: Callable[[], Awaitable[None]]) -> None:
        while True:
            now = self._clock.now_ms()
            self._wake_ms = self._next_wake_ms(now)
            self._replan.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._replan.wait(), (self._wake_ms - now) / 1000)
                continue  # an earlier time came in: plan again
            # the tick's group names the next time (expect), even one that comes
            # while tick() waits for room in the inbox
            self._due_ms = None
            await tick()
