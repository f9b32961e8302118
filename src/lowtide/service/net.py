"""The one module that talks to the network: asyncio TCP streams, framing I/O, the
handshake, and the small HTTP endpoint for Prometheus.

Limits: a frame longer than ``max_frame`` ends the connection (its length cannot be
trusted, so neither can anything after it); a peer that does not read its messages
fast enough is dropped once ``max_buffer`` bytes wait for it.
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
from lowtide.wire.codec import decode, encode
from lowtide.wire.frames import DEFAULT_MAX_FRAME, HEADER, PREAMBLE, check_length
from lowtide.wire.messages import Auth, Challenge, Error, ErrorCode, Hello, Message, Welcome

log = logging.getLogger("lowtide.service.net")

HTTP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Limits:
    max_frame: int = DEFAULT_MAX_FRAME
    max_buffer: int = 64 << 20
    handshake_timeout_s: float = 10.0


class StreamChannel:
    """Frames over an asyncio stream pair."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limits: Limits
    ) -> None:
        self._reader, self._writer, self._limits = reader, writer, limits
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    async def recv(self) -> Message:
        """Next message. WireError for a malformed payload (the stream stays in step);
        FrameTooLarge for an oversized one; ConnectionLost at the end."""
        try:
            (length,) = HEADER.unpack(await self._reader.readexactly(HEADER.size))
            check_length(length, self._limits.max_frame)
            payload = await self._reader.readexactly(length)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise ConnectionLost(f"{self.peer}: {exc}") from exc
        return decode(payload)

    def send(self, msg: Message) -> None:
        if self._writer.is_closing():
            raise ConnectionLost(f"{self.peer} closed")
        payload = encode(msg)
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


async def serve_tcp(
    host: str,
    port: int,
    on_channel: Callable[[StreamChannel], Awaitable[None]],
    limits: Limits,
) -> tuple[asyncio.Server, int]:
    """Listen; each connection that sends the right preamble becomes a channel."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        channel = StreamChannel(reader, writer, limits)
        try:
            preamble = await asyncio.wait_for(
                reader.readexactly(len(PREAMBLE)), limits.handshake_timeout_s
            )
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            writer.close()
            return
        if preamble != PREAMBLE:
            log.warning("refused peer", extra={"peer": channel.peer, "reason": "bad preamble"})
            writer.close()
            return
        try:
            await on_channel(channel)
        except asyncio.CancelledError:
            pass  # the server is stopping; Python 3.11 would log a cancelled handler as an error
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port, limit=limits.max_frame + 64)
    bound = server.sockets[0].getsockname()[1]
    return server, int(bound)


async def server_handshake(
    channel: Channel, secret: bytes | None, admit: Admit, timeout_s: float
) -> Hello | None:
    """Hello, then (with a secret) the HMAC challenge, then Welcome or Error.
    Returns the Hello of an admitted peer; None (after telling it why) otherwise."""
    try:
        return await asyncio.wait_for(_server_handshake(channel, secret, admit), timeout_s)
    except TimeoutError:
        _refuse(channel, ErrorCode.BAD_REQUEST, "handshake timed out")
    except ServiceError as exc:
        _refuse(channel, exc.code, str(exc))
    except ValueError as exc:  # WireError and friends: garbage instead of a handshake
        _refuse(channel, ErrorCode.BAD_FRAME, str(exc))
    except ConnectionLost:
        log.info("peer left during handshake", extra={"peer": channel.peer})
    return None


async def _server_handshake(channel: Channel, secret: bytes | None, admit: Admit) -> Hello:
    hello = await channel.recv()
    if not isinstance(hello, Hello):
        raise ServiceError(ErrorCode.BAD_FRAME, f"expected Hello, got {type(hello).__name__}")
    if secret is not None:
        server_nonce = auth.nonce()
        channel.send(Challenge(server_nonce))
        answer = await channel.recv()
        if not (
            isinstance(answer, Auth)
            and auth.verify(secret, server_nonce, hello.nonce, answer.proof)
        ):
            raise ServiceError(ErrorCode.AUTH_FAILED, "authentication failed")
    channel.send(await admit(hello))
    return hello


def _refuse(channel: Channel, code: ErrorCode, message: str) -> None:
    log.warning("refused peer", extra={"peer": channel.peer, "reason": message})
    with contextlib.suppress(ConnectionLost):
        channel.send(Error(0, code, message))


# ------------------------------------------------------------------ client
async def connect_tcp(url: str, limits: Limits, timeout_s: float) -> StreamChannel:
    addr = Address.parse(url)
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(addr.host, addr.port, limit=limits.max_frame + 64), timeout_s
        )
    except (OSError, TimeoutError) as exc:
        raise ConnectionLost(f"cannot reach {url}: {exc}") from exc
    writer.write(PREAMBLE)
    return StreamChannel(reader, writer, limits)


async def client_handshake(channel: Channel, hello: Hello, secret: bytes | None) -> Welcome:
    channel.send(hello)
    reply = await channel.recv()
    if isinstance(reply, Challenge):
        if secret is None:
            raise ServiceError(ErrorCode.AUTH_FAILED, "the tracker requires a shared secret")
        channel.send(Auth(auth.proof(secret, reply.nonce, hello.nonce)))
        reply = await channel.recv()
    if isinstance(reply, Error):
        raise exception_of(reply)
    if not isinstance(reply, Welcome):
        raise ServiceError(ErrorCode.BAD_FRAME, f"expected Welcome, got {type(reply).__name__}")
    return reply


# ------------------------------------------------------------------ metrics
async def serve_http(
    host: str, port: int, render: Callable[[], bytes]
) -> tuple[asyncio.Server, int]:
    """A minimal HTTP/1.0 responder: any GET returns ``render()`` as Prometheus text."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HTTP_TIMEOUT_S)
            body = render()
            head = (
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        except (
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
            TimeoutError,
        ):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, host, port, limit=16 << 10)
    return server, int(server.sockets[0].getsockname()[1])
