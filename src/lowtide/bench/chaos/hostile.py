"""Hostile peers for ``lowtide bench chaos``: fuzzed frames, request floods, a session
that takes over another's front, and a fake server that knows nothing of the secret.
Every one of them talks to 127.0.0.1 only, for a bounded count and time."""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from lowtide.bench.chaos.workload import FIRST_SLOT, GRAPH
from lowtide.core.messages import MinTimeUpdate
from lowtide.service import Agent
from lowtide.wire import (
    PREAMBLE,
    WIRE_VERSION,
    FrameDecoder,
    Hello,
    Notify,
    Ok,
    Role,
    Subscribe,
    Welcome,
    decode,
    encode,
    frame,
    graph_spec,
)

LIE = 999_999  # the fake server's claim: everything below is complete
FLOOD_THREADS = 8
FLOOD_REQUESTS = 50_000


@dataclass
class Attack:
    """Hostile peers running on threads until :meth:`stop`; counts what they sent."""

    url: str
    secret: bytes | None
    sent: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for name, fn in (("fuzz", self._fuzz), ("flood", self._flood),
                         ("hijack", self._hijack)):
            self.sent[name] = 0
            t = threading.Thread(target=self._guard, args=(name, fn), daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)

    def _guard(self, name: str, fn: Callable[[], None]) -> None:
        with contextlib.suppress(Exception):  # a hostile peer's failure is its own
            fn()

    def _fuzz(self) -> None:
        """Random bytes, random frames and mutated valid frames, each on a connection."""
        rng = random.Random(7)
        hello = encode(Hello(WIRE_VERSION, Role.AGENT, b"n" * 32, "fuzz", graph_spec(GRAPH)))
        host, port = self.url.removeprefix("tcp://").rsplit(":", 1)
        while not self._stop.is_set() and self.sent["fuzz"] < 2_000:
            mutated = bytearray(hello)
            for _ in range(rng.randint(1, 4)):
                mutated[rng.randrange(len(mutated))] = rng.randrange(256)
            payload = rng.choice([PREAMBLE + rng.randbytes(rng.randint(1, 300)),
                                  PREAMBLE + frame(rng.randbytes(rng.randint(1, 300))),
                                  PREAMBLE + frame(bytes(mutated)),
                                  rng.randbytes(rng.randint(1, 64))])
            with contextlib.suppress(OSError), socket.create_connection(
                    (host, int(port)), timeout=1) as sock:
                sock.sendall(payload)
                sock.settimeout(0.05)
                with contextlib.suppress(OSError):
                    sock.recv(4096)
            self.sent["fuzz"] += 1

    def _flood(self) -> None:
        """Authenticated peers asking past min times as fast as they can (several
        threads) and piling up subscriptions."""
        with Agent.connect(self.url, GRAPH, secret=self.secret) as agent:
            askers = [threading.Thread(target=self._ask, args=(agent,), daemon=True)
                      for _ in range(FLOOD_THREADS)]
            for t in askers:
                t.start()
            while not self._stop.is_set() and self.sent["flood"] < FLOOD_REQUESTS:
                with contextlib.suppress(Exception):  # refused: a quota, or a restart
                    agent.on_update(lambda _u: None, "sink")
                self.sent["flood"] += 1
                time.sleep(0.001)
            for t in askers:
                t.join(10)

    def _ask(self, agent: Agent) -> None:
        while not self._stop.is_set() and self.sent["flood"] < FLOOD_REQUESTS:
            try:
                agent.min_time_at("sink", int(time.time() * 1000) - 1_000, 2.0)
            except Exception:
                time.sleep(0.01)
            self.sent["flood"] += 1

    def _hijack(self) -> None:
        """Another session unregisters a good front and registers it far ahead."""
        with Agent.connect(self.url, GRAPH, secret=self.secret) as agent:
            time.sleep(0.3)
            for op in (lambda: agent.unregister_front(0, timeout_s=3),
                       lambda: agent.register_front(0, "src", FIRST_SLOT + 10_000, 3)):
                with contextlib.suppress(Exception):
                    op()
                self.sent["hijack"] += 1


def fooled_by_fake_server(secret: bytes | None) -> bool:
    """Whether an agent believes a server that knows nothing of the secret: the fake
    welcomes it at once and says every segment is complete up to :data:`LIE`."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    thread = threading.Thread(target=_fake_server, args=(listener,), daemon=True)
    thread.start()
    agent = Agent.connect(f"tcp://127.0.0.1:{port}", GRAPH, secret=secret,
                          connect_timeout_s=2.0)
    try:
        sub = agent.subscribe("sink", timeout_s=3.0)
        update = next(iter(sub))
        return isinstance(update, MinTimeUpdate) and update.time >= LIE
    except Exception:
        return False
    finally:
        agent.close(timeout_s=1.0)
        listener.close()
        thread.join(5)


def _fake_server(listener: socket.socket) -> None:
    listener.settimeout(5)
    with contextlib.suppress(OSError):
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(5)
            preamble = b""
            while len(preamble) < len(PREAMBLE):
                chunk = conn.recv(len(PREAMBLE) - len(preamble))
                if not chunk:
                    return
                preamble += chunk
            decoder, welcomed = FrameDecoder(), False
            while data := conn.recv(65536):
                for payload in decoder.feed(data):
                    msg = decode(payload)
                    if not welcomed:
                        conn.sendall(frame(encode(Welcome(
                            WIRE_VERSION, "fake", graph_spec(GRAPH), 10, 1))))
                        welcomed = True
                    if isinstance(msg, Subscribe):
                        lie = Notify(((msg.req, MinTimeUpdate("sink", LIE)),))
                        conn.sendall(frame(encode(Ok(msg.req))) + frame(encode(lie)))
