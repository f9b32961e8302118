"""What connections hand the state task: the items of its inbox, and its outbox."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from lowtide.core.graph import SegmentGraph
from lowtide.service.channel import Channel
from lowtide.wire.messages import Hello, Message, Welcome


@dataclass(eq=False)
class Peer:
    channel: Channel
    name: str = ""
    subs: dict[int, int] = field(default_factory=dict)  # request id -> subscriber id
    questions: int = 0  # MinTimeAt requests not answered yet


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
