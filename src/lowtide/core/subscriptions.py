"""Who wants which min time updates; a late subscriber first gets the current one.

>>> subs = Subscriptions()
>>> subs.subscribe(1, "sink", current=MinTimeUpdate("sink", 40))
MinTimeUpdate(segment='sink', time=40)
>>> subs.subscribe(2, None, current=MinTimeUpdate(None, 30))
MinTimeUpdate(segment=None, time=30)
>>> subs.route([MinTimeUpdate("sink", 50), MinTimeUpdate("parse", 60)])
[(1, MinTimeUpdate(segment='sink', time=50))]
"""

from __future__ import annotations

from collections.abc import Iterable

from lowtide.core.messages import MinTimeUpdate


class Subscriptions:
    def __init__(self) -> None:
        self._by_segment: dict[str | None, set[int]] = {}

    def subscribe(
        self, subscriber: int, segment: str | None, current: MinTimeUpdate
    ) -> MinTimeUpdate:
        """Register and return the update to deliver first (the current min time)."""
        self._by_segment.setdefault(segment, set()).add(subscriber)
        return current

    def unsubscribe(
        self, subscriber: int, segment: str | None = None, *, everywhere: bool = False
    ) -> None:
        targets = list(self._by_segment) if everywhere else [segment]
        for seg in targets:
            self._by_segment.get(seg, set()).discard(subscriber)

    def route(self, updates: Iterable[MinTimeUpdate]) -> list[tuple[int, MinTimeUpdate]]:
        """(subscriber, update) pairs, in update order then subscriber id."""
        out: list[tuple[int, MinTimeUpdate]] = []
        for u in updates:
            out.extend((sub, u) for sub in sorted(self._by_segment.get(u.segment, ())))
        return out

    def __len__(self) -> int:
        return sum(len(s) for s in self._by_segment.values())
