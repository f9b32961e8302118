"""Fronts and their heartbeats: the bound of each source segment.

A source segment's bound is the minimum heartbeat over its live fronts. When its last
front unregisters, the bound stays at the latest heartbeat any of them reached: the
fronts are done up to there, and a new front may still join at or after it.

A front has an owner (an opaque id: the registering session, or an id its successors
can prove): only the owner may move it (re-register, heartbeat) or unregister it.
Anyone else would let the bound pass items the owner still has in flight, so they are
refused (:class:`FrontOwned`). A Spark task that heartbeats a front on the channel of
its acks (rule 3) proves the same owner id as the driver that registered it. Within an
owner, one session at a time holds the front (:mod:`lowtide.core.holders`): a second
live producer with the same owner is refused too.

Declared fronts. A front that may still produce but has not registered yet (a producer
that starts late) is *declared* with the time it may start at: it holds its segment's
bound there, like a live front that has not moved, until it registers (by whoever
becomes its owner) or is retired, explicitly by the declaring owner or when its
``retire_at_ms`` passes. A declaration never undercuts what the segment announced, and
declaring a front that is live, declared or done already changes nothing.

Its time may be :data:`AT_START`: where its segment starts. The checksum table only
spans a window of times above the segment's head, so a front held at 0 would refuse
every real ack; instead it holds where the segment's fronts are when it is declared,
or, declared before any of them registered, at the first one's registration (a late
producer's records from the start on are waited for; older ones are behind).

>>> fronts = FrontTable(n_segments=1)
>>> fronts.register(1, 0, 100, floor=0); fronts.register(2, 0, 90, floor=0)
>>> fronts.bound(0)
90
>>> fronts.heartbeat(2, 120); fronts.bound(0)
100
>>> fronts.declare(3, 0, 95, floor=0); fronts.bound(0)   # a late producer, held for
95
>>> fronts.register(3, 0, 130, floor=0); fronts.bound(0)
100
>>> fronts.unregister(1); fronts.unregister(2); fronts.unregister(3); fronts.bound(0)
130
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from lowtide.core.errors import (
    FrontBehind,
    FrontOwned,
    NonMonotonicHeartbeat,
    ProtocolError,
    UnknownFront,
)
from lowtide.core.holders import HolderRow, Holders
from lowtide.core.time import TIME_LIMIT

#: ``retire_at_ms`` of a declared front that waits until it registers or is retired
NEVER = -1
#: the ``time`` of a declared front that holds where its segment starts
AT_START = -1


def check_time(time: int, what: str) -> None:
    if not 0 <= time < TIME_LIMIT:
        raise ProtocolError(f"{what} time {time} is outside [0, 2**62)")


@dataclass(frozen=True)
class Declared:
    """A front that may still produce: it holds ``segment`` at ``time``."""

    front: int
    segment: int
    time: int  # AT_START: not yet known (no front of the segment registered yet)
    owner: int  # the declaring owner: it alone may retire the front by hand
    retire_at_ms: int = NEVER


FrontRow = tuple[int, int, int, int]  # (front, segment, time, owner)
SeenRow = tuple[int, int, bool]  # (front, last seen ms, seen last by a keyed batch)
DeadRow = tuple[int, int, int]  # (front, segment, owner) of a front retired as dead


@dataclass(frozen=True)
class Silent:
    """A live front not seen (registered, heartbeated) since ``seen_ms``; ``by_batch``:
    its last heartbeat came in a keyed batch (a Spark task moves it, not a producer)."""

    front: int
    segment: int
    time: int
    seen_ms: int
    by_batch: bool


class FrontTable:
    """Fronts per source segment; ``lease_ms``: how long a silent holder keeps its
    front from another session of its owner (:class:`~lowtide.core.holders.Holders`).
    ``session``/``now_ms`` name who moves a front and when (0: the core's own callers,
    one session); a heartbeat's ``session`` None is a keyed batch's (not bound to it)."""

    def __init__(self, n_segments: int, lease_ms: int = 0) -> None:
        self.holders = Holders(lease_ms)
        self._segment_of: dict[int, int] = {}
        self._time: dict[int, int] = {}
        self._owner: dict[int, int] = {}
        self._live: list[set[int]] = [set() for _ in range(n_segments)]
        self._done_bound = [0] * n_segments
        self._declared: dict[int, Declared] = {}
        self._done: set[int] = set()  # unregistered or retired: a declaration is moot
        self._seen: dict[int, tuple[int, bool]] = {}  # live front -> (ms, by a keyed batch)
        self._dead: dict[int, tuple[int, int]] = {}  # retired as dead -> (segment, owner)
        #: counts every change of a bound's inputs (MinTimes steps only after one)
        self.version = 0

    def __len__(self) -> int:
        return len(self._time)

    def register(self, front: int, segment: int, time: int, floor: int, owner: int = 0,
                 session: int = 0, now_ms: int = 0) -> None:
        """Start (or resume) a front at ``time``; ``floor`` is what its segment already
        announced, which a new front may not undercut. Its owner re-registering it on
        the same segment acts as a heartbeat, so a restarted source can say hello again
        (once the session holding it is silent). A declared front is claimed by the
        first owner that registers it."""
        check_time(time, "register")
        if front in self._time:
            if self._segment_of[front] != segment:
                raise ProtocolError(f"front {front} is already registered on another segment")
            self.check_heartbeat(front, time, owner, what="register")
            self.holders.claim(front, session, now_ms)
            self._time[front] = time
            self.version += 1
            self.touch(front, now_ms)
            return
        declared = self._declared.get(front)
        if declared is not None and declared.segment != segment:
            raise ProtocolError(f"front {front} is declared on another segment")
        if time < floor:
            raise FrontBehind(
                f"front {front} registers at {time}, below its segment's min time {floor}: "
                "the segment moved on before this front registered (declare every front "
                "that may still produce with the pipeline, or start it at or after "
                f"{floor})"
            )
        self._declared.pop(front, None)
        self._done.discard(front)
        self._dead.pop(front, None)
        self._segment_of[front] = segment
        self._time[front] = time
        self._owner[front] = owner
        self._live[segment].add(front)
        self.version += 1
        self.holders.claim(front, session, now_ms)
        self.touch(front, now_ms)
        for d in list(self._declared.values()):  # the segment's start is known now
            if d.segment == segment and d.time == AT_START:
                self._declared[d.front] = replace(d, time=time)

    def declare(
        self, front: int, segment: int, time: int, floor: int, owner: int = 0,
        retire_at_ms: int = NEVER,
    ) -> None:
        """``front`` may still produce into ``segment`` from ``time`` (or
        :data:`AT_START`) on: hold the bound there (at ``floor`` if the segment
        announced more) until it registers or is retired. A front that is live,
        declared or done already is left as it is."""
        if time != AT_START:
            check_time(time, "declare")
        if front in self._time or front in self._declared or front in self._done:
            return
        if time == AT_START and self._live[segment]:
            time = self.bound(segment)  # where the segment's fronts are now
        hold = time if time == AT_START else max(time, floor)
        self._declared[front] = Declared(front, segment, hold, owner, retire_at_ms)
        self.version += 1

    def retire(self, front: int, owner: int = 0) -> None:
        """The declaring owner gives up on a declared front that never registered."""
        declared = self._declared.get(front)
        if declared is None:
            raise UnknownFront(f"retire of front {front}, which is not declared and waiting")
        if declared.owner != owner:
            raise FrontOwned(f"retire of front {front} refused: it was declared by another "
                             "owner")
        self._retire(front)

    def _retire(self, front: int) -> None:
        del self._declared[front]
        self._done.add(front)
        self.version += 1

    def expire(self, now_ms: int) -> list[Declared]:
        """Retire the declared fronts whose ``retire_at_ms`` has passed; returns them."""
        due = [d for d in self._declared.values() if d.retire_at_ms != NEVER
               and d.retire_at_ms <= now_ms]
        for d in due:
            self._retire(d.front)
        return due

    def _check_owner(self, front: int, owner: int, what: str) -> None:
        if self._owner[front] != owner:
            raise FrontOwned(
                f"{what} of front {front} refused: it belongs to another owner (the "
                "session that registered it, or a successor given the same owner name)"
            )

    def check_heartbeat(self, front: int, time: int, owner: int, last: int | None = None,
                        what: str = "heartbeat", session: int | None = None) -> None:
        """Raise what :meth:`heartbeat` would refuse; ``last``: the front's time so far
        (default: its current one)."""
        check_time(time, what)
        if front in self._dead:
            return
        if front not in self._time:
            known = "declared, not yet registered" if front in self._declared else "unregistered"
            raise UnknownFront(f"{what} from {known} front {front}")
        self._check_owner(front, owner, what)
        self.holders.check_beat(front, session)
        last = self._time[front] if last is None else last
        if time < last:
            raise NonMonotonicHeartbeat(f"front {front} went back from {last} to {time}")

    def heartbeat(self, front: int, time: int, owner: int = 0, session: int | None = None,
                  now_ms: int = 0) -> None:
        self.check_heartbeat(front, time, owner, session=session)
        if front in self._dead:
            return
        self._time[front] = time
        self.version += 1
        self.holders.seen(front, session, now_ms)
        self.touch(front, now_ms, by_batch=session is None)

    def unregister(self, front: int, owner: int = 0, session: int = 0, now_ms: int = 0) -> None:
        if front not in self._time:
            raise UnknownFront(f"unregister of unknown front {front}")
        self._check_owner(front, owner, "unregister")
        self.holders.check_claim(front, session, now_ms, "unregister")
        self._drop(front)

    def _drop(self, front: int) -> None:
        """Unregister ``front`` (its owner asked, or it was retired as dead)."""
        self.version += 1
        self.holders.drop(front)
        self._seen.pop(front, None)
        del self._owner[front]
        segment = self._segment_of.pop(front)
        time = self._time.pop(front)
        self._live[segment].discard(front)
        self._done.add(front)
        self._done_bound[segment] = max(self._done_bound[segment], time)

    def bound(self, segment: int) -> int:
        times = [self._time[f] for f in self._live[segment]]
        times += [d.time for d in self._declared.values()
                  if d.segment == segment and d.time != AT_START]
        return min(times) if times else self._done_bound[segment]

    def bound_of(self, segments: tuple[int, ...], feeds: Callable[[int], bool]) -> int:
        """:meth:`bound` over the fronts of ``segments`` (a cycle's) for which
        ``feeds(front)`` (those feeding one key range). When none of those is live or
        declared: over all of their fronts (a front that starts feeding it later may
        not start below what was announced), and when there are none, the latest
        heartbeat any front of ``segments`` reached."""
        live = [f for s in segments for f in self._live[s]]
        waiting = [d for d in self._declared.values()
                   if d.segment in segments and d.time != AT_START]
        times = [self._time[f] for f in live if feeds(f)]
        times += [d.time for d in waiting if feeds(d.front)]
        if not times:
            times = [self._time[f] for f in live] + [d.time for d in waiting]
        return min(times) if times else max(self._done_bound[s] for s in segments)

    def add_segments(self, starts: list[int]) -> None:
        """Segments attached (rule 16), each held at its start until a front of it
        registers or is declared (it registers at or above its start)."""
        self._live += [set() for _ in starts]
        self._done_bound += starts
        self.version += 1

    def detach(self, segment: int) -> None:
        """A detached segment's fronts stop bounding anything (rule 16)."""
        for front in list(self._live[segment]):
            self._drop(front)
        for front in [f for f, (s, _owner) in self._dead.items() if s == segment]:
            del self._dead[front]  # its late heartbeat must not rejoin a detached segment
        for d in [d for d in self._declared.values() if d.segment == segment]:
            self._retire(d.front)

    def time_of(self, front: int) -> int | None:
        return self._time.get(front)

    def export(self) -> tuple[tuple[FrontRow, ...], tuple[int, ...]]:
        """((front, segment, time, owner), ...) of live fronts, and the done bounds."""
        live = tuple(
            (f, self._segment_of[f], t, self._owner[f]) for f, t in sorted(self._time.items())
        )
        return live, tuple(self._done_bound)

    def export_declared(self) -> tuple[tuple[Declared, ...], tuple[int, ...]]:
        """The declared fronts, and the fronts that are done (for snapshots)."""
        return tuple(sorted(self._declared.values(), key=lambda d: d.front)), tuple(
            sorted(self._done))

    def restore(
        self, live: tuple[FrontRow, ...], done: tuple[int, ...],
        declared: tuple[Declared, ...] = (), done_fronts: tuple[int, ...] = (),
        holders: tuple[HolderRow, ...] = (), seen: tuple[SeenRow, ...] = (),
        dead: tuple[DeadRow, ...] = (),
    ) -> None:
        self.holders.restore(holders)
        self._seen = {f: (t, bool(b)) for f, t, b in seen}
        self._dead = {f: (s, o) for f, s, o in dead}
        self._segment_of, self._time, self._owner = {}, {}, {}
        self._live = [set() for _ in done]
        self._done_bound = list(done)
        for front, segment, time, owner in live:
            self._segment_of[front], self._time[front] = segment, time
            self._owner[front] = owner
            self._live[segment].add(front)
        self._declared = {d.front: d for d in declared}
        self._done = set(done_fronts)
        self.version += 1

    def live(self) -> dict[int, tuple[int, int]]:
        """front -> (segment, latest heartbeat), for status views."""
        return {f: (self._segment_of[f], t) for f, t in self._time.items()}

    def declared(self) -> dict[int, Declared]:
        """Declared fronts still waiting to register, for status views."""
        return dict(self._declared)

    # --------------------------------------------------- silent fronts (rule 17)
    def touch(self, front: int, now_ms: int, by_batch: bool = False) -> None:
        """``front`` was seen at ``now_ms`` (it registered or heartbeated)."""
        if front in self._time:
            seen = self._seen.get(front, (now_ms, by_batch))[0]
            self._seen[front] = (max(seen, now_ms), by_batch)

    def silent(self, now_ms: int, timeout_ms: int) -> list[Silent]:
        """Live fronts not seen for ``timeout_ms`` or more. A front restored without a
        time (an older snapshot) counts as seen now: a restart never shortens a wait."""
        out = []
        for front in sorted(self._time):
            seen, by_batch = self._seen.setdefault(front, (now_ms, False))
            if now_ms - seen >= timeout_ms:
                out.append(Silent(front, self._segment_of[front], self._time[front], seen,
                                  by_batch))
        return out

    def retire_dead(self, front: int) -> None:
        """Unregister a silent front without its owner (the dead-front policy, rule
        17): its segment's bound no longer waits for it; the acks it sent stay in the
        checksums, so its items stay tracked. A later heartbeat of it is no error (a
        producer that was only slow must not fail the session it shares with others):
        see :meth:`retired_as_dead`."""
        self._dead[front] = (self._segment_of[front], self._owner[front])
        self._drop(front)

    def retired_as_dead(self, front: int) -> tuple[int, int] | None:
        """(segment, owner) of a front retired as dead, else None. Its owner's heartbeat
        at or above the segment's min time rejoins it (as a registration would); below
        it, the heartbeat changes nothing."""
        return self._dead.get(front)

    def export_seen(self) -> tuple[tuple[SeenRow, ...], tuple[DeadRow, ...]]:
        """When each live front was last seen, and the fronts retired as dead."""
        return tuple((f, t, b) for f, (t, b) in sorted(self._seen.items())), tuple(
            (f, s, o) for f, (s, o) in sorted(self._dead.items()))
