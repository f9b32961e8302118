"""The one module that talks to the network: asyncio TCP streams, framing I/O, and a
small HTTP responder (Prometheus metrics, the web view); what it answers comes from
handlers that only turn a request into bytes (the handshake: :mod:`.handshake`).

Limits (:class:`Limits`): until a peer is admitted its frames may be at most
``max_handshake_frame`` long, and preamble and handshake together must end within
``handshake_timeout_s`` of the connection being accepted; unfinished handshakes have
slots of their own (``max_handshakes``, ``max_handshakes_per_host``; see
:mod:`.server.admission`). Afterwards a frame longer than ``max_frame`` ends the connection
(its length cannot be trusted, so neither can anything after it), and a server drops
a peer that sends nothing, not even a keepalive, for ``idle_timeout_s``. A peer that
does not read its messages fast enough is dropped once ``max_buffer`` bytes wait for
it. A server admits at most ``max_connections`` peers at once, fewer if the file
limit requires it (:func:`.server.admission.fit_file_limit`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from lowtide.service.channel import Address
from lowtide.service.errors import ConnectionLost
from lowtide.service.handshake import log_refusal
from lowtide.service.server.admission import Gate, Ticket
from lowtide.wire.codec import decode, encode
from lowtide.wire.frames import (
    DEFAULT_MAX_FRAME,
    HEADER,
    PREAMBLE,
    FrameSeal,
    check_length,
)
from lowtide.wire.messages import Message

HTTP_TIMEOUT_S = 10.0
#: How far a stream reads ahead of what is parsed; a frame may still be longer.
READ_AHEAD = 256 << 10


@dataclass(frozen=True)
class Limits:
    """What one peer can make a process hold; see the module docstring. The quotas
    of standing requests (pending ``MinTimeAt`` questions, live subscriptions) hold
    per connection, per address (a host's connections together) and in all; the
    last bounds the work one step's notifications may cost."""

    max_frame: int = DEFAULT_MAX_FRAME
    max_buffer: int = 64 << 20
    #: a Hello of 4,000 segments with 20-character names fits
    max_handshake_frame: int = 256 << 10
    handshake_timeout_s: float = 5.0
    max_handshakes: int = 64
    max_handshakes_per_host: int = 8
    idle_timeout_s: float = 60.0
    keepalive_s: float = 15.0  # clients send an empty frame this often
    max_connections: int = 1024
    max_questions_per_peer: int = 1024
    max_questions_per_host: int = 4096
    max_questions: int = 16_384
    max_subscriptions_per_peer: int = 1024
    max_subscriptions_per_host: int = 2048
    max_subscriptions: int = 8192


def _address(writer: asyncio.StreamWriter) -> tuple[str, str]:
    """The peer's host and its ``host:port``."""
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple):
        return str(peer[0]), f"{peer[0]}:{peer[1]}"
    return str(peer), str(peer)


class StreamChannel:
    """Frames over an asyncio stream pair; sealed (see :meth:`protect`) once the
    handshake has proven a shared secret."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limits: Limits
    ) -> None:
        self._reader, self._writer, self._limits = reader, writer, limits
        self._max_frame = limits.max_handshake_frame
        self._idle_timeout_s: float | None = None
        self._heard_s = 0.0  # the loop's time of the last whole frame
        self._idle_watch: asyncio.TimerHandle | None = None
        self._silent = False  # closed for silence
        self._seal: FrameSeal | None = None
        self._unseal: FrameSeal | None = None
        self.host, self.peer = _address(writer)

    def protect(self, send_key: bytes, recv_key: bytes) -> None:
        """From now on every frame carries a MAC, and one that fails ends the stream."""
        self._seal, self._unseal = FrameSeal(send_key), FrameSeal(recv_key)

    def admitted(self, idle_timeout_s: float | None) -> None:
        """The handshake is over: full-size frames; ``idle_timeout_s`` for recv."""
        self._max_frame = self._limits.max_frame
        self._idle_timeout_s = idle_timeout_s
        if idle_timeout_s is not None:
            loop = asyncio.get_running_loop()
            self._heard_s = loop.time()
            self._idle_watch = loop.call_at(self._heard_s + idle_timeout_s, self._watch, loop)

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Silent for ``idle_timeout_s``: abort, and the read that waits ends. One
        timer per idle period, not one around each read (an ``asyncio.timeout`` per
        frame cost the tracker about 4% of a request)."""
        assert self._idle_timeout_s is not None
        due = self._heard_s + self._idle_timeout_s
        if loop.time() < due:
            self._idle_watch = loop.call_at(due, self._watch, loop)
            return
        self._silent = True
        self._writer.transport.abort()

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
            (length,) = HEADER.unpack(await self._reader.readexactly(HEADER.size))
            check_length(length, self._max_frame)
            frame = await self._reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if self._idle_watch is not None:  # the connection is over: so is its watch
                self._idle_watch.cancel()
            if self._silent:
                raise ConnectionLost(
                    f"{self.peer}: nothing received for {self._idle_timeout_s} s"
                ) from None
            raise ConnectionLost(f"{self.peer}: {exc}") from exc
        if self._idle_watch is not None:
            self._heard_s = asyncio.get_running_loop().time()
        return frame

    def send(self, msg: Message) -> None:
        self._write([encode(msg)])

    def send_all(self, msgs: Sequence[Message]) -> None:
        self._write([encode(m) for m in msgs])

    def keepalive(self) -> None:
        self._write([b""])

    def _write(self, payloads: list[bytes]) -> None:
        """Frame ``payloads`` and write them with one call (a send each costs the
        tracker about 0.2 ms on a loaded 2-core machine: the syscall and the peer's
        wake-up)."""
        if self._writer.is_closing():
            raise ConnectionLost(f"{self.peer} closed")
        if self._seal is not None:
            payloads = [self._seal.seal(p) for p in payloads]
        frames = b"".join(part for p in payloads for part in (HEADER.pack(len(p)), p))
        waiting = self._writer.transport.get_write_buffer_size()
        if waiting + len(frames) > self._limits.max_buffer:
            self.close()
            raise ConnectionLost(f"{self.peer}: {waiting} bytes unread, over the buffer limit")
        self._writer.write(frames)

    async def drain(self) -> None:
        try:
            await self._writer.drain()
        except ConnectionError as exc:
            raise ConnectionLost(f"{self.peer}: {exc}") from exc

    def close(self) -> None:
        if self._idle_watch is not None:
            self._idle_watch.cancel()
        self._writer.close()


# ------------------------------------------------------------------ server
OnChannel = Callable[[StreamChannel, Ticket], Awaitable[None]]


async def serve_tcp(
    host: str, port: int, on_channel: OnChannel, gate: Gate
) -> tuple[asyncio.Server, int]:
    """Listen; each connection gets a :class:`Ticket` from ``gate`` (see
    :mod:`.server.admission`), and once it sends the right preamble it becomes a channel."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        channel = StreamChannel(reader, writer, gate.limits)
        ticket = gate.arrive(channel.host, asyncio.current_task())
        try:
            # Dropped to make room (see Gate), or the server is stopping; Python 3.11
            # would log a cancelled handler as an error.
            with contextlib.suppress(asyncio.CancelledError):
                await _handle(reader, channel, on_channel, ticket)
        finally:
            gate.leave(ticket)
            writer.close()

    server = await asyncio.start_server(handle, host, port, limit=READ_AHEAD)
    bound = server.sockets[0].getsockname()[1]
    return server, int(bound)


async def _handle(
    reader: asyncio.StreamReader, channel: StreamChannel, on_channel: OnChannel, ticket: Ticket
) -> None:
    try:
        async with asyncio.timeout_at(ticket.deadline):
            preamble = await reader.readexactly(len(PREAMBLE))
    except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
        return
    if preamble != PREAMBLE:
        log_refusal(channel, "bad preamble")
        return
    await on_channel(channel, ticket)


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
    :data:`MAX_HTTP_HEAD` bytes and read within ``HTTP_TIMEOUT_S`` of the accept;
    ``handler`` makes the reply (it runs on this loop, so it must not block). At most
    ``max_connections`` at once, 8 per address: past that the oldest is dropped for
    the new one (see :mod:`.server.admission`), so slow requests never lock a scraper out."""
    gate = Gate(Limits(max_handshakes=max_connections, handshake_timeout_s=HTTP_TIMEOUT_S))

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ticket = gate.arrive(_address(writer)[0], asyncio.current_task())
        try:
            async with asyncio.timeout_at(ticket.deadline):
                head = await reader.readuntil(b"\r\n\r\n")
                request = parse_http_head(head)
                reply = HttpReply(400, b"not an HTTP/1.x request\n")
                writer.write(http_bytes(reply if request is None else handler(request)))
                await writer.drain()
        except (
            asyncio.CancelledError,  # dropped to make room
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
            TimeoutError,
        ):
            pass
        finally:
            gate.leave(ticket)
            writer.close()

    server = await asyncio.start_server(handle, host, port, limit=MAX_HTTP_HEAD)
    return server, int(server.sockets[0].getsockname()[1])
