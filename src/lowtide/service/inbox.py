"""What connections hand the state task: the items of its inbox, and its outbox."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lowtide.core.graph import SegmentGraph
from lowtide.service.channel import Channel
from lowtide.wire.messages import Error, ErrorCode, Hello, Message, MinTimeAt, Subscribe, Welcome

if TYPE_CHECKING:
    from lowtide.service.net import Limits


@dataclass(eq=False)
class Peer:
    channel: Channel
    name: str = ""
    subs: dict[int, int] = field(default_factory=dict)  # request id -> subscriber id
    questions: int = 0  # MinTimeAt requests not answered yet

    def over_quota(self, msg: Subscribe | MinTimeAt, limits: Limits) -> Error | None:
        """The refusal of a standing request this peer may not add, else None."""
        if isinstance(msg, Subscribe):
            quota = limits.max_subscriptions_per_peer
            if len(self.subs) < quota or msg.req in self.subs:  # the same number replaces
                return None
            text = f"{quota} subscriptions are open on this connection, the limit "
            text += "(Limits.max_subscriptions_per_peer): unsubscribe first"
        else:
            quota = limits.max_questions_per_peer
            if self.questions < quota:
                return None
            text = f"{quota} MinTimeAt questions wait on this connection, the limit "
            text += "(Limits.max_questions_per_peer): wait for their answers"
        return Error(msg.req, ErrorCode.LIMIT, text)


@dataclass(frozen=True)
class Request:
    peer: Peer
    msg: Message


@dataclass(frozen=True)
class Admit:
    """``graph``: the Hello's graph, checked by the connection task (not the state
    task, which a huge graph must not hold up)."""

    hello: Hello
    graph: SegmentGraph | None
    reply: asyncio.Future[Welcome]


@dataclass(frozen=True)
class Gone:
    peer: Peer


@dataclass(frozen=True)
class Tick:
    pass


@dataclass(frozen=True)
class Call:
    fn: Callable[[], None]


Item = Request | Admit | Gone | Tick | Call
Outbox = list[tuple[Peer, Message]]
