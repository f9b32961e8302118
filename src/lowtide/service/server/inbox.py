"""What connections hand the state task: the items of its inbox, and its outbox."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from lowtide.core.graph import SegmentGraph
from lowtide.service.channel import Channel
from lowtide.wire.messages import (
    Batch,
    ChangeGraph,
    Error,
    ErrorCode,
    FrontLate,
    FrontOp,
    Hello,
    Message,
    MinTimeAt,
    QueryBatch,
    Role,
    ShardReleaseFrame,
    StatusRequest,
    Subscribe,
    Unsubscribe,
    WatchShard,
    Welcome,
)

#: What each role may ask of a server; anything else is refused (FORBIDDEN). An agent
#: reports acks and fronts and reads; a status client only reads; a coordinator
#: watches its shards and releases their old windows.
RIGHTS: dict[Role, tuple[type[Message], ...]] = {
    Role.AGENT: (Batch, FrontOp, ChangeGraph, QueryBatch, FrontLate, Subscribe, Unsubscribe,
                 MinTimeAt, StatusRequest),
    Role.STATUS: (StatusRequest, Subscribe, Unsubscribe, MinTimeAt),
    Role.COORDINATOR: (WatchShard, ShardReleaseFrame, StatusRequest),
}


@dataclass(eq=False)
class Peer:
    """An admitted connection: its channel, its name and role (from its Hello, which
    the handshake proved), its address, and its standing requests."""

    channel: Channel
    name: str = ""
    role: Role = Role.AGENT
    host: str = ""
    subs: dict[int, int] = field(default_factory=dict)  # request id -> subscriber id
    questions: int = 0  # MinTimeAt requests not answered yet

    def forbidden(self, msg: Message) -> Error | None:
        """The refusal of a request this peer's role may not make, else None."""
        if isinstance(msg, RIGHTS[self.role]):
            return None
        return Error(getattr(msg, "req", 0), ErrorCode.FORBIDDEN,
                     f"a {self.role.name.lower()} may not send {type(msg).__name__}")


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
