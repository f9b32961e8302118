"""A server's standing requests: subscriptions and ``MinTimeAt`` questions, their
quotas, and what a step's updates and the clock make of them.

Each kind has a quota per connection, per address (all connections of one host
together) and in all (see :class:`~lowtide.service.net.Limits`). The first keeps one
client in bounds, the second keeps one host's many connections from crowding out
other hosts, and the last bounds what one step may cost: a step's notifications are
at most one per subscription, and a question costs nothing until its time comes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from lowtide.core.errors import ProtocolError
from lowtide.core.messages import MinTimeUpdate
from lowtide.service.errors import error_of
from lowtide.service.logs import clip
from lowtide.service.server.history import MinTimeHistory, MinTimeQuestions
from lowtide.service.server.inbox import Outbox, Peer
from lowtide.service.server.subscribers import Subscribers
from lowtide.wire.messages import Error, ErrorCode, MinTimeAt, Ok, Subscribe, Unsubscribe

if TYPE_CHECKING:
    from lowtide.service.engine.base import Engine
    from lowtide.service.net import Limits

SUBSCRIPTIONS, QUESTIONS = "subscriptions", "questions"
_WHAT = {SUBSCRIPTIONS: "subscriptions are open", QUESTIONS: "MinTimeAt questions wait"}
_FIX = {SUBSCRIPTIONS: "unsubscribe first", QUESTIONS: "wait for their answers"}


class StandingRequests:
    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.subscribers = Subscribers()
        self.questions: MinTimeQuestions[Peer] = MinTimeQuestions()
        self._hosts: dict[str, Counter[str]] = {SUBSCRIPTIONS: Counter(), QUESTIONS: Counter()}
        self._totals = {SUBSCRIPTIONS: 0, QUESTIONS: 0}

    def request(
        self, engine: Engine, peer: Peer, msg: Subscribe | Unsubscribe | MinTimeAt, out: Outbox
    ) -> None:
        if isinstance(msg, Unsubscribe):
            before = len(peer.subs)
            self.subscribers.unsubscribe(peer, msg.req)
            self._count(peer, SUBSCRIPTIONS, len(peer.subs) - before)
            out.append((peer, Ok(msg.req)))
        elif (refusal := self.refusal(peer, msg)) is not None:
            out.append((peer, refusal))
        elif isinstance(msg, Subscribe):
            self._subscribe(engine, peer, msg, out)
        elif msg.segment is not None and not engine.graph.has_min_time(msg.segment):
            out.append((peer, Error(msg.req, ErrorCode.UNKNOWN_SEGMENT, clip(msg.segment))))
        else:
            peer.questions += 1
            self._count(peer, QUESTIONS, 1)
            self.questions.ask(peer, msg)

    def refusal(self, peer: Peer, msg: Subscribe | MinTimeAt) -> Error | None:
        """The refusal of a standing request ``peer`` may not add, else None."""
        if isinstance(msg, Subscribe):
            if msg.req in peer.subs:  # the same number replaces, it does not add
                return None
            kind, mine = SUBSCRIPTIONS, len(peer.subs)
        else:
            kind, mine = QUESTIONS, peer.questions
        limits = self.limits
        checks = (
            (mine, f"max_{kind}_per_peer", "on this connection"),
            (self._hosts[kind][peer.host], f"max_{kind}_per_host", f"from {peer.host}"),
            (self._totals[kind], f"max_{kind}", "on this tracker"),
        )
        for held, name, where in checks:
            quota = getattr(limits, name)
            if held >= quota:
                return Error(msg.req, ErrorCode.LIMIT, f"{quota} {_WHAT[kind]} {where}, the "
                             f"limit (Limits.{name}): {_FIX[kind]}")
        return None

    def _subscribe(self, engine: Engine, peer: Peer, msg: Subscribe, out: Outbox) -> None:
        try:
            current = engine.current(msg.segment)
        except ProtocolError as exc:
            out.append((peer, error_of(msg.req, exc)))
            return
        before = len(peer.subs)
        out.append((peer, Ok(msg.req)))
        out.append((peer, self.subscribers.subscribe(peer, msg.req, msg.segment, current)))
        self._count(peer, SUBSCRIPTIONS, len(peer.subs) - before)

    def gone(self, peer: Peer) -> None:
        """A peer is gone: drop its subscriptions and its questions."""
        self._count(peer, SUBSCRIPTIONS, -len(peer.subs))
        self.subscribers.drop(peer)
        self._count(peer, QUESTIONS, -self.questions.forget(peer))
        peer.questions = 0

    def answers(self, now_ms: int, history: MinTimeHistory) -> Outbox:
        """The final answers to the questions whose time has passed."""
        out: Outbox = []
        for peer, reply in self.questions.answer(now_ms, history):
            peer.questions -= 1
            self._count(peer, QUESTIONS, -1)
            out.append((peer, reply))
        return out

    def notifies(self, updates: Iterable[MinTimeUpdate]) -> Outbox:
        return self.subscribers.notifies(updates)

    def _count(self, peer: Peer, kind: str, delta: int) -> None:
        if not delta:
            return
        hosts = self._hosts[kind]
        hosts[peer.host] += delta
        if hosts[peer.host] <= 0:
            del hosts[peer.host]
        self._totals[kind] += delta
