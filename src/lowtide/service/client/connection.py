"""One client connection to one server, kept alive: it reconnects with backoff after
any failure and then resends, in order, every request that has no answer yet (an idle
one, with nothing to send, reconnects at its next use). Given a
group of trackers (``tcp://a:1,tcp://b:2``, rule 18) it tries the next address after
each failure or lost connection, so it finds whichever leads.

Resending is safe because servers apply each (session, req) at most once. Standing
requests (subscriptions, shard watches) are sent again on every new connection.
Everything here runs on its owner's event loop; nothing is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from lowtide.service import net
from lowtide.service.channel import Address, Channel, dial_inproc, tracker_urls
from lowtide.service.errors import ConnectionLost, ServiceError, fresh
from lowtide.service.handshake import client_handshake
from lowtide.service.logs import LogBudget
from lowtide.wire.buffers import WireError
from lowtide.wire.messages import (
    Error,
    ErrorCode,
    Hello,
    Message,
    MinTimeAtReply,
    Ok,
    Status,
    Welcome,
)

log = logging.getLogger("lowtide.service.connection")

Reply = Ok | Error | Status | MinTimeAtReply


@dataclass(frozen=True)
class ConnectionConfig:
    secret: bytes | None = None
    limits: net.Limits = net.Limits()
    connect_timeout_s: float = 5.0
    backoff_s: tuple[float, float] = (0.02, 1.0)  # first and longest pause between attempts


class ServerConnection:
    """A client's connection to one server, kept alive (see the module docstring);
    its messages travel over a :class:`~lowtide.service.channel.Channel`, a new one
    for each connection made."""

    def __init__(
        self,
        url: str,
        hello: Callable[[], Hello],
        config: ConnectionConfig,
        on_welcome: Callable[[Welcome], None],
        on_push: Callable[[Message], None],
        on_refused: Callable[[ServiceError], None] = lambda _exc: None,
        busy: Callable[[], bool] = lambda: False,
    ) -> None:
        self.url = url  # may change: a coordinator's shard that moved
        self._tries = 0  # which of the addresses the next attempt dials
        self._hello = hello
        self._config = config
        self._on_welcome = on_welcome
        self._on_push = on_push
        self._on_refused = on_refused
        self._busy = busy  # work elsewhere needs this connection (a coordinator's Welcome)
        self._pending: dict[int, tuple[Message, asyncio.Future[Reply] | None]] = {}
        self._standing: dict[int, Message] = {}
        self._channel: Channel | None = None
        # what this turn of the loop sends, and on which channel: one write
        self._outbox: tuple[Channel, list[Message]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the owner's, from start()
        self.connected = asyncio.Event()
        self._used = asyncio.Event()  # a request since the connection was last lost
        self.connects = 0
        self.last_error = ""  # why the last connection failed or ended, for timeouts
        self.last_failure: BaseException | None = None  # the same, for callers to classify
        self._log_budget = LogBudget()  # a server's stray errors: a few lines, not a flood

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run())

    async def close(self) -> None:
        task = self._task
        # Cancel until it ends: Python 3.11's wait_for drops a cancellation that meets
        # its inner future's completion (fixed in 3.12), and the connection would run on.
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=0.1)
        if task is not None and not task.cancelled():
            with contextlib.suppress(Exception):
                task.result()
        if self._channel is not None:
            self._channel.close()
        for _msg, fut in self._pending.values():
            if fut is not None and not fut.done():
                fut.set_exception(ConnectionLost(f"connection to {self.url} closed"))

    def submit(self, req: int, msg: Message, fut: asyncio.Future[Reply] | None = None, *,
               now: bool = False) -> None:
        """Send if connected (at the end of this turn of the loop; ``now``: at once,
        with whatever this turn had queued before it), else on the next connection;
        ``fut`` gets the reply. ``now`` may be used while the loop is not running, from
        the thread that runs it (a :class:`~.caller.CallerAgent`'s caller)."""
        self._pending[req] = (msg, fut)
        self._used.set()
        self._send(msg, now)

    def post(self, msg: Message) -> None:
        """Send if connected, forget otherwise: for requests whose loss is harmless."""
        self._used.set()
        self._send(msg)

    def wake(self) -> None:
        """Someone needs this connection with nothing to send yet (a call waiting for
        the first Welcome): dial now, not at the next request."""
        self._used.set()

    def submit_standing(
        self, req: int, msg: Message, fut: asyncio.Future[Reply] | None = None
    ) -> None:
        """A standing request (a subscription, a shard watch): sent again on every
        new connection, and answered each time, until :meth:`end_standing`."""
        self._standing[req] = msg
        self.submit(req, msg, fut)

    def end_standing(self, req: int) -> None:
        """Stop sending ``req`` again on new connections."""
        self._standing.pop(req, None)

    def unanswered(self) -> int:
        return len(self._pending)

    def describe(self) -> str:
        """One line on the connection, for error messages (read from any thread)."""
        state = "connected" if self.connected.is_set() else "not connected"
        last = f", last error {self.last_error}" if self.last_error else ""
        return f"{self.url}: {state}, {self.connects} connections{last}"

    async def drain(self) -> None:
        if self._channel is not None:
            with contextlib.suppress(ConnectionLost):
                await self._channel.drain()

    def _send(self, msg: Message, now: bool = False) -> None:
        """Write ``msg`` once this turn of the loop is over, with whatever else is sent
        in it: requests issued together (a task's receipts and its stamp's question)
        reach the server in one write, which it reads, and answers, at one wake-up.
        ``now``: write it (after what this turn queued before it) at once."""
        channel = self._channel
        if channel is None:
            return
        box = self._outbox
        if box is None or box[0] is not channel:
            if now:  # nothing queued before it on this channel
                self._flush((channel, [msg]))
                return
            assert self._loop is not None  # a channel comes from the loop start() runs on
            box = self._outbox = (channel, [])
            self._loop.call_soon(self._flush, box)
        box[1].append(msg)
        if now:
            self._flush(box)

    def _flush(self, box: tuple[Channel, list[Message]]) -> None:
        if self._outbox is box:
            self._outbox = None
        channel, msgs = box[0], box[1][:]
        box[1].clear()  # written once: by submit(now=True) or at the end of the turn
        if channel is not self._channel or not msgs:  # lost: the next one resends requests
            return
        try:
            channel.send_all(msgs)
        except ConnectionLost:
            channel.close()

    async def _run(self) -> None:
        pause, longest = self._config.backoff_s
        while True:
            try:
                await self._session()
                pause = self._config.backoff_s[0]
            except (ConnectionLost, WireError, OSError) as exc:
                self.last_error, self.last_failure = repr(exc), exc
                log.debug("connection down", extra={"url": self.url, "reason": str(exc)})
            except ServiceError as exc:  # refused at handshake
                self.last_error, self.last_failure = repr(exc), exc
                self._refused(exc)
            except Exception as exc:  # a bug here must not leave a dead connection behind
                self.last_error = repr(exc)
                log.exception("connection failed", extra={"url": self.url})
            finally:
                self._tries += 1
                self.connected.clear()
                if self._channel is not None:
                    self._channel.close()
                    self._channel = None
            await asyncio.sleep(pause)
            pause = min(pause * 2, longest)
            await self._until_used()

    async def _until_used(self) -> None:
        """A lost connection with nothing to send or stand for dials again only once it
        is used: a client of a tracker that is gone for good (an agent in a Python
        worker Spark reuses for other work) must not redial its port for ever, where
        another program may listen by now (Spark's worker callback socket once read a
        Hello's length as a 1 GiB string and ran out of heap). ``busy``: an agent's
        coordinator connection is in use while a shard connection waits for answers
        (a moved shard's address comes in the coordinator's Welcome), or while a call
        waits for its first Welcome."""
        while not (self._pending or self._standing or self._busy()):
            self._used.clear()
            with contextlib.suppress(TimeoutError):  # looks at _busy again now and then
                await asyncio.wait_for(self._used.wait(), self._config.backoff_s[1])
            if self._used.is_set():
                return

    def _refused(self, exc: ServiceError) -> None:
        """A server that is full (LIMIT) may take us on the next try: the waiters wait
        on. Any other refusal (secret, graph, grid, shard) they learn at once."""
        if exc.code == ErrorCode.LIMIT:
            self._log_budget.warn(log, self.url, "tracker full, retrying", url=self.url,
                                  reason=str(exc))
            return
        log.warning("connection refused", extra={"url": self.url, "reason": str(exc)})
        self._fail_all(exc)
        self._on_refused(exc)

    async def _session(self) -> None:
        channel = await self._dial()
        welcome = await asyncio.wait_for(
            client_handshake(channel, self._hello(), self._config.secret),
            self._config.connect_timeout_s,
        )
        self._on_welcome(welcome)
        self._channel = channel
        self.connects += 1
        for req in sorted(set(self._pending) | set(self._standing)):
            entry = self._pending.get(req)
            if entry is None:
                self._pending[req] = (self._standing[req], None)
            self._send(self._pending[req][0])
        self.connected.set()
        keepalive = asyncio.get_running_loop().create_task(self._keep_alive(channel))
        try:
            while True:
                self._receive(await channel.recv())
        finally:
            keepalive.cancel()

    async def _keep_alive(self, channel: Channel) -> None:
        """An idle connection (say, a subscriber's) must not look dead to the server."""
        while True:
            await asyncio.sleep(self._config.limits.keepalive_s)
            try:
                channel.keepalive()
            except ConnectionLost:
                return

    async def _dial(self) -> Channel:
        urls = tracker_urls(self.url)
        url = urls[self._tries % len(urls)]
        if Address.parse(url).scheme == "inproc":
            return dial_inproc(url, asyncio.get_running_loop())
        return await net.connect_tcp(url, self._config.limits, self._config.connect_timeout_s)

    def _receive(self, msg: Message) -> None:
        if not isinstance(msg, Ok | Error | Status | MinTimeAtReply):
            self._on_push(msg)
            return
        entry = self._pending.pop(msg.req, None)
        if entry is None:
            if isinstance(msg, Error):
                self._log_budget.warn(
                    log, None, "server error", url=self.url, code=msg.code.name, error=msg.message
                )
            return
        if isinstance(msg, Error):
            self._standing.pop(msg.req, None)
        fut = entry[1]
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def _fail_all(self, exc: ServiceError) -> None:
        """The server refused us (secret, graph): whoever waits learns why, each with an
        exception of its own (one object raised in many places would pile up all their
        tracebacks). Requests stay pending, in case an operator fixes the server and it
        comes back."""
        for _sent, fut in self._pending.values():
            if fut is not None and not fut.done():
                fut.set_exception(fresh(exc))
