"""A man in the middle on real sockets: a TCP relay between a real client and a real
tracker that rewrites the client's Hello (it knows no secret), then forwards every
byte both ways unchanged. And peers that connect from another loopback address, so
that per-address quotas can tell them from the good client on 127.0.0.1."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

from lowtide.wire import PREAMBLE, decode, encode, frame
from lowtide.wire.frames import HEADER
from lowtide.wire.messages import Hello
from tests.service.peers import _hang_up, _Listener, _read_exactly

#: Where hostile peers connect from: loopback, but not the good client's address.
OTHER_HOST = "127.0.0.2"


class HelloRewriter(_Listener):
    """Forwards to ``target``; the client's first frame (its Hello) goes through
    ``rewrite``. ``rewritten`` counts the Hellos it changed."""

    def __init__(self, target: str, rewrite: Callable[[Hello], Hello]) -> None:
        super().__init__()
        host, port = target.removeprefix("tcp://").rsplit(":", 1)
        self.target = (host, int(port))
        self.rewrite = rewrite
        self.rewritten = 0
        self.start(self._serve)

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.target)
        except OSError:
            client.close()
            return
        threading.Thread(target=_pump, args=(server, client), daemon=True).start()
        try:
            server.sendall(_read_exactly(client, len(PREAMBLE)))
            head = _read_exactly(client, HEADER.size)
            hello = decode(_read_exactly(client, HEADER.unpack(head)[0]))
            assert isinstance(hello, Hello)
            server.sendall(frame(encode(self.rewrite(hello))))
            self.rewritten += 1
            _pump(client, server)
        except OSError:
            pass
        finally:
            _hang_up(client)
            _hang_up(server)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        _hang_up(dst)


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
