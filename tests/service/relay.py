"""A man in the middle on real sockets: a TCP relay between a real client and a real
tracker that rewrites the client's Hello (it knows no secret), then forwards every
byte both ways unchanged. And peers that connect from another loopback address, so
that per-address quotas can tell them from the good client on 127.0.0.1."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable

from lowtide.wire import decode, encode
from lowtide.wire.messages import Hello
from tests.service.peers import FrameProxy

#: Where hostile peers connect from: loopback, but not the good client's address.
OTHER_HOST = "127.0.0.2"


class HelloRewriter(FrameProxy):
    """Forwards to ``target``; the client's Hello goes through ``rewrite``.
    ``altered`` counts the Hellos it changed."""

    def __init__(self, target: str, rewrite: Callable[[Hello], Hello]) -> None:
        def alter(payload: bytes) -> bytes | None:
            msg = decode(payload)
            return encode(rewrite(msg)) if isinstance(msg, Hello) else None

        super().__init__(target, alter)


def connect_from(host: str, url: str, timeout_s: float = 5.0) -> socket.socket:
    """A TCP connection to ``url`` whose source address is ``host``."""
    addr, port = url.removeprefix("tcp://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.bind((host, 0))
        sock.connect((addr, int(port)))
    except OSError:
        sock.close()
        raise
    return sock


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.close()
