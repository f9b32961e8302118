"""Dead fronts: a live front silent past ``front_timeout``, and what the tracker does.

A front that stops heartbeating (its producer died without unregistering) holds its
segment's bound where it stopped: every min time downstream waits for it. The policy
says what then (rule 17):

* ``wait`` (the default): keep waiting, and say so: the front is listed as dead since
  it was last seen, with the slot it holds its segment at.
* ``retire``: unregister it, so the segment's bound is the minimum over the other
  fronts. Nothing it sent is forgotten: its acks are in the checksums, so its items
  still in flight hold the min times until they are received (or are reported
  missing); the retirement names those windows.

A front that a query's running batch may still heartbeat (its last heartbeat came in
a keyed batch, and a batch acking into its segment is open) is not silent: a slow batch
does not kill its source.

>>> from lowtide.core.fronts import FrontTable
>>> fronts = FrontTable(n_segments=1)
>>> fronts.register(1, 0, 100, floor=0, now_ms=0); fronts.register(2, 0, 90, floor=0)
>>> fronts.heartbeat(1, 130, now_ms=9_000)             # front 2 said nothing since 0
>>> policy = DeadFronts(FrontTimeout(timeout_ms=5_000, policy=RETIRE))
>>> [d.describe(("ingest",)) for d in policy.check(fronts, 9_000)]
["front 2 retired at 9.0 s: silent since 0.0 s on 'ingest', its heartbeat at slot 90"]
>>> fronts.bound(0)                                   # the rest progresses
130
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from lowtide.core.errors import LowtideError
from lowtide.core.fronts import FrontTable, Silent

WAIT = "wait"
RETIRE = "retire"
POLICIES = (WAIT, RETIRE)

#: (window start, window end, count) of a segment's open windows
InFlight = tuple[tuple[int, int, int], ...]


class BadFrontTimeout(LowtideError, ValueError):
    """A front timeout or dead-front policy that makes no sense."""


@dataclass(frozen=True)
class FrontTimeout:
    """A live front silent for ``timeout_ms`` is dead; ``policy``: ``wait`` or ``retire``."""

    timeout_ms: int
    policy: str = WAIT

    def __post_init__(self) -> None:
        if self.timeout_ms <= 0:
            raise BadFrontTimeout(f"front_timeout must be > 0 ms, got {self.timeout_ms}")
        if self.policy not in POLICIES:
            raise BadFrontTimeout(f"dead_fronts={self.policy!r}: use 'wait' or 'retire'")


def seconds(ms: int) -> str:
    return f"{ms / 1000:.1f} s"


@dataclass(frozen=True)
class DeadFront:
    """``front`` of ``segment`` (an index), silent since ``silent_since_ms`` at slot
    ``time``; ``retired_ms``: when the policy retired it (None: waited for), with the
    windows of its segment still open then (``in_flight``: its items among them)."""

    front: int
    segment: int
    time: int
    silent_since_ms: int
    policy: str
    retired_ms: int | None = None
    in_flight: InFlight = field(default=())

    def describe(self, names: tuple[str, ...], when: Callable[[int], str] = seconds) -> str:
        """One line; ``when`` shows a tracker time (Unix ms in a service: UTC)."""
        where = (f"silent since {when(self.silent_since_ms)} on "
                 f"{names[self.segment]!r}, its heartbeat at slot {self.time}")
        if self.retired_ms is None:
            return f"front {self.front} dead, waited for: {where}"
        text = f"front {self.front} retired at {when(self.retired_ms)}: {where}"
        if self.in_flight:
            n = sum(c for _s, _e, c in self.in_flight)
            spans = ", ".join(f"[{s}, {e})" for s, e, _c in self.in_flight[:4])
            text += (f"; still tracked in flight there: {n} item(s) in slots {spans}"
                     f"{' ...' if len(self.in_flight) > 4 else ''}")
        return text


class DeadFronts:
    """Applies a :class:`FrontTimeout` to a :class:`FrontTable` at each step."""

    def __init__(self, timeout: FrontTimeout | None) -> None:
        self.timeout = timeout
        self._waited: dict[int, DeadFront] = {}

    def check(self, fronts: FrontTable, now_ms: int,
              busy: Callable[[int], bool] = lambda _s: False,
              in_flight: Callable[[int], InFlight] = lambda _s: ()) -> list[DeadFront]:
        """Fronts that died since the last check (retired ones are gone from
        ``fronts``). ``busy(segment)``: a batch acking into it is open, which keeps a
        front moved by keyed batches alive; ``in_flight(segment)``: its open windows."""
        if self.timeout is None:
            return []
        for s in fronts.silent(now_ms, 0):  # every live front: those a batch may move
            if s.by_batch and busy(s.segment):
                fronts.touch(s.front, now_ms, by_batch=True)
        silent = {s.front: s for s in fronts.silent(now_ms, self.timeout.timeout_ms)}
        for front in [f for f in self._waited if f not in silent]:
            del self._waited[front]  # it came back (or was unregistered)
        fresh = [self._dead(s) for s in silent.values() if s.front not in self._waited]
        if self.timeout.policy == WAIT:
            self._waited.update((d.front, d) for d in fresh)
            return fresh
        for d in fresh:
            fronts.retire_dead(d.front)
        return [replace(d, retired_ms=now_ms, in_flight=in_flight(d.segment)) for d in fresh]

    def waited(self) -> list[DeadFront]:
        """Dead fronts the ``wait`` policy is waiting for."""
        return sorted(self._waited.values(), key=lambda d: d.front)

    def _dead(self, s: Silent) -> DeadFront:
        assert self.timeout is not None
        return DeadFront(s.front, s.segment, s.time, s.seen_ms, self.timeout.policy)
