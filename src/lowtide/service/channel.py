"""A channel carries messages between two peers; :mod:`.net` makes TCP ones, this
module the in-process kind (no socket, no bytes) and the URL scheme that picks one.

An in-process channel joins two event loops, possibly on different threads: each
side owns an asyncio queue that the other side fills with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from lowtide.service.errors import ConnectionLost
from lowtide.wire.messages import Message

_CLOSED = object()


class Channel(Protocol):
    peer: str

    async def recv(self) -> Message:
        """The next message; ConnectionLost when the peer is gone."""

    def send(self, msg: Message) -> None:
        """Queue a message without waiting; ConnectionLost if the channel is closed."""

    def send_all(self, msgs: Sequence[Message]) -> None:
        """:meth:`send` each of ``msgs``, in order, in one write: one wake-up of the
        peer for replies it reads together."""

    async def drain(self) -> None:
        """Wait until the outgoing buffer is small again."""

    def keepalive(self) -> None:
        """Tell the peer we are here, without a message."""

    def protect(self, send_key: bytes, recv_key: bytes) -> None:
        """MAC every later frame (the handshake proved a shared secret)."""

    def admitted(self, idle_timeout_s: float | None) -> None:
        """The handshake is over: lift its limits, apply ``idle_timeout_s``."""

    def close(self) -> None: ...


MAX_PORT = 65_535


@dataclass(frozen=True)
class Address:
    scheme: str  # "tcp" or "inproc"
    host: str
    port: int

    @classmethod
    def parse(cls, url: str) -> Address:
        scheme, sep, rest = url.partition("://")
        if not sep or scheme not in ("tcp", "inproc"):
            raise ValueError(f"tracker URL must be tcp://HOST:PORT or inproc://NAME, got {url!r}")
        if scheme == "inproc":
            return cls(scheme, rest, 0)
        host, _, port = rest.rpartition(":")
        if not host or not port.isdigit() or int(port) > MAX_PORT:
            raise ValueError(
                f"tracker URL must be tcp://HOST:PORT (port 0-{MAX_PORT}), got {url!r}"
            )
        return cls(scheme, host.strip("[]"), int(port))

    def url(self) -> str:
        return (
            f"inproc://{self.host}" if self.scheme == "inproc" else f"tcp://{self.host}:{self.port}"
        )


def tracker_urls(url: str) -> list[str]:
    """The addresses of ``url``: one, or a group's trackers separated by commas
    (``tcp://a:7433,tcp://b:7433``, rule 18); a ValueError names a bad one."""
    urls = [part.strip() for part in url.split(",")]
    for part in urls:
        Address.parse(part)
    return urls


class InprocChannel:
    def __init__(self, loop: asyncio.AbstractEventLoop, peer_name: str) -> None:
        self.peer = peer_name
        self._loop = loop
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._other: InprocChannel | None = None
        self._closed = False

    @staticmethod
    def pair(
        a: asyncio.AbstractEventLoop, b: asyncio.AbstractEventLoop, name: str
    ) -> tuple[InprocChannel, InprocChannel]:
        left, right = InprocChannel(a, f"inproc:{name}"), InprocChannel(b, f"inproc:{name}")
        left._other, right._other = right, left
        return left, right

    async def recv(self) -> Message:
        item = await self._queue.get()
        if item is _CLOSED:
            self._closed = True
            raise ConnectionLost(f"{self.peer} closed")
        return item  # type: ignore[return-value]

    def send(self, msg: Message) -> None:
        if self._closed or self._other is None:
            raise ConnectionLost(f"{self.peer} closed")
        self._other._push(msg)

    def send_all(self, msgs: Sequence[Message]) -> None:
        for msg in msgs:
            self.send(msg)

    async def drain(self) -> None:
        return None

    # In one process, with no bytes on any wire, there is nothing to protect or limit.
    def keepalive(self) -> None:
        pass

    def protect(self, send_key: bytes, recv_key: bytes) -> None:
        pass

    def admitted(self, idle_timeout_s: float | None) -> None:
        pass

    def close(self) -> None:
        if not self._closed and self._other is not None:
            self._other._push(_CLOSED)
        self._closed = True
        self._push(_CLOSED)

    def _push(self, item: object) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # that loop is closed: the peer is gone anyway
            self._closed = True


Acceptor = Callable[[Channel], None]
"""Called in the owner's thread-safe way with the server side of a new channel."""

_registry: dict[str, tuple[asyncio.AbstractEventLoop, Acceptor]] = {}
_registry_lock = threading.Lock()
_names = itertools.count(1)


def register_inproc(loop: asyncio.AbstractEventLoop, accept: Acceptor) -> str:
    """Make a server reachable as ``inproc://NAME`` from this process; returns the URL."""
    name = f"lowtide-{next(_names)}"
    with _registry_lock:
        _registry[name] = (loop, accept)
    return f"inproc://{name}"


def unregister_inproc(url: str) -> None:
    with _registry_lock:
        _registry.pop(Address.parse(url).host, None)


def dial_inproc(url: str, loop: asyncio.AbstractEventLoop) -> InprocChannel:
    name = Address.parse(url).host
    with _registry_lock:
        entry = _registry.get(name)
    if entry is None:
        raise ConnectionLost(f"no in-process tracker {url} in this process")
    server_loop, accept = entry
    client, server = InprocChannel.pair(loop, server_loop, name)
    server_loop.call_soon_threadsafe(accept, server)
    return client
