"""Hostile peers for ``lowtide bench chaos``: fuzzed frames, replayed frames, request
floods, a session that takes over another's front, a fake server that knows nothing
of the secret, a relay that rewrites the Hello, one that cuts a fresh agent's first
handshake, more connections than the tracker has file descriptors, handshakes that
never finish, and a subscription flood.
Every one of them talks to 127.0.0.1 only (some from 127.0.0.2, another loopback
address, as a peer on another host would), for a bounded count and time."""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from lowtide.bench.chaos.workload import FIRST_SLOT, GRAPH
from lowtide.core.messages import MinTimeUpdate
from lowtide.service import Agent, TrackerService
from lowtide.wire import (
    PREAMBLE,
    WIRE_VERSION,
    FrameDecoder,
    GraphSpec,
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
OTHER_HOST = "127.0.0.2"
CONNECTIONS = 1_000  # more than the "fd exhaustion" tracker has descriptors (512)
SLOW_HANDSHAKES = 100  # per address, held; those the tracker drops renewed twice a second
SUBSCRIBERS, SUBSCRIPTIONS = 16, 1_024  # agents, subscriptions each


@dataclass
class Attack:
    """Hostile peers running on threads until :meth:`stop`; counts what they sent."""

    url: str
    secret: bytes | None
    kinds: tuple[str, ...] = ("fuzz", "flood", "hijack", "replay")  # methods, "_" for " "
    sent: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _held: list[socket.socket] = field(default_factory=list)

    def start(self) -> None:
        for name in self.kinds:
            fn = getattr(self, "_" + name.replace(" ", "_"))
            self.sent[name] = 0
            t = threading.Thread(target=self._guard, args=(name, fn), daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(15)
        for sock in self._held:
            with contextlib.suppress(OSError):
                sock.close()

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


    def _replay(self) -> None:
        """Record what a real agent sends (through a relay), then send those bytes
        again on fresh connections: its handshake and its frames, verbatim."""
        host, port = self.url.removeprefix("tcp://").rsplit(":", 1)
        recorded = bytearray()
        relay = socket.create_server(("127.0.0.1", 0))
        relay_port = relay.getsockname()[1]
        threading.Thread(target=_relay_once, args=(relay, (host, int(port)), recorded),
                         daemon=True).start()
        with (Agent.connect(f"tcp://127.0.0.1:{relay_port}", GRAPH, secret=self.secret)
              as agent, contextlib.suppress(Exception)):
            agent.status(timeout_s=3)
            agent.min_time_at("sink", 0, 3)
        relay.close()
        while not self._stop.is_set() and self.sent["replay"] < 200:
            with contextlib.suppress(OSError), socket.create_connection(
                    (host, int(port)), timeout=1) as sock:
                sock.sendall(bytes(recorded))
                sock.settimeout(0.05)
                with contextlib.suppress(OSError):
                    sock.recv(4096)
            self.sent["replay"] += 1


    def _connections(self) -> None:
        """Connections from another address that send the preamble and then nothing,
        kept open: more than a tracker under `ulimit -n 1024` has descriptors for,
        opened within about a second (several threads)."""
        def open_some() -> None:
            while not self._stop.is_set() and self.sent["connections"] < CONNECTIONS:
                self._hold(OTHER_HOST, PREAMBLE, "connections")

        openers = [threading.Thread(target=open_some, daemon=True) for _ in range(8)]
        for t in openers:
            t.start()
        for t in openers:
            t.join()

    def _slow_handshakes(self) -> None:
        """Handshakes that start a Hello and never finish it, from another address and
        from the good clients' own: more than the tracker admits (the scenario runs it
        with 64), renewed as the tracker drops them, while the good clients reconnect
        (the scenario restarts the tracker)."""
        partial = PREAMBLE + (200).to_bytes(4, "little")[:2]

        def hold_from(source: str) -> None:
            mine: list[socket.socket] = []
            while not self._stop.is_set():
                while len(mine) < SLOW_HANDSHAKES and not self._stop.is_set():
                    mine.append(self._hold(source, partial, "slow handshakes"))
                time.sleep(0.5)
                mine = [s for s in mine if _open(s)]

        holders = [threading.Thread(target=hold_from, args=(source,), daemon=True)
                   for source in (OTHER_HOST, "127.0.0.1")]
        for t in holders:
            t.start()
        for t in holders:
            t.join()

    def _hold(self, source: str, data: bytes, kind: str) -> socket.socket:
        """A connection from ``source`` that sent ``data`` (closed if it failed)."""
        sock = socket.socket()
        with contextlib.suppress(OSError):
            sock = _connect_from(source, self.url)
            self._held.append(sock)
            sock.sendall(data)
        self.sent[kind] += 1
        return sock

    def _subscriptions(self) -> None:
        """Authenticated agents that each subscribe until refused (the quotas)."""
        agents = [Agent.connect(self.url, GRAPH, secret=self.secret)
                  for _ in range(SUBSCRIBERS)]
        try:
            for agent in agents:
                for _ in range(SUBSCRIPTIONS):
                    if self._stop.is_set():
                        return
                    try:
                        agent.on_update(lambda _u: None, "sink")
                    except Exception:
                        break  # refused: a quota
                    finally:
                        self.sent["subscriptions"] += 1
            self._stop.wait()
        finally:
            for agent in agents:
                agent.close(timeout_s=1.0)


def _connect_from(source: str, url: str) -> socket.socket:
    host, port = url.removeprefix("tcp://").rsplit(":", 1)
    sock = socket.socket()
    sock.settimeout(1.0)
    try:
        sock.bind((source, 0))
        sock.connect((host, int(port)))
    except OSError:
        sock.close()
        raise
    return sock


def _open(sock: socket.socket) -> bool:
    """False once the peer closed it (then it is closed here too)."""
    try:
        sock.setblocking(False)
        closed = sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return True
    except OSError:
        closed = True
    if closed:
        sock.close()
    return not closed


def _relay_once(listener: socket.socket, target: tuple[str, int], recorded: bytearray) -> None:
    """Relay one connection both ways, keeping what the client sent."""
    listener.settimeout(5)
    with contextlib.suppress(OSError):
        client, _ = listener.accept()
        with client, socket.create_connection(target, timeout=5) as server:
            threading.Thread(target=_pump, args=(server, client), daemon=True).start()
            client.settimeout(5)
            while data := client.recv(65536):
                recorded.extend(data)
                server.sendall(data)


def fooled_by_fake_server(secret: bytes | None) -> bool:
    """Whether an agent believes a server that knows nothing of the secret: the fake
    welcomes it at once and says every segment is complete up to :data:`LIE`."""
    with _agent_through(_fake_server, secret=secret) as agent:
        try:
            sub = agent.subscribe("sink", timeout_s=3.0)
            update = next(iter(sub))
            return isinstance(update, MinTimeUpdate) and update.time >= LIE
        except Exception:
            return False


@contextlib.contextmanager
def _agent_through(
    serve: Callable[..., None], *args: Any, secret: bytes | None
) -> Iterator[Agent]:
    """An agent connected to a listener that ``serve(listener, *args)`` runs on a
    thread (a fake server, a relay); agent, listener and thread end with the block."""
    listener = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=serve, args=(listener, *args), daemon=True)
    thread.start()
    agent = Agent.connect(f"tcp://127.0.0.1:{listener.getsockname()[1]}", GRAPH,
                          secret=secret, connect_timeout_s=2.0)
    try:
        yield agent
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


def fooled_by_rewritten_hello(secret: bytes | None) -> bool:
    """Whether a relay that knows no secret can make a fresh tracker and an agent agree
    on a graph the agent never sent: it rewrites the Hello's graph (same names, sink
    no longer fed by src, so the sink's min time would not wait for src's items)."""
    rewired = tuple((name, ()) for name in GRAPH.names)
    with TrackerService.start(None, secret=secret) as tracker:
        with _agent_through(_rewrite_hello, tracker.url, rewired, secret=secret) as agent:
            try:
                agent.status(timeout_s=3.0)
                believed = True
            except Exception:
                believed = False
        return believed or "segments" in tracker.status()


def locked_out_by_a_cut_handshake(secret: bytes | None) -> bool:
    """Whether a fresh agent stays out when its first connection is cut during the
    handshake (by the tracker's admission gate under a burst from its own address, or
    by the network): a relay hangs up on it as soon as it is accepted, then forwards
    the next. Its first call, a front registration, must go through within 10 s (it
    waited for a Welcome that its idle connection never dialled for)."""
    with TrackerService.start(None, secret=secret) as tracker, _agent_through(
            _cut_first, tracker.url, secret=secret) as agent:
        try:
            agent.register_front(1, "src", FIRST_SLOT, timeout_s=10.0)
            return False
        except Exception:
            return True


def _cut_first(listener: socket.socket, target: str) -> None:
    listener.settimeout(10)
    host, port = target.removeprefix("tcp://").rsplit(":", 1)
    with contextlib.suppress(OSError):
        first, _ = listener.accept()
        first.close()
        client, _ = listener.accept()
        with client, socket.create_connection((host, int(port)), timeout=5) as server:
            threading.Thread(target=_pump, args=(server, client), daemon=True).start()
            _pump(client, server)


def _rewrite_hello(listener: socket.socket, target: str, graph: GraphSpec) -> None:
    listener.settimeout(5)
    host, port = target.removeprefix("tcp://").rsplit(":", 1)
    with contextlib.suppress(OSError):
        client, _ = listener.accept()
        with client, socket.create_connection((host, int(port)), timeout=5) as server:
            threading.Thread(target=_pump, args=(server, client), daemon=True).start()
            client.settimeout(5)
            server.sendall(_exactly(client, len(PREAMBLE)))
            size = int.from_bytes(_exactly(client, 4), "little")
            hello = decode(_exactly(client, size))
            assert isinstance(hello, Hello)
            server.sendall(frame(encode(replace(hello, graph=graph))))
            _pump(client, server)


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_RDWR)
