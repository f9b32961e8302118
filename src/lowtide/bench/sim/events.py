"""Virtual time for the simulation: a heap of timed callbacks, and FIFO network links.

Time is an int of microseconds (``_us``); nothing here reads a clock. Ties run in the
order they were scheduled, so a run is a pure function of its inputs and its seed.

>>> loop, seen = EventLoop(), []
>>> loop.at(20, seen.append, "b"); loop.at(10, seen.append, "a"); loop.at(20, seen.append, "c")
>>> loop.run(); seen, loop.now_us, loop.events
(['a', 'b', 'c'], 20, 3)
>>> links = Links((100, 500), seed=1)
>>> first, second = links.arrival_us(0, 1, 0), links.arrival_us(0, 1, 0)
>>> 100 <= first <= second <= 500, links.arrival_us(2, 2, 7)
(True, 7)
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from typing import Any

Event = tuple[int, int, Callable[..., None], tuple[Any, ...]]


class EventLoop:
    """A discrete-event loop: ``at(time_us, fn, *args)`` runs ``fn(*args)`` at that time."""

    def __init__(self) -> None:
        self.now_us = 0
        self.events = 0
        self._heap: list[Event] = []
        self._seq = 0

    def at(self, time_us: int, fn: Callable[..., None], *args: Any) -> None:
        if time_us < self.now_us:
            raise ValueError(f"event at {time_us} us is in the past (now {self.now_us} us)")
        self._seq += 1
        heapq.heappush(self._heap, (time_us, self._seq, fn, args))

    def run(self) -> None:
        """Until nothing is scheduled any more."""
        heap, pop = self._heap, heapq.heappop
        while heap:
            time_us, _, fn, args = pop(heap)
            self.now_us = time_us
            self.events += 1
            fn(*args)


class Links:
    """Message latency: uniform in ``latency_us`` per message between distinct nodes,
    none within a node; FIFO per directed link, as on one TCP connection."""

    def __init__(self, latency_us: tuple[int, int], seed: int) -> None:
        self._low, self._high = latency_us
        self._rng = random.Random(seed)
        self._last: dict[tuple[int, int], int] = {}

    def arrival_us(self, src: int, dst: int, now_us: int) -> int:
        if src == dst:
            return now_us
        arrival = now_us + self._low + int(self._rng.random() * (self._high - self._low + 1))
        key = (src, dst)
        last = self._last.get(key, 0)
        if arrival < last:  # a message never overtakes an earlier one on its link
            arrival = last
        self._last[key] = arrival
        return arrival
