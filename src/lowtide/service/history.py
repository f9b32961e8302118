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
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from lowtide.core.messages import MinTimeUpdate
from lowtide.wire.messages import MinTimeAt, MinTimeAtReply

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
    """``MinTimeAt`` questions waiting for the server's clock to pass their time."""

    def __init__(self) -> None:
        self._waiting: list[tuple[A, MinTimeAt]] = []

    def ask(self, asker: A, question: MinTimeAt) -> None:
        self._waiting.append((asker, question))

    def answer(self, now_ms: int, history: MinTimeHistory,
               alive: Callable[[A], bool]) -> list[tuple[A, MinTimeAtReply]]:
        """Final answers to the questions whose time has passed (call after the step
        recorded at ``now_ms``); questions of askers no longer alive are dropped."""
        if not self._waiting:
            return []
        out, waiting = [], []
        for asker, q in self._waiting:
            if now_ms > q.at_ms:
                out.append((asker, MinTimeAtReply(q.req, history.at(q.segment, q.at_ms))))
            elif alive(asker):
                waiting.append((asker, q))
        self._waiting = waiting
        return out
