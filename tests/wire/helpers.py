"""What the wire tests share with the service's fuzz test: one sample of every message
kind."""

from __future__ import annotations

from lowtide.core.messages import MinTimeUpdate, ShardRelease, ShardReport
from lowtide.wire.messages import (
    WIRE_VERSION,
    Auth,
    Challenge,
    Commit,
    Error,
    ErrorCode,
    FrontLate,
    FrontOp,
    Hello,
    Notify,
    Ok,
    QueryBatch,
    Role,
    ShardReleaseFrame,
    ShardReportFrame,
    Status,
    StatusRequest,
    Subscribe,
    Unsubscribe,
    WatchShard,
    Welcome,
)

GRAPH = (("src", ()), ("sink", ("src",)))
SRC5 = MinTimeUpdate("src", 5)
SAMPLES = [
    Hello(WIRE_VERSION, Role.AGENT, b"n" * 32, "agent-1", GRAPH),
    Hello(WIRE_VERSION, Role.STATUS, b"", "", None),
    Hello(WIRE_VERSION, Role.COORDINATOR, b"n" * 32, "c", GRAPH, (10, 4), (1, 2)),
    Challenge(b"c" * 32, b"p" * 32),
    Auth(b"p" * 32),
    Welcome(1, "srv", GRAPH, 10, 4, ("tcp://127.0.0.1:1", "tcp://127.0.0.1:2")),
    Welcome(1, "shard-1", GRAPH, 10, 4, (), (1, 2)),
    FrontOp(3, 9, True, 7, "src", 100),
    QueryBatch(11, "q", 3, 1, ("src", "sink")),
    QueryBatch(12, "", -1, 2),
    FrontLate(3, 9, 7, 12, 1, 0, 2),
    Subscribe(4, None),
    Subscribe(5, "sink"),
    Unsubscribe(5),
    StatusRequest(6),
    Ok(7, True),
    Error(8, ErrorCode.ACK_BEHIND_HEAD, "late"),
    Notify(((1, MinTimeUpdate("src", 5)), (2, MinTimeUpdate(None, 4)))),
    Notify(((3, SRC5), (1, SRC5), (2, SRC5), (4, MinTimeUpdate(None, 4)))),  # a run of one
    Status(9, '{"a": 1}'),
    WatchShard(10),
    ShardReportFrame(ShardReport(1, (3, 4), ((7, 2), (8, 1)), ((7, 2, 30),))),
    ShardReleaseFrame(ShardRelease((3, 4)), ((7, 2),)),
    ShardReportFrame(ShardReport(0, (3, 4, 5, 3), ())),  # src, sink, then src#0 and src#1
    Commit(123),
]
