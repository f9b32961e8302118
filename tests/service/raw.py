"""A raw TCP client for tests that need to misbehave below the agent's level."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from lowtide.wire import PREAMBLE, FrameDecoder, decode, encode, frame
from lowtide.wire.messages import (
    WIRE_VERSION,
    GraphSpec,
    Hello,
    Message,
    Role,
    ShardSpec,
    Welcome,
)


@dataclass
class RawClient:
    sock: socket.socket
    decoder: FrameDecoder = field(default_factory=FrameDecoder)
    ready: list[bytes] = field(default_factory=list)

    @classmethod
    def open(cls, url: str, preamble: bytes = PREAMBLE, source: str | None = None) -> RawClient:
        """Connected to ``url`` (from the address ``source``, if given)."""
        host, port = url.removeprefix("tcp://").rsplit(":", 1)
        address = None if source is None else (source, 0)
        sock = socket.create_connection((host, int(port)), timeout=5, source_address=address)
        sock.sendall(preamble)
        return cls(sock)

    @classmethod
    def welcomed(cls, url: str, role: Role = Role.AGENT, shard: ShardSpec | None = None,
                 source: str | None = None) -> RawClient:
        """Connected and through the handshake (no secret)."""
        client = cls.open(url, source=source)
        reply = client.hello(role=role, shard=shard)
        if not isinstance(reply, Welcome):
            client.close()
            raise ConnectionError(f"not welcomed: {reply}")
        return client

    def ask(self, msg: Message) -> Message:
        """Send one request, return the next message."""
        self.send(msg)
        return self.recv()

    def hello(self, graph: GraphSpec | None = None, timeout_s: float = 5.0,
              role: Role = Role.AGENT, shard: ShardSpec | None = None) -> Message:
        self.send(Hello(WIRE_VERSION, role, b"n" * 32, "raw", graph, None, shard))
        return self.recv(timeout_s)

    def send(self, msg: Message) -> None:
        self.send_raw(frame(encode(msg)))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout_s: float = 5.0) -> Message:
        """The next message; raises ConnectionError at the end of the stream."""
        self.sock.settimeout(timeout_s)
        while not self.ready:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by the server")
            self.ready.extend(self.decoder.feed(data))
        return decode(self.ready.pop(0))

    def close(self) -> None:
        self.sock.close()
