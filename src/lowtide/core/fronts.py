"""Fronts and their heartbeats: the bound of each source segment.

A source segment's bound is the minimum heartbeat over its live fronts. When its last
front unregisters, the bound stays at the latest heartbeat any of them reached: the
fronts are done up to there, and a new front may still join at or after it.

A front has an owner (an opaque id: the registering session, or an id its successors
can prove): only the owner may re-register (move) or unregister it. Anyone else would
let the bound pass items the owner still has in flight, so they are refused
(:class:`FrontOwned`); heartbeats stay open to every sender (rule 3: they travel on
the channel that carried the acks they cover, often not the owner's).

>>> fronts = FrontTable(n_segments=1)
>>> fronts.register(1, 0, 100, floor=0); fronts.register(2, 0, 90, floor=0)
>>> fronts.bound(0)
90
>>> fronts.heartbeat(2, 120); fronts.bound(0)
100
>>> fronts.unregister(1); fronts.unregister(2); fronts.bound(0)
120
"""

from __future__ import annotations

from lowtide.core.errors import FrontOwned, NonMonotonicHeartbeat, ProtocolError, UnknownFront
from lowtide.core.time import TIME_LIMIT


def check_time(time: int, what: str) -> None:
    if not 0 <= time < TIME_LIMIT:
        raise ProtocolError(f"{what} time {time} is outside [0, 2**62)")


class FrontTable:
    def __init__(self, n_segments: int) -> None:
        self._segment_of: dict[int, int] = {}
        self._time: dict[int, int] = {}
        self._owner: dict[int, int] = {}
        self._live: list[set[int]] = [set() for _ in range(n_segments)]
        self._done_bound = [0] * n_segments

    def __len__(self) -> int:
        return len(self._time)

    def register(self, front: int, segment: int, time: int, floor: int, owner: int = 0) -> None:
        """Start (or resume) a front at ``time``; ``floor`` is what its segment already
        announced, which a new front may not undercut. Its owner re-registering it on
        the same segment acts as a heartbeat, so a restarted source can say hello again."""
        check_time(time, "register")
        if front in self._time:
            self._check_owner(front, owner, "register")
            if self._segment_of[front] != segment:
                raise ProtocolError(f"front {front} is already registered on another segment")
            self.heartbeat(front, time)
            return
        if time < floor:
            raise ProtocolError(
                f"front {front} registers at {time}, below its segment's min time {floor}"
            )
        self._segment_of[front] = segment
        self._time[front] = time
        self._owner[front] = owner
        self._live[segment].add(front)

    def _check_owner(self, front: int, owner: int, what: str) -> None:
        if self._owner[front] != owner:
            raise FrontOwned(
                f"{what} of front {front} refused: it belongs to another owner (the "
                "session that registered it, or a successor given the same owner name)"
            )

    def heartbeat(self, front: int, time: int) -> None:
        check_time(time, "heartbeat")
        last = self._time.get(front)
        if last is None:
            raise UnknownFront(f"heartbeat from unregistered front {front}")
        if time < last:
            raise NonMonotonicHeartbeat(f"front {front} went back from {last} to {time}")
        self._time[front] = time

    def unregister(self, front: int, owner: int = 0) -> None:
        if front not in self._time:
            raise UnknownFront(f"unregister of unknown front {front}")
        self._check_owner(front, owner, "unregister")
        del self._owner[front]
        segment = self._segment_of.pop(front)
        time = self._time.pop(front)
        self._live[segment].discard(front)
        self._done_bound[segment] = max(self._done_bound[segment], time)

    def bound(self, segment: int) -> int:
        live = self._live[segment]
        if not live:
            return self._done_bound[segment]
        return min(self._time[f] for f in live)

    def time_of(self, front: int) -> int | None:
        return self._time.get(front)

    def export(self) -> tuple[tuple[tuple[int, int, int, int], ...], tuple[int, ...]]:
        """((front, segment, time, owner), ...) of live fronts, and the done bounds."""
        live = tuple(
            (f, self._segment_of[f], t, self._owner[f]) for f, t in sorted(self._time.items())
        )
        return live, tuple(self._done_bound)

    def restore(
        self, live: tuple[tuple[int, int, int, int], ...], done: tuple[int, ...]
    ) -> None:
        self._segment_of, self._time, self._owner = {}, {}, {}
        self._live = [set() for _ in done]
        self._done_bound = list(done)
        for front, segment, time, owner in live:
            self._segment_of[front], self._time[front] = segment, time
            self._owner[front] = owner
            self._live[segment].add(front)

    def live(self) -> dict[int, tuple[int, int]]:
        """front -> (segment, latest heartbeat), for status views."""
        return {f: (self._segment_of[f], t) for f, t in self._time.items()}
