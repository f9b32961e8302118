"""Which session holds a live front: one live producer per front.

An owner name may be shared by a producer and its successor (a restarted process), so
the owner alone cannot tell a successor from a second producer misconfigured with the
same front id and owner: both would move the front, each past the other's items. The
holder can. The session that registered a front holds it; while the holder was seen
(it registered or heartbeated the front) within ``lease_ms`` of tracker time, another
session of the same owner is refused (:class:`FrontHeld`) when it registers or
unregisters the front: a live producer keeps its front, and a successor gets it once
its predecessor has been silent that long. A session's own heartbeats (fire and
forget, on the channel of its acks) come from the holder only; a keyed batch's
heartbeats (a Spark task heartbeating the front its driver registered) prove the
owner and are not bound to a session.

>>> holders = Holders(lease_ms=1_000)
>>> holders.claim(7, session=1, now_ms=0)
>>> holders.seen(7, session=1, now_ms=900)
>>> holders.claim(7, session=2, now_ms=1_500)   # doctest: +IGNORE_EXCEPTION_DETAIL
Traceback (most recent call last):
FrontHeld: ...
>>> holders.claim(7, session=2, now_ms=1_900); holders.holder(7)   # silent for 1 s
2
"""

from __future__ import annotations

from lowtide.core.errors import FrontHeld, FrontOwned

HolderRow = tuple[int, int, int]  # (front, session, seen_ms)


class Holders:
    def __init__(self, lease_ms: int) -> None:
        self.lease_ms = lease_ms
        self._session: dict[int, int] = {}
        self._seen: dict[int, int] = {}

    def holder(self, front: int) -> int | None:
        return self._session.get(front)

    def check_claim(self, front: int, session: int, now_ms: int, what: str) -> None:
        """Raise :class:`FrontHeld` if another session held ``front`` within the lease."""
        held = self._session.get(front)
        if held is None or held == session:
            return
        silent = now_ms - self._seen[front]
        if silent < self.lease_ms:
            raise FrontHeld(
                f"{what} of front {front} refused: another session of its owner (a live "
                f"producer) moved it {silent} ms ago. Two producers configured with one "
                "front id? A restarted producer gets it once its predecessor has been "
                f"silent for {self.lease_ms} ms: retry then")

    def claim(self, front: int, session: int, now_ms: int, what: str = "register") -> None:
        self.check_claim(front, session, now_ms, what)
        self._session[front], self._seen[front] = session, now_ms

    def check_beat(self, front: int, session: int | None) -> None:
        """A session's own heartbeats come from the front's holder (None: a keyed
        batch's, which prove the owner only)."""
        held = self._session.get(front)
        if session is not None and held is not None and session != held:
            raise FrontOwned(
                f"heartbeat of front {front} refused: another session of its owner has "
                "taken the front over (a successor, or a second producer with the same "
                "front id and owner): stop this producer")

    def seen(self, front: int, session: int | None, now_ms: int) -> None:
        if session is not None and self._session.get(front) == session:
            self._seen[front] = max(self._seen[front], now_ms)

    def drop(self, front: int) -> None:
        self._session.pop(front, None)
        self._seen.pop(front, None)

    def export(self) -> tuple[HolderRow, ...]:
        return tuple((f, s, self._seen[f]) for f, s in sorted(self._session.items()))

    def restore(self, rows: tuple[HolderRow, ...]) -> None:
        self._session = {f: s for f, s, _t in rows}
        self._seen = {f: t for f, _s, t in rows}
