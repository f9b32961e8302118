"""Hostile peers on real sockets: a fake tracker that knows no secret, a proxy that
alters one frame on its way to the tracker, and one that hangs up on the first
connection."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from lowtide.core.messages import MinTimeUpdate
from lowtide.wire import PREAMBLE, FrameDecoder, decode, encode, frame
from lowtide.wire.frames import HEADER
from lowtide.wire.messages import Hello, Message, Notify, Ok, Subscribe


@dataclass
class _Listener:
    sock: socket.socket = field(default_factory=lambda: socket.create_server(("127.0.0.1", 0)))
    threads: list[threading.Thread] = field(default_factory=list)
    closing: bool = False

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"

    def start(self, serve: Callable[[socket.socket], None]) -> None:
        def accept() -> None:
            while not self.closing:
                try:
                    conn, _ = self.sock.accept()
                except OSError:
                    return
                worker = threading.Thread(target=serve, args=(conn,), daemon=True)
                worker.start()
                self.threads.append(worker)

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        self.threads.append(thread)

    def close(self) -> None:
        self.closing = True
        self.sock.close()


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


class FakeTracker(_Listener):
    """Answers a Hello with ``script(hello)``, frames a server that does not know the
    secret might send; then confirms every request and tells each subscriber that
    the min time is ``lie``. Keeps what it received in ``received``."""

    def __init__(self, script: Callable[[Hello], list[Message]], lie: int = 999_999) -> None:
        super().__init__()
        self.script, self.lie = script, lie
        self.received: list[Message] = []
        self.start(self._serve)

    def _serve(self, conn: socket.socket) -> None:
        decoder = FrameDecoder()
        try:
            _read_exactly(conn, len(PREAMBLE))
            while data := conn.recv(65536):
                for payload in decoder.feed(data):
                    msg = decode(payload)
                    self.received.append(msg)
                    conn.sendall(b"".join(frame(encode(m)) for m in self._answer(msg)))
        except (OSError, ValueError):
            pass
        finally:
            conn.close()

    def _answer(self, msg: Message) -> list[Message]:
        if isinstance(msg, Hello):
            return self.script(msg)
        req = getattr(msg, "req", None)
        if req is None:
            return []
        if isinstance(msg, Subscribe):
            return [Ok(req), Notify(((req, MinTimeUpdate(msg.segment, self.lie)),))]
        return [Ok(req)]


class FrameProxy(_Listener):
    """Forwards to ``target``; each client frame's payload goes through ``alter``, which
    returns it changed (counted in ``altered``) or None (forwarded as it is)."""

    def __init__(self, target: str, alter: Callable[[bytes], bytes | None]) -> None:
        super().__init__()
        host, port = target.removeprefix("tcp://").rsplit(":", 1)
        self.target = (host, int(port))
        self.alter = alter
        self.altered = 0
        self.start(self._serve)

    def _serve(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(self.target)
        except OSError:
            client.close()
            return
        threading.Thread(target=pump, args=(server, client), daemon=True).start()
        try:
            server.sendall(_read_exactly(client, len(PREAMBLE)))
            while True:
                head = _read_exactly(client, HEADER.size)
                payload = _read_exactly(client, HEADER.unpack(head)[0])
                changed = self.alter(payload)
                if changed is not None:
                    self.altered += 1
                    head, payload = HEADER.pack(len(changed)), changed
                server.sendall(head + payload)
        except OSError:
            pass
        finally:
            _hang_up(client)
            _hang_up(server)


class HangsUpFirst(FrameProxy):
    """Forwards to ``target``, but hangs up on the first connection as soon as it is
    accepted (a handshake lost to the gate, or to the network); counts it in ``hung_up``."""

    def __init__(self, target: str) -> None:
        self.hung_up = 0
        super().__init__(target, lambda _payload: None)

    def _serve(self, client: socket.socket) -> None:
        if not self.hung_up:
            self.hung_up += 1
            _hang_up(client)
            return
        super()._serve(client)


class AlteringProxy(FrameProxy):
    """Flips bit 0 of byte ``offset`` in the first client frame whose type byte is
    ``kind`` (then forwards everything unchanged)."""

    def __init__(self, target: str, kind: int, offset: int) -> None:
        def flip(payload: bytes) -> bytes | None:
            if self.altered or payload[:1] != bytes([kind]):
                return None
            flipped = bytearray(payload)
            flipped[offset] ^= 1
            return bytes(flipped)

        super().__init__(target, flip)


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until either ends."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        _hang_up(dst)


def _hang_up(sock: socket.socket) -> None:
    """shutdown, not just close: another thread may be blocked reading it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()
