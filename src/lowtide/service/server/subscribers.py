"""The server's subscribers: which peer's requests each subscription answers, and the
Notify frames a step's updates make for each peer.

A peer's subscriptions to one segment form one subscriber of the core's
:class:`~lowtide.core.subscriptions.Subscriptions`, so a step's routing costs one
entry per peer and segment, however many subscriptions a peer holds; its requests are
then listed in C (``zip``/``repeat``), and the Notify codec writes each run of one
update once (see :mod:`lowtide.wire.codec`).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable

from lowtide.core.messages import MinTimeUpdate
from lowtide.core.subscriptions import Subscriptions
from lowtide.service.server.inbox import Outbox, Peer
from lowtide.wire.messages import Notify


class Subscribers:
    def __init__(self) -> None:
        self._subs = Subscriptions()
        #: subscriber -> (peer, segment, its requests in order)
        self._groups: dict[int, tuple[Peer, str | None, dict[int, None]]] = {}
        self._group_of: dict[tuple[Peer, str | None], int] = {}
        self._ids = itertools.count(1)

    def subscribe(self, peer: Peer, req: int, segment: str | None,
                  current: MinTimeUpdate) -> Notify:
        """Register ``peer``'s request ``req`` (replacing one of the same number);
        returns the first update to send."""
        self.unsubscribe(peer, req)
        sub = self._group_of.get((peer, segment))
        if sub is None:
            sub = self._group_of[(peer, segment)] = next(self._ids)
            self._groups[sub] = (peer, segment, {})
            self._subs.subscribe(sub, segment, current)
        self._groups[sub][2][req] = None
        peer.subs[req] = sub
        return Notify(((req, current),))

    def unsubscribe(self, peer: Peer, req: int) -> None:
        sub = peer.subs.pop(req, None)
        if sub is None:
            return
        reqs = self._groups[sub][2]
        del reqs[req]
        if not reqs:
            self._forget(sub)

    def drop(self, peer: Peer) -> None:
        """A peer is gone: forget all its subscriptions."""
        for sub in set(peer.subs.values()):
            self._forget(sub)
        peer.subs.clear()

    def _forget(self, sub: int) -> None:
        self._subs.unsubscribe(sub, everywhere=True)
        peer, segment, _reqs = self._groups.pop(sub)
        del self._group_of[(peer, segment)]

    def notifies(self, updates: Iterable[MinTimeUpdate]) -> Outbox:
        """One Notify per peer with every update its subscriptions asked for."""
        per_peer: dict[Peer, list[tuple[int, MinTimeUpdate]]] = defaultdict(list)
        for sub, update in self._subs.route(updates):
            peer, _segment, reqs = self._groups[sub]
            per_peer[peer].extend(zip(reqs, itertools.repeat(update)))
        return [(peer, Notify(tuple(ups))) for peer, ups in per_peer.items()]
