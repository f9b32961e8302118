"""Which keyed batches each query has open: what could still deliver a stuck window.

A window whose bound has passed while its XOR is not zero is either lost or still on
its way: a micro-batch that reads it may simply be slow. The queries' drivers say when
a batch opens and closes (and repeat an open one now and then, so a driver that died is
forgotten after ``forget_ms``); the stuck detector
(:class:`~lowtide.core.diagnostics.StuckDetector`) asks this table, per window, whether
something that could still deliver it is outstanding.

What could deliver a window is fixed when the window becomes overdue (its bound passed):
for every query that acks into the segment, the batch it had open then, or, idle, the
batch it runs next, and the batch after it (a batch that was planned before the items
were written reads them in the next one). While one of those is open, the window is
*waiting* ("waiting for query Q batch N, running 40 s"), never missing; once they have
closed, its stuck clock starts from the last close. A batch that opened later cannot
extend it, so a query that keeps running batches still has its real losses reported.

>>> batches = QueryBatches(forget_ms=30_000)
>>> batches.open("q", 7, ("ingest", "sink"), now_ms=1_000)
>>> limits = batches.limits("sink")          # the window became overdue during batch 7
>>> limits
{'q': 8}
>>> batches.holding("sink", limits, now_ms=41_000)
Waiting(query='q', batch=7, running_ms=40000)
>>> batches.close("q", 7, now_ms=41_000); batches.open("q", 8, ("ingest", "sink"), 41_050)
>>> batches.holding("sink", limits, 45_000).batch  # the next batch may still read it
8
>>> batches.close("q", 8, 50_000); batches.open("q", 9, ("ingest", "sink"), 50_050)
>>> batches.holding("sink", limits, 55_000), batches.released_ms("sink", limits)
(None, 50000)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

#: how many closed batches a query keeps (their close times start stuck clocks)
KEEP_CLOSED = 8


@dataclass(frozen=True)
class Waiting:
    """A window is waiting for ``query``'s ``batch``, open for ``running_ms``."""

    query: str
    batch: int
    running_ms: int

    def describe(self) -> str:
        return (f"waiting for query {self.query} batch {self.batch}, running "
                f"{self.running_ms / 1000:.0f} s")


@dataclass
class _Query:
    segments: frozenset[str]
    seen_ms: int
    opened: dict[int, int] = field(default_factory=dict)  # batch -> opened at
    closed: dict[int, int] = field(default_factory=dict)  # batch -> closed at

    def next_batch(self) -> int:
        """The batch that reads what was written now: the open one's successor (the
        open one may have planned its input already), or the one after the last."""
        if self.opened:
            return max(self.opened) + 1
        return max(self.closed, default=-1) + 1


class QueryBatches:
    """Open and recently closed batches per query, in tracker time."""

    def __init__(self, forget_ms: int = 30_000) -> None:
        self.forget_ms = forget_ms
        self._queries: dict[str, _Query] = {}

    def open(self, query: str, batch: int, segments: Iterable[str], now_ms: int) -> None:
        """``query`` runs ``batch``; its tasks ack into ``segments``. Said again while
        it runs (a keep-alive: the first time counts)."""
        q = self._query(query, segments, now_ms)
        q.closed.pop(batch, None)  # closed before it ran (a driver polling saw it idle)
        q.opened.setdefault(batch, now_ms)

    def close(self, query: str, batch: int, now_ms: int, segments: Iterable[str] = ()) -> None:
        q = self._query(query, segments, now_ms)
        q.opened.pop(batch, None)
        q.closed.setdefault(batch, now_ms)
        for old in sorted(q.closed)[:-KEEP_CLOSED]:
            del q.closed[old]
        for older in [b for b in q.opened if b < batch]:  # a close we missed
            del q.opened[older]

    def stopped(self, query: str) -> None:
        """The query stopped: nothing of it is outstanding any more."""
        self._queries.pop(query, None)

    def expire(self, now_ms: int) -> None:
        """Forget queries whose driver has said nothing for ``forget_ms``."""
        for name in [n for n, q in self._queries.items() if now_ms - q.seen_ms > self.forget_ms]:
            del self._queries[name]

    def limits(self, segment: str) -> dict[str, int]:
        """Per query acking into ``segment``, the last batch that may still deliver a
        window of it that is overdue now."""
        return {n: q.next_batch() for n, q in self._queries.items() if segment in q.segments}

    def busy(self, segment: str) -> bool:
        """A batch of a query acking into ``segment`` is open."""
        return any(q.opened for q in self._queries.values() if segment in q.segments)

    def holding(self, segment: str, limits: dict[str, int], now_ms: int) -> Waiting | None:
        """The longest-running open batch within ``limits`` (None: nothing outstanding)."""
        best: Waiting | None = None
        for name, limit in sorted(limits.items()):
            q = self._queries.get(name)
            if q is None or segment not in q.segments:
                continue
            for batch, since in q.opened.items():
                if batch <= limit and (best is None or now_ms - since > best.running_ms):
                    best = Waiting(name, batch, now_ms - since)
        return best

    def released_ms(self, segment: str, limits: dict[str, int]) -> int:
        """When the last batch within ``limits`` closed (0: none did)."""
        times = [at for name, limit in limits.items() if (q := self._queries.get(name))
                 for batch, at in q.closed.items() if batch <= limit]
        return max(times, default=0)

    def export(self, now_ms: int) -> list[dict[str, object]]:
        """The open batches, for status views."""
        return [{"query": n, "batch": b, "running_ms": now_ms - t, "segments": sorted(q.segments)}
                for n, q in sorted(self._queries.items()) for b, t in sorted(q.opened.items())]

    def _query(self, name: str, segments: Iterable[str], now_ms: int) -> _Query:
        q = self._queries.get(name)
        if q is None:
            q = self._queries[name] = _Query(frozenset(segments), now_ms)
        q.segments |= frozenset(segments)
        q.seen_ms = max(q.seen_ms, now_ms)
        return q
