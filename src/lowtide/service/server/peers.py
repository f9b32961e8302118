"""The server's connection side: admission (see :mod:`.admission`), handshakes,
reading a peer's frames into the state task's inbox, refusing bad input. It never
touches the tracker's state: everything it learns goes through the inbox, in order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from lowtide.core.errors import GraphError
from lowtide.service.channel import Channel
from lowtide.service.errors import ConnectionLost, ServiceError
from lowtide.service.handshake import server_handshake
from lowtide.service.logs import LogBudget, clip
from lowtide.service.net import MAX_HTTP_CONNECTIONS, Limits
from lowtide.service.server.admission import Gate, Ticket, fit_file_limit
from lowtide.service.server.inbox import Admit, Gone, Item, Peer, Request
from lowtide.service.server.metrics import ServerMetrics
from lowtide.wire.buffers import WireError
from lowtide.wire.frames import FrameForged, FrameTooLarge
from lowtide.wire.messages import Error, ErrorCode, Hello, Welcome, graph_of

if TYPE_CHECKING:
    # for types only: ServerConfig.build() imports the server, which imports this module
    from lowtide.service.server.config import ServerConfig

log = logging.getLogger("lowtide.service.server")


class PeerConnections:
    def __init__(self, config: ServerConfig, inbox: asyncio.Queue[Item],
                 metrics: ServerMetrics, log_budget: LogBudget) -> None:
        self.config, self._inbox, self.metrics = config, inbox, metrics
        self._log_budget = log_budget
        self.peers: set[Peer] = set()
        self.tasks: set[asyncio.Task[Any]] = set()
        #: TCP connections; its limits are the config's, fitted to the file limit
        self.gate = Gate(config.limits)

    def fit_file_limit(self) -> Limits:
        """Lower max_connections so that connections, handshakes, HTTP requests, the log
        and snapshots all fit under ``ulimit -n`` (see :mod:`.admission`); returns the
        limits the server applies."""
        cfg = self.config
        http = MAX_HTTP_CONNECTIONS * ((cfg.metrics_port is not None) + (cfg.web_port is not None))
        limits = fit_file_limit(cfg.limits, http=http + len(cfg.shard_urls))
        if limits.max_connections < cfg.limits.max_connections:
            log.info("max_connections lowered to fit the file limit (raise ulimit -n for "
                     "more)", extra={"max_connections": limits.max_connections})
        self.gate = Gate(limits)
        return limits

    def close_all(self) -> None:
        for peer in list(self.peers):
            peer.channel.close()

    def accept_inproc(self, channel: Channel) -> None:
        asyncio.get_running_loop().create_task(self.serve(channel))

    async def serve(self, channel: Channel, ticket: Ticket | None = None) -> None:
        """Serve one connection: a TCP one with its ``ticket`` from :attr:`gate`, an
        in-process one without (no descriptor, nobody outside this process)."""
        # Kept so stop() can end it; this also holds the strong reference that
        # the loop (which keeps tasks weakly) does not.
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        try:
            await self._serve_peer(channel, ticket)
        finally:
            self.tasks.discard(task)

    async def _serve_peer(self, channel: Channel, ticket: Ticket | None) -> None:
        limits, gate = self.gate.limits, self.gate
        if ticket is None:
            deadline = asyncio.get_running_loop().time() + limits.handshake_timeout_s
            hello = await server_handshake(channel, self.config.secret, self._admit, deadline,
                                           limits.idle_timeout_s)
        else:
            hello = await server_handshake(channel, self.config.secret, self._admit,
                                           ticket.deadline, limits.idle_timeout_s,
                                           lambda: gate.admit(ticket),
                                           lambda: gate.greeted(ticket))
        if hello is None:
            self.metrics.refused.inc()
            return
        host = ticket.host if ticket is not None else "inproc"
        peer = Peer(channel, clip(hello.name, 128), hello.role, host)
        self.peers.add(peer)
        self.metrics.connections.inc()
        try:
            await self._read(peer)
        finally:
            self.peers.discard(peer)
            self.metrics.connections.dec()
            await self._inbox.put(Gone(peer))

    async def _read(self, peer: Peer) -> None:
        while True:
            try:
                msg = await peer.channel.recv()
            except ConnectionLost:
                return
            except FrameTooLarge as exc:
                self.refuse(peer, Error(0, ErrorCode.LIMIT, str(exc)))
                peer.channel.close()
                return
            except FrameForged as exc:  # altered on the way, or not from this peer
                self.refuse(peer, Error(0, ErrorCode.AUTH_FAILED, str(exc)))
                peer.channel.close()
                return
            except WireError as exc:
                self.refuse(peer, Error(0, ErrorCode.BAD_FRAME, str(exc)))
                continue
            await self._inbox.put(Request(peer, msg))

    def refuse(self, peer: Peer, err: Error) -> None:
        self._log_budget.warn(
            log, peer, "bad input",
            peer=peer.channel.peer, client=peer.name, code=err.code.name, error=err.message,
        )
        self.metrics.error(err.code.name)
        with contextlib.suppress(ConnectionLost):
            peer.channel.send(err)

    async def _admit(self, hello: Hello) -> Welcome:
        try:
            graph = None if hello.graph is None else graph_of(hello.graph)
        except GraphError as exc:
            raise ServiceError(ErrorCode.BAD_REQUEST, f"bad pipeline graph: {exc}") from None
        reply: asyncio.Future[Welcome] = asyncio.get_running_loop().create_future()
        await self._inbox.put(Admit(hello, graph, reply))
        return await reply
