"""Byte format of every message: one type byte, then fixed fields, little-endian.

Ack batches are four packed numpy columns (``tobytes`` / ``frombuffer``): decoding a
batch of a million acks is four slices, never a million objects. Decoding refuses
anything malformed with :class:`WireError` and nothing else, so a server can answer
garbage with an error and keep going.

>>> from lowtide.core.messages import Ack, AckBatch
>>> msg = Batch(req=7, session=1, key="q/3/sink/0", acks=AckBatch.of([Ack(1, 5, 9, -1)]))
>>> back = decode(encode(msg))
>>> back.key, back.acks.to_acks()
('q/3/sink/0', [Ack(segment=1, time=5, xor=9, count=-1)])
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from itertools import groupby, repeat
from operator import itemgetter
from typing import Any, TypeVar

import numpy as np

from lowtide.core.messages import (
    Heartbeat,
    MinTimeUpdate,
    NodeTime,
    ShardRelease,
    ShardReport,
)
from lowtide.wire.buffers import Reader, WireError, Writer
from lowtide.wire.fields import (
    get_acks,
    get_graph,
    get_ints,
    get_names,
    get_pair,
    get_pairs,
    put_acks,
    put_graph,
    put_ints,
    put_names,
    put_pair,
    put_pairs,
)
from lowtide.wire.messages import (
    WIRE_VERSION,
    Auth,
    Batch,
    BatchState,
    Challenge,
    ChangeGraph,
    Commit,
    Error,
    ErrorCode,
    FrontAction,
    FrontLate,
    FrontOp,
    Hello,
    Message,
    MinTimeAt,
    MinTimeAtReply,
    Notify,
    Ok,
    QueryBatch,
    Refused,
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


def _enc_hello(w: Writer, m: Hello) -> None:
    w.pack("HB", m.version, m.role)
    w.blob(m.nonce)
    w.text(m.name)
    w.pack("B", m.graph is not None)
    if m.graph is not None:
        put_graph(w, m.graph)
    put_pair(w, m.grid)
    put_pair(w, m.shard)


def _dec_hello(r: Reader) -> Hello:
    version, role = r.unpack("HB")
    if version != WIRE_VERSION:  # the rest may be laid out otherwise: say so, not "truncated"
        raise WireError(f"wire version {version}, this lowtide speaks {WIRE_VERSION}: run the "
                        "same lowtide version on both sides")
    nonce, name = bytes(r.blob(256)), r.text()
    graph = get_graph(r) if r.one("B") else None
    grid, shard = get_pair(r), get_pair(r)
    try:
        return Hello(version, Role(role), nonce, name, graph, grid, shard)
    except ValueError as exc:
        raise WireError(f"unknown role {role}") from exc


def _enc_welcome(w: Writer, m: Welcome) -> None:
    w.pack("HII", m.version, m.delta_ms, m.window_slots)
    w.text(m.server)
    put_graph(w, m.graph)
    w.pack("I", len(m.shards))
    for url in m.shards:
        w.text(url)
    put_pair(w, m.shard)


def _dec_welcome(r: Reader) -> Welcome:
    version, delta, window = r.unpack("HII")
    server, graph = r.text(), get_graph(r)
    shards = tuple(r.text() for _ in range(r.count()))
    return Welcome(version, server, graph, delta, window, shards, get_pair(r))


def _enc_batch(w: Writer, m: Batch) -> None:
    w.pack("QQ", m.req, m.session)
    w.text(m.key)
    nt = m.node_time
    w.pack("B", nt is not None)
    if nt is not None:
        w.pack("qqq", nt.node, nt.counter, nt.min_time)
    put_acks(w, m.acks)
    put_pairs(w, [(h.front, h.time) for h in m.heartbeats])
    if m.heartbeats:
        w.array(np.array([h.owner for h in m.heartbeats], np.uint64), np.dtype("<u8"))


def _dec_batch(r: Reader) -> Batch:
    req, session = r.unpack("QQ")
    key = r.text()
    nt = NodeTime(*r.unpack("qqq")) if r.one("B") else None
    acks = get_acks(r)
    pairs = get_pairs(r)
    owners = r.array(len(pairs), np.dtype("<u8"), np.uint64).tolist() if pairs else []
    heartbeats = tuple(Heartbeat(f, t, o) for (f, t), o in zip(pairs, owners, strict=True))
    return Batch(req, session, key, acks, heartbeats, nt)


def _enc_front(w: Writer, m: FrontOp) -> None:
    w.pack("QQBqqQq", m.req, m.session, m.action, m.front, m.time, m.owner,
           m.retire_after_ms)
    w.text(m.segment)


def _dec_front(r: Reader) -> FrontOp:
    req, session, action, front, time, owner, after = r.unpack("QQBqqQq")
    try:
        kind = FrontAction(action)
    except ValueError as exc:
        raise WireError(f"unknown front action {action}") from exc
    return FrontOp(req, session, kind, front, r.text(), time, owner, after)


def _enc_change_graph(w: Writer, m: ChangeGraph) -> None:
    w.pack("QQqq", m.req, m.session, m.generation, m.start)
    put_graph(w, m.attach)
    put_names(w, m.detach)
    put_names(w, m.replace)
    w.text(m.fingerprint)


def _dec_change_graph(r: Reader) -> ChangeGraph:
    req, session, generation, start = r.unpack("QQqq")
    return ChangeGraph(req, session, generation, get_graph(r), get_names(r), get_names(r),
                       start, r.text())


def _enc_query_batch(w: Writer, m: QueryBatch) -> None:
    w.pack("QqB", m.req, m.batch, m.state)
    w.text(m.query)
    put_names(w, m.segments)


def _dec_query_batch(r: Reader) -> QueryBatch:
    req, batch, state = r.unpack("QqB")
    try:
        kind = BatchState(state)
    except ValueError as exc:
        raise WireError(f"unknown batch state {state}") from exc
    query = r.text()
    return QueryBatch(req, query, batch, kind, get_names(r))


def _enc_notify(w: Writer, m: Notify) -> None:
    """Runs of one update (a peer's many subscriptions to one segment) are written
    once, their subscription ids as a packed column: a server's cost per step grows
    with the updates it sends, hardly with the subscriptions."""
    runs = [(u, [sub for sub, _u in run]) for u, run in groupby(m.updates, itemgetter(1))]
    w.pack("I", len(runs))
    for u, subs in runs:
        w.pack("qI", u.time, len(subs))
        w.opt_text(u.segment)
        w.array(np.array(subs, dtype=np.uint64), np.dtype("<u8"))


def _dec_notify(r: Reader) -> Notify:
    out: list[tuple[int, MinTimeUpdate]] = []
    for _ in range(r.count()):
        time, n = r.unpack("qI")
        update = MinTimeUpdate(r.opt_text(), time)
        out.extend(zip(r.array(n, np.dtype("<u8"), np.uint64).tolist(), repeat(update)))
    return Notify(tuple(out))


def _enc_error(w: Writer, m: Error) -> None:
    w.pack("QH", m.req, m.code)
    w.text(m.message)


def _dec_error(r: Reader) -> Error:
    req, code = r.unpack("QH")
    return Error(req, _error_code(code), r.text())


def _error_code(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError as exc:
        raise WireError(f"unknown error code {code}") from exc


def _enc_refused(w: Writer, m: Refused) -> None:
    w.pack("QQHBq", m.session, m.req, m.code, m.fails_session, m.hold)
    w.text(m.message)


def _dec_refused(r: Reader) -> Refused:
    session, req, code, fails, hold = r.unpack("QQHBq")
    return Refused(session, req, _error_code(code), r.text(), bool(fails), hold)


def _enc_report(w: Writer, m: ShardReportFrame) -> None:
    # min times per checksum row: a graph with key ranges (rule 15) lists them after
    # its segments', one without has one per segment: the layout is the same
    rep = m.report
    w.pack("I", rep.shard)
    put_ints(w, rep.min_times)
    put_pairs(w, rep.node_times)
    put_ints(w, tuple(x for f in rep.flushes for x in f))


def _dec_report(r: Reader) -> ShardReportFrame:
    shard = r.one("I")
    mins, node_times, flat = get_ints(r), tuple(get_pairs(r)), get_ints(r)
    if len(flat) % 3:
        raise WireError("flush triples are not a multiple of 3")
    flushes = tuple(zip(flat[0::3], flat[1::3], flat[2::3], strict=True))
    return ShardReportFrame(ShardReport(shard, mins, node_times, flushes))


def _enc_release(w: Writer, m: ShardReleaseFrame) -> None:
    put_ints(w, m.release.min_times)
    put_pairs(w, m.complete)


def _dec_release(r: Reader) -> ShardReleaseFrame:
    return ShardReleaseFrame(ShardRelease(get_ints(r)), tuple(get_pairs(r)))


def _enc_subscribe(w: Writer, m: Subscribe) -> None:
    w.pack("Q", m.req)
    w.opt_text(m.segment)


def _enc_status(w: Writer, m: Status) -> None:
    w.pack("Q", m.req)
    w.text(m.json)


def _enc_min_time_at(w: Writer, m: MinTimeAt) -> None:
    w.pack("Qq", m.req, m.at_ms)
    w.opt_text(m.segment)


def _dec_min_time_at(r: Reader) -> MinTimeAt:
    req, at_ms = r.unpack("Qq")
    return MinTimeAt(req, r.opt_text(), at_ms)


def _enc_challenge(w: Writer, m: Challenge) -> None:
    w.blob(m.nonce)
    w.blob(m.proof)


def _dec_challenge(r: Reader) -> Challenge:
    return Challenge(bytes(r.blob(256)), bytes(r.blob(256)))


def _req_codec(cls: type[Any]) -> tuple[Callable[[Writer, Any], None], Callable[[Reader], Any]]:
    """Codec of a message whose only field is ``req``."""
    return (lambda w, m: w.pack("Q", m.req)), (lambda r: cls(r.one("Q")))


M = TypeVar("M")

_CODECS: dict[type[Any], tuple[int, Callable[[Writer, Any], None], Callable[[Reader], Any]]] = {
    Hello: (1, _enc_hello, _dec_hello),
    Challenge: (2, _enc_challenge, _dec_challenge),
    Auth: (3, lambda w, m: w.blob(m.proof), lambda r: Auth(bytes(r.blob(256)))),
    Welcome: (4, _enc_welcome, _dec_welcome),
    Batch: (10, _enc_batch, _dec_batch),
    FrontOp: (11, _enc_front, _dec_front),
    FrontLate: (17, lambda w, m: w.pack("QQqqqqq", m.req, m.session, m.front, m.clamped,
                                        m.rejected, m.raised, m.out_of_range),
                lambda r: FrontLate(*r.unpack("QQqqqqq"))),
    Subscribe: (12, _enc_subscribe, lambda r: Subscribe(r.one("Q"), r.opt_text())),
    Unsubscribe: (13, *_req_codec(Unsubscribe)),
    StatusRequest: (14, *_req_codec(StatusRequest)),
    MinTimeAt: (15, _enc_min_time_at, _dec_min_time_at),
    QueryBatch: (16, _enc_query_batch, _dec_query_batch),
    ChangeGraph: (18, _enc_change_graph, _dec_change_graph),
    Ok: (20, lambda w, m: w.pack("QB", m.req, m.duplicate), lambda r: Ok(*r.unpack("Q?"))),
    Error: (21, _enc_error, _dec_error),
    Notify: (22, _enc_notify, _dec_notify),
    Status: (23, _enc_status, lambda r: Status(r.one("Q"), r.text())),
    MinTimeAtReply: (
        24, lambda w, m: w.pack("Qq", m.req, m.time), lambda r: MinTimeAtReply(*r.unpack("Qq"))
    ),
    WatchShard: (30, *_req_codec(WatchShard)),
    ShardReportFrame: (31, _enc_report, _dec_report),
    ShardReleaseFrame: (32, _enc_release, _dec_release),
    Commit: (40, lambda w, m: w.pack("q", m.now_ms), lambda r: Commit(r.one("q"))),
    Refused: (41, _enc_refused, _dec_refused),
}
_DECODERS = {code: dec for code, _enc, dec in _CODECS.values()}


def encode(msg: Message) -> bytes:
    """The payload of one frame (see :mod:`lowtide.wire.frames` for the length prefix)."""
    code, enc, _dec = _CODECS[type(msg)]
    w = Writer()
    w.pack("B", code)
    enc(w, msg)
    return w.getvalue()


def decode(payload: bytes | memoryview) -> Message:
    """Parse one frame's payload; :class:`WireError` if it is not a valid message."""
    r = Reader(payload)
    code = r.one("B")
    dec = _DECODERS.get(code)
    if dec is None:
        raise WireError(f"unknown message type {code}")
    try:
        msg: Message = dec(r)
    except (struct.error, UnicodeDecodeError, ValueError, TypeError) as exc:
        # ValueError covers core validation, e.g. AckBatch column checks.
        raise exc if isinstance(exc, WireError) else WireError(str(exc)) from exc
    r.end()
    return msg


def expect(payload: bytes | memoryview, cls: type[M]) -> M:
    """Decode and insist on one message type (handshake steps)."""
    msg = decode(payload)
    if not isinstance(msg, cls):
        raise WireError(f"expected {cls.__name__}, got {type(msg).__name__}")
    return msg
