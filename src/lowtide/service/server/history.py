"""Recent history of min times, so a question about the past has one final answer.

A Spark task that decides "is this window complete?" must decide the same way in every
attempt (rule 5). The live min time moves between attempts; the min time *at a given
wall time* does not, once that time has passed. The server records, per segment (None:
global), each change of the min time with the server's clock, for ``retention_ms``
(default 10 minutes), and answers ``MinTimeAt(segment, at_ms)`` only when its clock is
past ``at_ms``: the answer is then final.

>>> from lowtide.core.messages import MinTimeUpdate
>>> h = MinTimeHistory(retention_ms=1_000)
>>> h.seed(100, {"a": 0})
>>> h.observe(150, [MinTimeUpdate("a", 7)]); h.observe(300, [MinTimeUpdate("a", 9)])
>>> [h.at("a", t) for t in (99, 100, 149, 150, 299, 300, 5_000)]
[0, 0, 0, 7, 7, 9, 9]

Older than the retained history (or before the server started) the answer is 0,
"nothing known complete": safe, never premature. History lives in memory only: a
restarted tracker answers 0 for times before its restart, so a Spark task retried
across a tracker restart may decide differently from its first attempt (a window the
first attempt emitted is then emitted by a later batch instead of by the retry).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Iterable
from typing import Generic, TypeVar

from lowtide.core.messages import MinTimeUpdate
from lowtide.wire.messages import LATEST_MS, MinTimeAt, MinTimeAtReply

A = TypeVar("A")


class MinTimeHistory:
    def __init__(self, retention_ms: int = 600_000) -> None:
        self.retention_ms = retention_ms
        self._ms: dict[str | None, list[int]] = {}
        self._val: dict[str | None, list[int]] = {}

    def seed(self, now_ms: int, current: dict[str | None, int]) -> None:
        for seg, t in current.items():
            self._record(seg, now_ms, t)

    def observe(self, now_ms: int, updates: Iterable[MinTimeUpdate]) -> None:
        for u in updates:
            self._record(u.segment, now_ms, u.time)

    def _record(self, seg: str | None, now_ms: int, t: int) -> None:
        ms, val = self._ms.setdefault(seg, []), self._val.setdefault(seg, [])
        if val and val[-1] == t:
            return
        if ms and ms[-1] == now_ms:
            val[-1] = t
            return
        ms.append(now_ms)
        val.append(t)
        if len(ms) > 64 and ms[32] < now_ms - self.retention_ms:
            cut = bisect.bisect_left(ms, now_ms - self.retention_ms) - 1
            if cut > 0:
                del ms[:cut], val[:cut]

    def at(self, seg: str | None, at_ms: int) -> int:
        """The min time of ``seg`` as it was at the server's wall time ``at_ms``."""
        ms = self._ms.get(seg)
        if not ms:
            return 0
        i = bisect.bisect_right(ms, at_ms) - 1
        return self._val[seg][i] if i >= 0 else 0


class MinTimeQuestions(Generic[A]):
    """``MinTimeAt`` questions waiting for the server's clock to pass their time, in a
    heap by that time: a step answers what is due without looking at the rest (a
    flood of questions about the far future costs nothing per step).

    >>> q = MinTimeQuestions[str]()
    >>> q.ask("a", MinTimeAt(1, None, 200)); q.ask("b", MinTimeAt(2, None, 100))
    >>> q.ask("a", MinTimeAt(3, None, 900))
    >>> q.next_due_ms()
    101
    >>> [(who, r.req) for who, r in q.answer(201, MinTimeHistory())], q.forget("a"), len(q)
    ([('b', 2), ('a', 1)], 1, 0)

    A question about the latest min time is due at once, and answered with what the
    step at ``now_ms`` recorded:

    >>> h = MinTimeHistory(); h.seed(100, {"s": 3}); h.observe(150, [MinTimeUpdate("s", 8)])
    >>> q.ask("c", MinTimeAt(4, "s", LATEST_MS)); q.next_due_ms()
    0
    >>> [(who, r.req, r.time) for who, r in q.answer(150, h)]
    [('c', 4, 8)]
    """

    def __init__(self) -> None:
        self._waiting: list[tuple[int, int, A, MinTimeAt]] = []  # (at_ms, order, ...)
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._waiting)

    def next_due_ms(self) -> int | None:
        """The clock at which the earliest question is answered (None: none waits)."""
        return self._waiting[0][0] + 1 if self._waiting else None

    def ask(self, asker: A, question: MinTimeAt) -> None:
        heapq.heappush(self._waiting, (question.at_ms, next(self._order), asker, question))

    def answer(self, now_ms: int, history: MinTimeHistory) -> list[tuple[A, MinTimeAtReply]]:
        """Final answers to the questions whose time has passed (call after the step
        recorded at ``now_ms``), earliest first."""
        out = []
        waiting = self._waiting
        while waiting and waiting[0][0] < now_ms:
            _at, _order, asker, q = heapq.heappop(waiting)
            at_ms = now_ms if q.at_ms == LATEST_MS else q.at_ms  # the step just recorded
            out.append((asker, MinTimeAtReply(q.req, history.at(q.segment, at_ms))))
        return out

    def forget(self, asker: A) -> int:
        """Drop the questions of an asker that is gone; returns how many."""
        kept = [entry for entry in self._waiting if entry[2] != asker]
        dropped = len(self._waiting) - len(kept)
        if dropped:
            heapq.heapify(kept)
            self._waiting = kept
        return dropped
