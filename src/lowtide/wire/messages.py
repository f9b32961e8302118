"""What travels between agents, servers, shards and listeners, as frozen dataclasses.

Core messages (:class:`AckBatch`, :class:`Heartbeat`, :class:`MinTimeUpdate`,
:class:`ShardReport`, ...) are reused as they are; this module adds the envelope a
network needs: handshake, request ids, replies, errors, and the idempotency fields of
rule 6 (``session``/``req`` for a sender's own FIFO, ``key`` for Spark batch keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from lowtide.core.graph import SegmentGraph, SegmentSpec
from lowtide.core.messages import (
    AckBatch,
    Heartbeat,
    MinTimeUpdate,
    NodeTime,
    ShardRelease,
    ShardReport,
)

#: Bumped on any incompatible change of the byte format; checked at handshake.
#: 2: FrontOp carries its owner; error codes FRONT_OWNED, SESSION_FAILED; Challenge
#:    carries the server's proof of the secret (mutual authentication).
#: 3: both proofs cover the whole Hello; Hello names the grid and shard it expects,
#:    Welcome the shard it is; error codes GRID_MISMATCH, SHARD_MISMATCH, FORBIDDEN.
#:    Heartbeats carry their front's owner id; FrontOp carries an action (register,
#:    unregister, declare, retire) and a retirement deadline; error codes FRONT_BEHIND,
#:    FRONT_HELD.
#: 4: QueryBatch: a query's driver says which batch it runs (honest stuck reports);
#:    FrontLate (a front's late records, for status views).
#: 5: a graph's segments carry their key ranges and the ranges each listed front feeds.
#: 6: graph generations (rule 16): a graph travels in index order with its detached
#:    segments; ChangeGraph attaches, detaches or replaces segments.
WIRE_VERSION = 6

#: A graph as plain data, in index order: ``(name, (inbound names...))`` per segment,
#: or ``(name, inbound, key_ranges, ((front, (ranges...)), ...))`` for one with key
#: ranges (JSON lists are taken too: a stored graph reads back as lists). A later
#: generation's graph (rule 16) whose order is not the one ``SegmentGraph.of`` gives
#: has ``(name, inbound, 0, (), detached)`` entries (detached 0 or 1): its indices
#: are kept as listed.
GraphSpec = tuple[tuple[Any, ...], ...]


def graph_spec(graph: SegmentGraph) -> GraphSpec:
    out: list[tuple[Any, ...]] = []
    for s, (name, ups) in enumerate(zip(graph.names, graph.inbound, strict=True)):
        inbound = tuple(graph.names[u] for u in ups)
        n = graph.ranges_of(s)
        if graph.detached or graph.kept_order:  # no key ranges (rule 16)
            out.append((name, inbound, 0, (), int(graph.is_detached(s))))
            continue
        out.append((name, inbound) if not n else
                   (name, inbound, n, tuple(sorted((f, tuple(sorted(r)))
                                                   for f, r in graph.fronts_of(s).items()))))
    return tuple(out)


def segment_of(entry: Any) -> SegmentSpec:
    """One entry of a :data:`GraphSpec` as a segment's declaration."""
    name, ups, *ranged = entry
    n, fronts = ranged[:2] if ranged else (0, ())
    return SegmentSpec(name, tuple(ups), int(n),
                       tuple((int(f), tuple(int(r) for r in rs)) for f, rs in fronts))


def graph_of(spec: GraphSpec) -> SegmentGraph:
    """The graph of ``spec``: a later generation's at the indices listed, any other as
    ``SegmentGraph.of`` orders it."""
    if any(len(e) > 4 for e in spec):
        return SegmentGraph.ordered((segment_of(e) for e in spec),
                                    (e[0] for e in spec if len(e) > 4 and e[4]))
    return SegmentGraph.of(*(segment_of(e) for e in spec))


class Role(IntEnum):
    """Who opens a connection, and so which requests it may make (see
    :data:`lowtide.service.server.inbox.RIGHTS`): an agent reports acks and fronts, a status
    client only reads, a coordinator watches and releases shards."""

    AGENT = 1
    STATUS = 2
    COORDINATOR = 3


class ErrorCode(IntEnum):
    BAD_FRAME = 1
    UNSUPPORTED_VERSION = 2
    AUTH_FAILED = 3
    GRAPH_MISMATCH = 4
    BAD_REQUEST = 5
    LIMIT = 6
    GRID_MISMATCH = 7
    SHARD_MISMATCH = 8
    FORBIDDEN = 9
    PROTOCOL = 10
    UNKNOWN_SEGMENT = 11
    UNKNOWN_FRONT = 12
    NON_MONOTONIC_HEARTBEAT = 13
    ACK_BEHIND_HEAD = 14
    TABLE_OVERFLOW = 15
    FRONT_OWNED = 16
    FRONT_BEHIND = 17
    FRONT_HELD = 18
    INTERNAL = 20
    SESSION_FAILED = 21


# ----------------------------------------------------------------- handshake
#: (delta_ms, window_slots) of a time grid; (index, count) of a shard.
GridSpec = tuple[int, int]
ShardSpec = tuple[int, int]


@dataclass(frozen=True)
class Hello:
    """First frame of a client. ``graph`` lets a fresh standalone server adopt the
    pipeline; a server that has one refuses a client whose graph differs. ``grid``
    and ``shard`` (None: any, not a shard) are what the client expects the server to
    be; it is refused otherwise. With a secret, both proofs cover the whole Hello
    (see :mod:`lowtide.service.auth`), so nobody on the way can change a field."""

    version: int
    role: Role
    nonce: bytes
    name: str
    graph: GraphSpec | None
    grid: GridSpec | None = None
    shard: ShardSpec | None = None


@dataclass(frozen=True)
class Challenge:
    """Sent instead of :class:`Welcome` when the server requires a shared secret;
    ``proof`` proves the server knows it too (mutual authentication, wire version 2)."""

    nonce: bytes
    proof: bytes


@dataclass(frozen=True)
class Auth:
    proof: bytes


@dataclass(frozen=True)
class Welcome:
    """What the server agreed to: its graph and grid, and which shard it is (None: not
    a shard); the client checks them against its Hello. ``shards``: in a sharded
    deployment, the shard URLs agents send acks to."""

    version: int
    server: str
    graph: GraphSpec
    delta_ms: int
    window_slots: int
    shards: tuple[str, ...] = ()
    shard: ShardSpec | None = None


# ------------------------------------------------------------ agent -> server
@dataclass(frozen=True)
class Batch:
    """Acks then heartbeats, applied all or nothing.

    ``session``/``req``: the sender's session and a number that grows with every
    request it sends; a server applies each (session, req) at most once, which makes
    resending after a reconnect safe. ``key``: the Spark batch key of rule 6 ("" for a
    local tracker flush); a key is applied at most once whoever sends it.
    ``node_time``: set on the per-shard parts of a sharded flush (rule 8)."""

    req: int
    session: int
    key: str
    acks: AckBatch
    heartbeats: tuple[Heartbeat, ...] = ()
    node_time: NodeTime | None = None


class FrontAction(IntEnum):
    """What a :class:`FrontOp` does (False and True still mean unregister, register)."""

    UNREGISTER = 0
    REGISTER = 1
    DECLARE = 2  # the front may still produce from ``time`` on: hold the segment there
    RETIRE = 3  # the declaring owner gives up on a declared front


@dataclass(frozen=True)
class FrontOp:
    """Register, unregister, declare or retire a front (``action``, a
    :class:`FrontAction`). ``owner``: who may move, unregister or retire it (see
    :mod:`lowtide.core.fronts`); ``retire_after_ms`` (declare only, -1: never): the
    tracker retires the declared front if it has not registered by then."""

    req: int
    session: int
    action: int
    front: int
    segment: str
    time: int
    owner: int = 0
    retire_after_ms: int = -1


@dataclass(frozen=True)
class ChangeGraph:
    """Make the tracker's graph generation ``generation`` (rule 16): ``attach`` these
    segments (a :data:`GraphSpec`, in topological order), ``detach`` or ``replace``
    these; attached segments start at ``start`` (-1: the global min time).
    ``fingerprint``: of the graph the sender expects the change to make ("" if it does
    not say); a change that makes another is refused."""

    req: int
    session: int
    generation: int
    attach: GraphSpec = ()
    detach: tuple[str, ...] = ()
    replace: tuple[str, ...] = ()
    start: int = -1
    fingerprint: str = ""


class BatchState(IntEnum):
    """What a :class:`QueryBatch` says of its batch."""

    CLOSED = 0
    OPEN = 1  # said again now and then while it runs: a keep-alive
    STOPPED = 2  # the query stopped: none of its batches is outstanding


@dataclass(frozen=True)
class QueryBatch:
    """A query's driver: ``batch`` of ``query`` opened or closed (``state``, a
    :class:`BatchState`); its tasks ack into ``segments``. Not tracker state (not
    logged): it tells a slow batch from a loss (:mod:`lowtide.core.open_batches`)."""

    req: int
    query: str
    batch: int
    state: int
    segments: tuple[str, ...] = ()


@dataclass(frozen=True)
class FrontLate:
    """What a front did with late records (rule 12) since its producer started: totals,
    the latest report standing (a resend is harmless). For status views only: no min
    time depends on it, so it is neither deduplicated nor logged (snapshots keep it)."""

    req: int
    session: int
    front: int
    clamped: int
    rejected: int
    raised: int
    out_of_range: int


@dataclass(frozen=True)
class Subscribe:
    """Ask for MinTimeUpdates of ``segment`` (None: global); ``req`` names the
    subscription in later :class:`Notify` frames."""

    req: int
    segment: str | None


@dataclass(frozen=True)
class Unsubscribe:
    req: int


@dataclass(frozen=True)
class StatusRequest:
    req: int


#: :class:`MinTimeAt`'s ``at_ms`` for the latest min time (no wait for the clock)
LATEST_MS = -1


@dataclass(frozen=True)
class MinTimeAt:
    """What was ``segment``'s min time (None: global) at the server's wall time
    ``at_ms``? Answered (:class:`MinTimeAtReply`) once the server's clock has passed
    ``at_ms``, so the answer is final: every attempt of a Spark task gets the same.
    ``at_ms`` :data:`LATEST_MS`: the min time as the step that follows the question
    leaves it, for a caller that needs no final answer, only one that holds everything
    confirmed to it before it asked (a window's stamp); a tracker whose min times come
    from shards answers it as a question about its clock's "now"."""

    req: int
    segment: str | None
    at_ms: int


# ------------------------------------------------------------ server -> agent
@dataclass(frozen=True)
class Ok:
    """The request was applied (and logged, with persistence); ``duplicate``: it had
    been applied before and was not applied again."""

    req: int
    duplicate: bool = False


@dataclass(frozen=True)
class Error:
    """The request was refused and changed nothing; ``req`` 0: about the connection."""

    req: int
    code: ErrorCode
    message: str


@dataclass(frozen=True)
class Notify:
    """Min time updates, in order, each tagged with its subscription id."""

    updates: tuple[tuple[int, MinTimeUpdate], ...]


@dataclass(frozen=True)
class Status:
    """A status view as JSON text: free-form, read by `lowtide status`."""

    req: int
    json: str


@dataclass(frozen=True)
class MinTimeAtReply:
    req: int
    time: int


# ------------------------------------------------------------ shards
@dataclass(frozen=True)
class WatchShard:
    """From the coordinator: send me a :class:`ShardReportFrame` after every step
    that changes something, starting with one covering every retained flush."""

    req: int


@dataclass(frozen=True)
class ShardReportFrame:
    report: ShardReport


@dataclass(frozen=True)
class ShardReleaseFrame:
    """``release``: what the aggregator announced. ``complete``: per node, the counter
    every shard has reached, so shards can stop retaining flushes up to it."""

    release: ShardRelease
    complete: tuple[tuple[int, int], ...] = ()


# ------------------------------------------------------------ write-ahead log
@dataclass(frozen=True)
class Commit:
    """Log marker: the requests logged since the previous marker were applied as one
    group and followed by a step at ``now_ms``; replay repeats exactly that."""

    now_ms: int


@dataclass(frozen=True)
class Refused:
    """Log record: request ``req`` of ``session`` was refused with ``code`` and
    ``message``. Replay keeps it refused (a resend is answered with the same error,
    never as a duplicate); ``fails_session``: it was a background flush, so the session
    stays failed; ``hold``: min times stay below it (TIME_LIMIT: no hold)."""

    session: int
    req: int
    code: ErrorCode
    message: str
    fails_session: bool
    hold: int


Message = (
    Hello
    | Challenge
    | Auth
    | Welcome
    | Batch
    | FrontOp
    | ChangeGraph
    | QueryBatch
    | FrontLate
    | Subscribe
    | Unsubscribe
    | StatusRequest
    | MinTimeAt
    | MinTimeAtReply
    | Ok
    | Error
    | Notify
    | Status
    | WatchShard
    | ShardReportFrame
    | ShardReleaseFrame
    | Commit
    | Refused
)
