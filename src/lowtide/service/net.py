"""The one module that talks to the network: asyncio TCP streams, framing I/O, the
handshake, and a small HTTP responder (Prometheus metrics, the web view); what it
answers comes from handlers that only turn a request into bytes.

Limits (:class:`Limits`): until a peer is admitted its frames may be at most
``max_handshake_frame`` long and the whole handshake must end within
``handshake_timeout_s``; afterwards a frame longer than ``max_frame`` ends the
connection (its length cannot be trusted, so neither can anything after it), and a
server drops a peer that sends nothing, not even a keepalive, for ``idle_timeout_s``.
A peer that does not read its messages fast enough is dropped once ``max_buffer``
bytes wait for it. A server accepts at most ``max_connections`` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from lowtide.service import auth
from lowtide.service.channel import Address, Channel
from lowtide.service.errors import ConnectionLost, ServiceError, exception_of
from lowtide.service.logs import LogBudget
from lowtide.wire.codec import decode, encode
from lowtide.wire.frames import (
    DEFAULT_MAX_FRAME,
    HEADER,
    PREAMBLE,
    FrameSeal,
    check_length,
)
from lowtide.wire.messages import Auth, Challenge, Error, ErrorCode, Hello, Message, Welcome

log = logging.getLogger("lowtide.service.net")

HTTP_TIMEOUT_S = 10.0
#: How far a stream reads ahead of what is parsed; a frame may still be longer.
READ_AHEAD = 256 << 10


@dataclass(frozen=True)
class Limits:
    """What one peer can make a process hold; see the module docstring. The two
    per-peer quotas bound a server's standing requests: pending ``MinTimeAt``
    questions and live subscriptions per connection."""

    max_frame: int = DEFAULT_MAX_FRAME
    max_buffer: int = 64 << 20
    max_handshake_frame: int = 1 << 20
    handshake_timeout_s: float = 10.0
    idle_timeout_s: float = 60.0
    keepalive_s: float = 15.0  # clients send an empty frame this often
    max_connections: int = 1024
    max_questions_per_peer: int = 1024
    max_subscriptions_per_peer: int = 1024


class StreamChannel:
    """Frames over an asyncio stream pair; sealed (see :meth:`protect`) once the
    handshake has proven a shared secret."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limits: Limits
    ) -> None:
        self._reader, self._writer, self._limits = reader, writer, limits
        self._max_frame = limits.max_handshake_frame
        self._idle_timeout_s: float | None = None
        self._seal: FrameSeal | None = None
        self._unseal: FrameSeal | None = None
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    def protect(self, send_key: bytes, recv_key: bytes) -> None:
        """From now on every frame carries a MAC, and one that fails ends the stream."""
        self._seal, self._unseal = FrameSeal(send_key), FrameSeal(recv_key)

    def admitted(self, idle_timeout_s: float | None) -> None:
        """The handshake is over: full-size frames; ``idle_timeout_s`` for recv."""
        self._max_frame = self._limits.max_frame
        self._idle_timeout_s = idle_timeout_s

    async def recv(self) -> Message:
        """Next message. WireError for a malformed payload (the stream stays in step);
        FrameTooLarge for an oversized one, FrameForged for one whose MAC fails;
        ConnectionLost at the end or after ``idle_timeout_s`` of silence."""
        while True:
            payload: bytes | memoryview = await self._frame()
            if self._unseal is not None:
                payload = self._unseal.open(payload)
            if payload:  # an empty one is a keepalive
                return decode(payload)

    async def _frame(self) -> bytes:
        try:
            async with asyncio.timeout(self._idle_timeout_s):
                (length,) = HEADER.unpack(await self._reader.readexactly(HEADER.size))
                check_length(length, self._max_frame)
                return await self._reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise ConnectionLost(f"{self.peer}: {exc}") from exc
        except TimeoutError:
            raise ConnectionLost(
                f"{self.peer}: nothing received for {self._idle_timeout_s} s"
            ) from None

    def send(self, msg: Message) -> None:
        self._write(encode(msg))

    def keepalive(self) -> None:
        self._write(b"")

    def _write(self, payload: bytes) -> None:
        if self._writer.is_closing():
            raise ConnectionLost(f"{self.peer} closed")
        if self._seal is not None:
            payload = self._seal.seal(payload)
        waiting = self._writer.transport.get_write_buffer_size()
        if waiting + len(payload) > self._limits.max_buffer:
            self.close()
            raise ConnectionLost(f"{self.peer}: {waiting} bytes unread, over the buffer limit")
        self._writer.write(HEADER.pack(len(payload)) + payload)

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except ConnectionError as exc:
            raise ConnectionLost(f"{self.peer}: {exc}") from exc

    def close(self) -> None:
        self._writer.close()


# ------------------------------------------------------------------ server
Admit = Callable[[Hello], Awaitable[Welcome]]
_refusals = LogBudget()  # per remote host: a flood of bad handshakes logs a few lines


async def serve_tcp(
    host: str,
    port: int,
    on_channel: Callable[[StreamChannel], Awaitable[None]],
    limits: Limits,
) -> tuple[asyncio.Server, int]:
    """Listen; each connection that sends the right preamble becomes a channel."""
    open_now = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_now
        channel = StreamChannel(reader, writer, limits)
        if open_now >= limits.max_connections:
            _log_refusal(channel, f"over the limit of {limits.max_connections} connections")
            writer.close()
            return
        open_now += 1
        try:
            await _handle(reader, channel, on_channel, limits)
        finally:
            open_now -= 1
            writer.close()

    server = await asyncio.start_server(handle, host, port, limit=READ_AHEAD)
    bound = server.sockets[0].getsockname()[1]
    return server, int(bound)


async def _handle(
    reader: asyncio.StreamReader,
    channel: StreamChannel,
    on_channel: Callable[[StreamChannel], Awaitable[None]],
    limits: Limits,
) -> None:
    try:
        preamble = await asyncio.wait_for(
            reader.readexactly(len(PREAMBLE)), limits.handshake_timeout_s
        )
    except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
        return
    if preamble != PREAMBLE:
        _log_refusal(channel, "bad preamble")
        return
    with contextlib.suppress(asyncio.CancelledError):  # the server is stopping; Python
        await on_channel(channel)  # 3.11 would log a cancelled handler as an error


async def server_handshake(
    channel: Channel, secret: bytes | None, admit: Admit, limits: Limits
) -> Hello | None:
    """Hello, then (with a secret) the mutual HMAC challenge, then Welcome or Error.
    Returns the Hello of an admitted peer; None (after telling it why) otherwise."""
    try:
        hello = await asyncio.wait_for(
            _server_handshake(channel, secret, admit), limits.handshake_timeout_s
        )
    except TimeoutError:
        _refuse(channel, ErrorCode.BAD_REQUEST, "handshake timed out")
    except ServiceError as exc:
        _refuse(channel, exc.code, str(exc))
    except ValueError as exc:  # WireError and friends: garbage instead of a handshake
        _refuse(channel, ErrorCode.BAD_FRAME, str(exc))
    except ConnectionLost:
        _log_refusal(channel, "left during the handshake", logging.INFO)
    else:
        channel.admitted(limits.idle_timeout_s)
        return hello
    return None


async def _server_handshake(channel: Channel, secret: bytes | None, admit: Admit) -> Hello:
    hello = await channel.recv()
    if not isinstance(hello, Hello):
        raise ServiceError(ErrorCode.BAD_FRAME, f"expected Hello, got {type(hello).__name__}")
    if secret is not None:
        if not auth.is_nonce(hello.nonce):
            raise ServiceError(ErrorCode.AUTH_FAILED, f"need a {auth.NONCE_BYTES}-byte nonce")
        server_nonce = auth.nonce()
        channel.send(Challenge(server_nonce, auth.server_proof(secret, hello.nonce, server_nonce)))
        answer = await channel.recv()
        if not (
            isinstance(answer, Auth)
            and auth.verify(secret, server_nonce, hello.nonce, answer.proof)
        ):
            raise ServiceError(ErrorCode.AUTH_FAILED, "authentication failed")
        keys = auth.frame_keys(secret, hello.nonce, server_nonce)
        channel.protect(keys.server_to_client, keys.client_to_server)
    channel.send(await admit(hello))
    return hello


def _refuse(channel: Channel, code: ErrorCode, message: str) -> None:
    _log_refusal(channel, message)
    with contextlib.suppress(ConnectionLost):
        channel.send(Error(0, code, message))


def _log_refusal(channel: Channel, reason: str, level: int = logging.WARNING) -> None:
    host = channel.peer.rpartition(":")[0] or channel.peer
    _refusals.warn(log, host, "refused peer", level, peer=channel.peer, reason=reason)


# ------------------------------------------------------------------ client
async def connect_tcp(url: str, limits: Limits, timeout_s: float) -> StreamChannel:
    addr = Address.parse(url)
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(addr.host, addr.port, limit=READ_AHEAD), timeout_s
        )
    except (OSError, TimeoutError) as exc:
        raise ConnectionLost(f"cannot reach {url}: {exc}") from exc
    writer.write(PREAMBLE)
    return StreamChannel(reader, writer, limits)


async def client_handshake(channel: Channel, hello: Hello, secret: bytes | None) -> Welcome:
    """The client's side of :func:`server_handshake`. With a secret, the server must
    prove it first: a server that cannot is refused before it is told anything."""
    channel.send(hello)
    reply = await channel.recv()
    if isinstance(reply, Challenge):
        if secret is None:
            raise ServiceError(ErrorCode.AUTH_FAILED, "the tracker requires a shared secret")
        if not (
            auth.is_nonce(reply.nonce)
            and auth.verify_server(secret, hello.nonce, reply.nonce, reply.proof)
        ):
            raise ServiceError(
                ErrorCode.AUTH_FAILED,
                "the tracker could not prove the shared secret (another secret, or not "
                "your tracker)",
            )
        channel.send(Auth(auth.proof(secret, reply.nonce, hello.nonce)))
        keys = auth.frame_keys(secret, hello.nonce, reply.nonce)
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
    channel.admitted(None)
    return reply


# ------------------------------------------------------------------ HTTP
@dataclass(frozen=True)
class HttpRequest:
    """A parsed request head: the method, the target (path and query, as sent) and the
    headers, names in lower case."""

    method: str
    target: str
    headers: dict[str, str]


@dataclass(frozen=True)
class HttpReply:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


HttpHandler = Callable[[HttpRequest], HttpReply]
_REASONS = {200: "OK", 303: "See Other", 400: "Bad Request", 401: "Unauthorized",
            403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed"}
#: Request heads past this are refused; nothing lowtide serves needs more.
MAX_HTTP_HEAD = 16 << 10
MAX_HTTP_CONNECTIONS = 64


def parse_http_head(head: bytes) -> HttpRequest | None:
    """The request line and headers of ``head`` (up to the blank line), or None if it
    is not HTTP/1.x."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return HttpRequest(parts[0], parts[1], headers)


def http_bytes(reply: HttpReply) -> bytes:
    head = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Error')}",
            f"Content-Type: {reply.content_type}", f"Content-Length: {len(reply.body)}",
            "Connection: close"]
    head += [f"{name}: {value}" for name, value in reply.headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + reply.body


async def serve_http(
    host: str, port: int, handler: HttpHandler, max_connections: int = MAX_HTTP_CONNECTIONS
) -> tuple[asyncio.Server, int]:
    """A minimal HTTP/1.1 responder: one request per connection, its head at most
    :data:`MAX_HTTP_HEAD` bytes and read within ``HTTP_TIMEOUT_S``; ``handler`` makes
    the reply (it runs on this loop, so it must not block). Connections beyond
    ``max_connections`` are closed at once."""
    open_now = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal open_now
        if open_now >= max_connections:
            writer.close()
            return
        open_now += 1
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HTTP_TIMEOUT_S)
            request = parse_http_head(head)
            reply = HttpReply(400, b"not an HTTP/1.x request\n")
            writer.write(http_bytes(reply if request is None else handler(request)))
            await writer.drain()
        except (
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
            TimeoutError,
        ):
            pass
        finally:
            open_now -= 1
            writer.close()

    server = await asyncio.start_server(handle, host, port, limit=MAX_HTTP_HEAD)
    return server, int(server.sockets[0].getsockname()[1])
