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
>>> limits = batches.limits("sink")  # overdue during batch 7: it, or the next, delivers
>>> limits                           # (in the order the driver reported its batches)
{'q': 1}
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

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

#: how many closed batches a query keeps (their close times start stuck clocks)
KEEP_CLOSED = 8
#: the batch id of a query announced before it starts (its first id not yet known)
STARTING = -1


@dataclass(frozen=True)
class Waiting:
    """A window is waiting for ``query``'s ``batch``, open for ``running_ms``."""

    query: str
    batch: int
    running_ms: int

    def describe(self) -> str:
        what = "starting" if self.batch == STARTING else f"batch {self.batch}"
        return (f"waiting for query {self.query} {what}, running "
                f"{self.running_ms / 1000:.0f} s")


@dataclass
class _Query:
    """Batches in the order the driver reported them: ``seq`` numbers them, so a query
    restarted from its checkpoint (ids jump) or announced before it knew its first id
    (:data:`STARTING`) still has "the next batch"."""

    segments: frozenset[str]
    seen_ms: int
    seq: int = 0  # the next batch's place in the order
    opened: dict[int, tuple[int, int]] = field(default_factory=dict)  # batch -> (seq, at)
    closed: dict[int, tuple[int, int]] = field(default_factory=dict)  # batch -> (seq, at)
    took_ms: deque[int] = field(default_factory=lambda: deque(maxlen=KEEP_CLOSED))

    def next_batch(self) -> int:
        """The place of the batch that reads what was written now: the open one's
        successor (the open one may have planned its input already), or the next."""
        if self.opened:
            return max(seq for seq, _at in self.opened.values()) + 1
        return self.seq

    def place(self) -> int:
        self.seq += 1
        return self.seq - 1


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
        if batch not in q.opened:
            q.opened[batch] = (q.place(), now_ms)

    def close(self, query: str, batch: int, now_ms: int, segments: Iterable[str] = ()) -> None:
        q = self._query(query, segments, now_ms)
        opened = q.opened.pop(batch, None)
        if opened is not None:
            q.took_ms.append(now_ms - opened[1])
        if batch not in q.closed:
            q.closed[batch] = (q.place() if opened is None else opened[0], now_ms)
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
        """Per query acking into ``segment``, the place of the last batch that may
        still deliver a window of it that is overdue now."""
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
            for batch, (seq, since) in q.opened.items():
                if seq <= limit and (best is None or now_ms - since > best.running_ms):
                    best = Waiting(name, batch, now_ms - since)
        return best

    def released_ms(self, segment: str, limits: dict[str, int]) -> int:
        """When the last batch within ``limits`` closed (0: none did)."""
        times = [at for name, limit in limits.items() if (q := self._queries.get(name))
                 for seq, at in q.closed.values() if seq <= limit]
        return max(times, default=0)

    def recent_ms(self) -> int:
        """How long the slowest query's recent batches took (mean), for ETAs."""
        return max((sum(q.took_ms) // len(q.took_ms) for q in self._queries.values()
                    if q.took_ms), default=0)

    def export(self, now_ms: int) -> list[dict[str, object]]:
        """The open batches, for status views."""
        return [{"query": n, "batch": b, "running_ms": now_ms - t, "segments": sorted(q.segments)}
                for n, q in sorted(self._queries.items())
                for b, (_s, t) in sorted(q.opened.items())]

    def _query(self, name: str, segments: Iterable[str], now_ms: int) -> _Query:
        q = self._queries.get(name)
        if q is None:
            q = self._queries[name] = _Query(frozenset(segments), now_ms)
        q.segments |= frozenset(segments)
        q.seen_ms = max(q.seen_ms, now_ms)
        return q
