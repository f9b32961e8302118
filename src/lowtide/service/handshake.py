"""The handshake, both sides, over any channel: Hello; with a secret, the mutual proofs
(which cover the whole Hello, see :mod:`.auth`); then Welcome or Error. Each side then
relies only on what it checked: the server on the Hello the client proved it sent,
the client on a Welcome that agrees with its Hello (graph, grid, shard), protected by
the frame MACs when there is a secret."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from lowtide.core.errors import GraphError
from lowtide.core.generations import follows
from lowtide.service import auth
from lowtide.service.channel import Channel
from lowtide.service.errors import ConnectionLost, ServiceError, exception_of
from lowtide.service.logs import LogBudget
from lowtide.wire.codec import encode
from lowtide.wire.messages import (
    Auth,
    Challenge,
    Error,
    ErrorCode,
    GraphSpec,
    Hello,
    Role,
    ShardSpec,
    Welcome,
    graph_of,
)

log = logging.getLogger("lowtide.service.net")

Admit = Callable[[Hello], Awaitable[Welcome]]
_refusals = LogBudget()  # per remote host: a flood of bad handshakes logs a few lines


# ------------------------------------------------------------------ server
async def server_handshake(
    channel: Channel,
    secret: bytes | None,
    admit: Admit,
    deadline: float,
    idle_timeout_s: float,
    proven: Callable[[], None] = lambda: None,
    greeted: Callable[[], None] = lambda: None,
) -> Hello | None:
    """Hello (then ``greeted()``), then (with a secret) the mutual HMAC challenge,
    ``proven()`` (which may refuse with a ServiceError), then Welcome or Error, all
    before the loop time ``deadline``. Returns the Hello of an admitted peer, whose
    channel then drops it after ``idle_timeout_s`` of silence; None (after telling it
    why) otherwise."""
    try:
        async with asyncio.timeout_at(deadline):
            hello = await _server_handshake(channel, secret, admit, proven, greeted)
        channel.admitted(idle_timeout_s)
        return hello
    except TimeoutError:
        refuse(channel, ErrorCode.BAD_REQUEST, "handshake timed out")
    except ServiceError as exc:
        refuse(channel, exc.code, exc.reason)
    except ValueError as exc:  # WireError and friends: garbage instead of a handshake
        refuse(channel, ErrorCode.BAD_FRAME, str(exc))
    except ConnectionLost:
        log_refusal(channel, "left during the handshake", logging.INFO)
    return None


async def _server_handshake(
    channel: Channel, secret: bytes | None, admit: Admit, proven: Callable[[], None],
    greeted: Callable[[], None],
) -> Hello:
    hello = await channel.recv()
    if not isinstance(hello, Hello):
        raise ServiceError(ErrorCode.BAD_FRAME, f"expected Hello, got {type(hello).__name__}")
    greeted()
    if secret is not None:
        if not auth.is_nonce(hello.nonce):
            raise ServiceError(ErrorCode.AUTH_FAILED, f"need a {auth.NONCE_BYTES}-byte nonce")
        digest = auth.hello_digest(encode(hello))
        server_nonce = auth.nonce()
        mine = auth.server_proof(secret, hello.nonce, server_nonce, digest)
        channel.send(Challenge(server_nonce, mine))
        answer = await channel.recv()
        if not (
            isinstance(answer, Auth)
            and auth.verify(secret, server_nonce, hello.nonce, digest, answer.proof)
        ):
            raise ServiceError(
                ErrorCode.AUTH_FAILED,
                "authentication failed (another secret, or the Hello was altered on the way)",
            )
        keys = auth.frame_keys(secret, hello.nonce, server_nonce, digest)
        channel.protect(keys.server_to_client, keys.client_to_server)
    proven()
    channel.send(await admit(hello))
    return hello


def refuse(channel: Channel, code: ErrorCode, message: str) -> None:
    log_refusal(channel, message)
    with contextlib.suppress(ConnectionLost):
        channel.send(Error(0, code, message))


def log_refusal(channel: Channel, reason: str, level: int = logging.WARNING) -> None:
    host = channel.peer.rpartition(":")[0] or channel.peer
    _refusals.warn(log, host, "refused peer", level, peer=channel.peer, reason=reason)


# ------------------------------------------------------------------ client
async def client_handshake(channel: Channel, hello: Hello, secret: bytes | None) -> Welcome:
    """The client's side of :func:`server_handshake`. With a secret, the server must
    prove it (for this very Hello) first: a server that cannot is refused before it is
    told anything. The Welcome must agree with the Hello (:func:`check_welcome`)."""
    channel.send(hello)
    reply = await channel.recv()
    if isinstance(reply, Challenge):
        if secret is None:
            raise ServiceError(ErrorCode.AUTH_FAILED, "the tracker requires a shared secret")
        digest = auth.hello_digest(encode(hello))
        if not (
            auth.is_nonce(reply.nonce)
            and auth.verify_server(secret, hello.nonce, reply.nonce, digest, reply.proof)
        ):
            raise ServiceError(
                ErrorCode.AUTH_FAILED,
                "the tracker could not prove the shared secret for this Hello (another "
                "secret, not your tracker, or the Hello was altered on the way)",
            )
        channel.send(Auth(auth.proof(secret, reply.nonce, hello.nonce, digest)))
        keys = auth.frame_keys(secret, hello.nonce, reply.nonce, digest)
        channel.protect(keys.client_to_server, keys.server_to_client)
        reply = await channel.recv()
    elif secret is not None and isinstance(reply, Welcome):
        raise ServiceError(
            ErrorCode.AUTH_FAILED,
            "the tracker did not ask for the shared secret, so it cannot prove it: "
            "refusing it (give it the secret too)",
        )
    if isinstance(reply, Error):
        raise exception_of(reply)
    if not isinstance(reply, Welcome):
        raise ServiceError(ErrorCode.BAD_FRAME, f"expected Welcome, got {type(reply).__name__}")
    check_welcome(hello, reply)
    channel.admitted(None)
    return reply


def later_generation(mine: GraphSpec, theirs: GraphSpec) -> bool:
    """Is ``theirs`` a later generation of ``mine`` (rule 16)? A client of an earlier
    generation keeps its segments' indices in it."""
    try:
        return follows(graph_of(mine), graph_of(theirs))
    except GraphError:
        return False


def check_welcome(hello: Hello, welcome: Welcome) -> None:
    """Refuse a Welcome that does not agree with what the Hello asked for: another
    wire version, graph, grid or shard (ServiceError, one line saying which)."""
    if welcome.version != hello.version:
        raise ServiceError(ErrorCode.UNSUPPORTED_VERSION,
                           f"the tracker answered in wire version {welcome.version}, "
                           f"not {hello.version}: run the same lowtide version on both sides")
    if hello.graph is not None and welcome.graph != hello.graph and \
            not later_generation(hello.graph, welcome.graph):
        raise ServiceError(ErrorCode.GRAPH_MISMATCH,
                           "the tracker's Welcome names another graph than this client's "
                           "(a tracker of another pipeline, or the Hello was altered on "
                           "the way): check the tracker URL")
    grid = (welcome.delta_ms, welcome.window_slots)
    if hello.grid is not None and grid != hello.grid:
        raise ServiceError(ErrorCode.GRID_MISMATCH,
                           f"the tracker's grid is delta_ms {grid[0]}, window_slots "
                           f"{grid[1]}, this client expects {hello.grid[0]}, {hello.grid[1]}: "
                           "use the tracker's grid (or none, to take it from the tracker)")
    wrong_shard = shard_mismatch(hello.role, hello.shard, welcome.shard)
    if wrong_shard is not None:
        raise ServiceError(ErrorCode.SHARD_MISMATCH, wrong_shard)


def shard_mismatch(role: Role, asked: ShardSpec | None, server: ShardSpec | None) -> str | None:
    """Why a client asking for shard ``asked`` (None: not a shard) may not use a
    server that is shard ``server``, or None if it may. Only a status client may look
    at any server; a shard takes acks only from clients that asked for it (an agent
    must learn the shards from their coordinator), so a shard's port taken over by
    another server, or a URL mixed up, is refused on both sides."""
    if asked == server or (asked is None and role == Role.STATUS):
        return None
    if asked is None:
        assert server is not None  # else asked == server
        return (f"this is shard {server[0]} of {server[1]}: connect to the coordinator, "
                "which tells agents where its shards are")
    have = "not a shard" if server is None else f"shard {server[0]} of {server[1]}"
    return (f"asked for shard {asked[0]} of {asked[1]}, the server is {have}: a shard's "
            "port taken over by another server, or a wrong URL")
