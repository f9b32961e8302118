"""The server's subscribers: which peer's request each subscription answers, and the
Notify frames a step's updates make for each peer."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable

from lowtide.core.messages import MinTimeUpdate
from lowtide.core.subscriptions import Subscriptions
from lowtide.service.inbox import Outbox, Peer
from lowtide.wire.messages import Notify


class Subscribers:
    def __init__(self) -> None:
        self._subs = Subscriptions()
        self._owner: dict[int, tuple[Peer, int]] = {}  # subscriber id -> (peer, request)
        self._ids = itertools.count(1)

    def subscribe(self, peer: Peer, req: int, segment: str | None,
                  current: MinTimeUpdate) -> Notify:
        """Register ``peer``'s request ``req`` (replacing one of the same number);
        returns the first update to send."""
        self.unsubscribe(peer, req)
        sub = next(self._ids)
        peer.subs[req] = sub
        self._owner[sub] = (peer, req)
        return Notify(((req, self._subs.subscribe(sub, segment, current)),))

    def unsubscribe(self, peer: Peer, req: int) -> None:
        sub = peer.subs.pop(req, None)
        if sub is not None:
            self._forget(sub)

    def drop(self, peer: Peer) -> None:
        """A peer is gone: forget all its subscriptions."""
        for sub in peer.subs.values():
            self._forget(sub)
        peer.subs.clear()

    def _forget(self, sub: int) -> None:
        self._subs.unsubscribe(sub, everywhere=True)
        self._owner.pop(sub, None)

    def notifies(self, updates: Iterable[MinTimeUpdate]) -> Outbox:
        """One Notify per peer with every update its subscriptions asked for."""
        per_peer: dict[Peer, list[tuple[int, MinTimeUpdate]]] = defaultdict(list)
        for sub, update in self._subs.route(updates):
            peer, req = self._owner[sub]
            per_peer[peer].append((req, update))
        return [(peer, Notify(tuple(ups))) for peer, ups in per_peer.items()]
