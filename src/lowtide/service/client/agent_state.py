"""An agent's state on its event loop: its local tracker (rule 2), the connections to
the tracker or its shards, requests in flight and subscriptions, and the agent's
config. Everything here runs on the agent's event loop, so it needs no locks; the
agents (:mod:`lowtide.service.client.agent`) hand work to it from any thread. It
knows nothing of them: what it needs is given (URL, graph, session, config)."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from lowtide.core.graph import SegmentGraph
from lowtide.core.local import LocalTrackerConfig, merge_acks
from lowtide.core.messages import AckBatch, Flush, Heartbeat, MinTimeUpdate, NodeTime
from lowtide.core.sharding import ShardLayout, ShardRouter
from lowtide.core.time import TimeGrid
from lowtide.service.auth import nonce
from lowtide.service.client.batches import BatchKey, stream_time
from lowtide.service.client.connection import ConnectionConfig, Reply, ServerConnection
from lowtide.service.client.replies import applied, checked, time_of
from lowtide.service.client.subscription import Forward
from lowtide.service.clock import SystemClock
from lowtide.service.errors import ServiceError, SessionFailed, exception_of, fresh
from lowtide.wire.messages import (
    WIRE_VERSION,
    Batch,
    ChangeGraph,
    Error,
    FrontAction,
    FrontLate,
    FrontOp,
    Hello,
    Message,
    MinTimeAt,
    Notify,
    QueryBatch,
    Role,
    Status,
    StatusRequest,
    Subscribe,
    Unsubscribe,
    Welcome,
    graph_spec,
)

log = logging.getLogger("lowtide.service.agent")

@dataclass(frozen=True)
class AgentConfig:
    """An agent's settings: its local tracker's flush age and size, the shared secret,
    how long a connection may take, its name in Hellos (default ``agent-PID``)."""

    max_age_ms: int = 5
    max_entries: int = 65_536
    secret: bytes | None = None
    connect_timeout_s: float = 5.0
    name: str = ""
    #: the grid this process labels with; a tracker with another refuses the agent
    #: (GRID_MISMATCH). None: take the tracker's (:attr:`Agent.grid`).
    grid: TimeGrid | None = None

    def connection(self) -> ConnectionConfig:
        return ConnectionConfig(secret=self.secret, connect_timeout_s=self.connect_timeout_s)


class AgentState:
    """The agent's state on its loop: local tracker, connections, subscriptions."""

    def __init__(self, url: str, graph: SegmentGraph, session: int, config: AgentConfig) -> None:
        self.url, self.graph, self.config = url, graph, config
        self.session = session
        self.clock = SystemClock()
        self._reqs = itertools.count(1)
        self._local_config = LocalTrackerConfig(
            TimeGrid(window_slots=1), config.max_age_ms, config.max_entries
        )
        self.local = self._local_config.build(session)
        self.main: ServerConnection | None = None
        self.shards: list[ServerConnection] = []
        self.router: ShardRouter | None = None
        self.layout: ShardLayout | None = None
        self.ready = asyncio.Event()
        #: the tracker's grid, from its first Welcome (read from any thread once ready)
        self.grid: TimeGrid | None = None
        self.refused: ServiceError | None = None
        self._changed = asyncio.Event()  # set on each welcome or refusal of the main connection
        self._awaiting_welcome = 0  # calls waiting in _ready
        self._subs: dict[int, Forward] = {}
        self._inflight: set[asyncio.Future[Reply]] = set()
        self._errors: list[Exception] = []
        #: set once the tracker refused a background flush: every later call raises it
        #: (a fresh copy each time, see :func:`~lowtide.service.errors.fresh`)
        self.failed: SessionFailed | None = None
        self._timer: asyncio.TimerHandle | None = None
        #: front -> the owner id this agent registered it with (its heartbeats prove it)
        self._owners: dict[int, int] = {}

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.main = self._connect(self.url, self._on_welcome, busy=lambda: bool(
            self._awaiting_welcome or any(s.unanswered() for s in self.shards)))
        self.main.start()

    def describe(self) -> str:
        connections = [*([self.main] if self.main else []), *self.shards]
        return "; ".join(conn.describe() for conn in connections) or "not started"

    def _connect(self, url: str, on_welcome: Callable[[Welcome], None],
              shard: tuple[int, int] | None = None,
              busy: Callable[[], bool] = lambda: False) -> ServerConnection:
        config = self.config.connection()
        return ServerConnection(url, lambda: self._hello(shard), config, on_welcome, self._on_push,
                    self._on_refused, busy)

    def _on_refused(self, exc: ServiceError) -> None:
        self.refused = exc
        self._changed.set()

    async def _ready(self) -> None:
        """Wait for the first welcome; raise why the server refused us, if it did.
        Meanwhile the main connection counts as used, so it dials until a Welcome
        comes: a call sends nothing before it, and an unused connection waits to be
        used (an agent whose first handshake was cut never dialled again)."""
        self._awaiting_welcome += 1
        try:
            while not self.ready.is_set():
                if self.refused is not None:
                    raise fresh(self.refused)
                if self.main is not None:
                    self.main.wake()
                self._changed.clear()
                await self._changed.wait()
        finally:
            self._awaiting_welcome -= 1

    async def tracker_grid(self) -> TimeGrid:
        await self._ready()
        assert self.grid is not None
        return self.grid

    def _hello(self, shard: tuple[int, int] | None) -> Hello:
        """What this agent relies on the tracker to be: its graph, the grid it was
        told to expect or learnt in its first handshake (a tracker restarted with
        another is refused), and, on a connection to a shard, which shard."""
        config = self.config
        name = config.name or f"agent-{os.getpid()}"
        expected = config.grid or self.grid
        grid = None if expected is None else (expected.delta_ms, expected.window_slots)
        return Hello(WIRE_VERSION, Role.AGENT, nonce(), name, graph_spec(self.graph),
                     grid, shard)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for conn in [*self.shards, *([self.main] if self.main else [])]:
            await conn.close()

    # ------------------------------------------------------------ topology
    def _on_welcome(self, welcome: Welcome) -> None:
        self.refused = None
        self._changed.set()
        if self.ready.is_set():
            self._retarget(welcome.shards)
            return
        count = len(welcome.shards)
        if count:
            self.layout = ShardLayout(count, welcome.window_slots)
            self.router = ShardRouter(self.layout, self.session)
            self.shards = [self._connect(url, lambda _w: None, (k, count))
                           for k, url in enumerate(welcome.shards)]
            for conn in self.shards:
                conn.start()
        self.grid = TimeGrid(welcome.delta_ms, welcome.window_slots)
        self.ready.set()
        # Acks buffered before we knew the server's window size were merged per slot;
        # send them as they are, then merge by the server's windows from now on.
        self._send_flush(self.local.flush())
        self._local_config = LocalTrackerConfig(
            self.grid, self._local_config.max_age_ms, self._local_config.max_entries
        )
        self.local = self._local_config.build(self.session)

    def _retarget(self, urls: tuple[str, ...]) -> None:
        """A restarted coordinator may have started its shards on other ports: send
        there from now on (shard k is still shard k, with its state and dedup)."""
        if len(urls) != len(self.shards):
            log.error("shard count changed: restart the agent", extra={"shards": urls})
            return
        for conn, url in zip(self.shards, urls, strict=True):
            conn.url = url

    def _state_connections(self) -> list[ServerConnection]:
        assert self.main is not None
        return self.shards or [self.main]

    # ------------------------------------------------------------ local tracker
    def add_acks(self, acks: AckBatch) -> None:
        self.local.add_acks(acks, self.clock.now_ms())
        self._poll()

    def add_heartbeat(self, hb: Heartbeat, owner: str | None = None) -> None:
        try:
            self.local.add_heartbeat(self.owned(hb, owner), self.clock.now_ms())
        except ValueError as exc:
            self._errors.append(exc)
            return
        self._poll()

    def _poll(self) -> None:
        if not self.ready.is_set():
            return
        self._send_flush(self.local.poll(self.clock.now_ms()))
        deadline = self.local.next_deadline_ms()
        if deadline is not None and self._timer is None:
            delay = max(0, deadline - self.clock.now_ms()) / 1000
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._poll()

    def _send_flush(self, flush: Flush | None) -> None:
        if flush is None or self.failed is not None:
            return
        if self.router is None:
            batch = self._batch("", flush.acks, flush.heartbeats)
            self._submit(self._state_connections()[0], batch, background=True)
            return
        for part in self.router.route(flush):
            batch = self._batch("", part.acks, part.heartbeats, part.node_time)
            self._submit(self.shards[part.shard], batch, background=True)

    def _batch(
        self, key: str, acks: AckBatch, hbs: tuple[Heartbeat, ...], nt: NodeTime | None = None
    ) -> Batch:
        return Batch(next(self._reqs), self.session, key, acks, hbs, nt)

    def _submit(
        self, conn: ServerConnection, msg: Batch | FrontOp | FrontLate, background: bool = False,
        now: bool = False,
    ) -> asyncio.Future[Reply]:
        """Send ``msg`` (``now``: see :meth:`ServerConnection.submit`); ``background``:
        nobody awaits the reply, so an error is kept for the next :meth:`flush_all`."""
        fut: asyncio.Future[Reply] = self.loop.create_future()
        self._inflight.add(fut)
        fut.add_done_callback(self._inflight.discard)
        if background:
            fut.add_done_callback(self._settled)
        conn.submit(msg.req, msg, fut, now=now)
        return fut

    def _settled(self, fut: asyncio.Future[Reply]) -> None:
        if fut.cancelled():
            return
        exc: BaseException | None = fut.exception()
        reply = None if exc is not None else fut.result()
        if isinstance(reply, Error):
            exc = exception_of(reply)
            if self.failed is None:
                self.failed = SessionFailed(
                    f"the tracker refused a background flush of this agent ({exc}); its "
                    "acks are unknown to the tracker, which refuses this session from now "
                    "on: restart the process, and the work whose acks it sent"
                )
        if isinstance(exc, Exception):
            log.warning("flush refused", extra={
                "url": self.url, "error": str(exc),
                "fix": "this agent's next call raises why; a refused background flush fails "
                       "its session: restart the process"})
            self._errors.append(exc)

    def check_failed(self) -> None:
        if self.failed is not None:
            raise fresh(self.failed)

    async def flush_all(self) -> None:
        await self._ready()
        self._send_flush(self.local.flush())
        if self._inflight:
            await asyncio.wait(list(self._inflight))
        errors, self._errors = self._errors, []
        if errors:
            raise fresh(errors[0])
        self.check_failed()

    # ------------------------------------------------------------ requests
    def owner_id(self, front: int, owner: str | None) -> int:
        """Who a front belongs to: this session, or (``owner`` named) whoever knows the
        name and the secret, so that a restarted process is the front's successor.
        None: the owner this agent registered ``front`` with (else this session)."""
        if owner is None:
            return self._owners.get(front, self.session)
        if not owner:
            return self.session
        key = (self.config.secret or b"")[:64]
        text = f"{owner}\0{front}".encode()
        return int.from_bytes(hashlib.blake2b(text, key=key, digest_size=8).digest(), "little")

    def owned(self, hb: Heartbeat, owner: str | None) -> Heartbeat:
        """``hb`` with its front's owner id, unless it carries one: a heartbeat moves
        its front, so it proves the owner like a registration does (rule 10)."""
        return hb if hb.owner else replace(hb, owner=self.owner_id(hb.front, owner))

    async def front_op(
        self, action: FrontAction, front: int, segment: str, time: int, owner: str | None,
        retire_after_ms: int = -1,
    ) -> None:
        await self._ready()
        self.check_failed()
        self._send_flush(self.local.flush())
        owner_id = self.owner_id(front, owner)
        futs = [
            self._submit(
                conn,
                FrontOp(next(self._reqs), self.session, action, front, segment, time, owner_id,
                        retire_after_ms),
            )
            for conn in self._state_connections()
        ]
        for reply in await asyncio.gather(*futs):
            checked(reply)
        if action == FrontAction.REGISTER:
            self._owners[front] = owner_id
        elif action == FrontAction.UNREGISTER:
            self._owners.pop(front, None)

    async def report_late(self, front: int, counts: tuple[int, int, int, int]) -> None:
        """A front's late counts (clamped, rejected, raised, out of range) to every
        server that keeps its front operations (status only, see FrontLate)."""
        await self._ready()
        futs = [self._submit(conn, FrontLate(next(self._reqs), self.session, front, *counts))
                for conn in self._state_connections()]
        for reply in await asyncio.gather(*futs):
            checked(reply)

    async def keyed(
        self, key: BatchKey, acks: AckBatch, hbs: tuple[Heartbeat, ...], owner: str | None
    ) -> bool:
        await self._ready()
        return applied(await asyncio.gather(*self.send_keyed(key, acks, hbs, owner)))

    def send_keyed(
        self, key: BatchKey, acks: AckBatch, hbs: tuple[Heartbeat, ...], owner: str | None,
        now: bool = False,
    ) -> list[asyncio.Future[Reply]]:
        """Send a keyed batch (once ready; ``now``: see :meth:`ServerConnection.submit`):
        one request, or one to each shard; :func:`applied` reads their replies."""
        self.check_failed()
        self._send_flush(self.local.flush())
        hbs = tuple(self.owned(hb, owner) for hb in hbs)
        merged = merge_acks(acks, self._local_config.grid.window_slots)
        text = key.text()
        if self.layout is None:
            batch = self._batch(text, merged, hbs)
            return [self._submit(self._state_connections()[0], batch, now=now)]
        # merged times are window starts, so the aggregate stays on window boundaries
        nt = stream_time(key, int(merged.time.min())) if len(merged) else None
        parts = self.layout.split(merged)
        return [self._submit(conn, self._batch(text, part, hbs, nt), now=now)
                for conn, part in zip(self.shards, parts, strict=True)]

    def _ask(self, make: Callable[[int], Message], now: bool = False) -> asyncio.Future[Reply]:
        """Send the request ``make(req)`` to the tracker itself (not its shards)."""
        assert self.main is not None
        req = next(self._reqs)
        fut: asyncio.Future[Reply] = self.loop.create_future()
        self.main.submit(req, make(req), fut, now=now)
        return fut

    async def status(self) -> dict[str, Any]:
        reply = checked(await self._ask(StatusRequest))
        assert isinstance(reply, Status)
        body: dict[str, Any] = json.loads(reply.json)
        return body

    async def main_request(self, msg: QueryBatch | ChangeGraph) -> None:
        """A request to the tracker itself (not its shards), checked."""
        await self._ready()
        if isinstance(msg, ChangeGraph):  # deduplicated by (session, req), like a front op
            msg = replace(msg, session=self.session)
        checked(await self._ask(lambda req: replace(msg, req=req)))

    async def min_time_at(self, segment: str | None, at_ms: int) -> int:
        await self._ready()
        return time_of(await self.ask_min_time(segment, at_ms))

    def ask_min_time(self, segment: str | None, at_ms: int,
                     now: bool = False) -> asyncio.Future[Reply]:
        """Ask ``segment``'s min time at ``at_ms`` (once ready): :func:`time_of`."""
        return self._ask(lambda req: MinTimeAt(req, segment, at_ms), now)

    async def min_times_at(self, segments: list[str | None], at_ms: int) -> list[int]:
        """:meth:`min_time_at` of each segment, the questions sent together."""
        return list(await asyncio.gather(*(self.min_time_at(s, at_ms) for s in segments)))

    # ------------------------------------------------------------ subscriptions
    async def subscribe(self, segment: str | None, deliver: Callable[[MinTimeUpdate], None]) -> int:
        assert self.main is not None
        req = next(self._reqs)
        self._subs[req] = Forward(deliver)
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.main.submit_standing(req, Subscribe(req, segment), fut)
        try:
            checked(await fut)
        except Exception:
            self.unsubscribe(req)
            raise
        return req

    def unsubscribe(self, req: int) -> None:
        self._subs.pop(req, None)
        if self.main is not None:
            self.main.end_standing(req)
            self.main.post(Unsubscribe(req))

    def _on_push(self, msg: Message) -> None:
        if not isinstance(msg, Notify):
            log.warning("unexpected push, ignored", extra={"url": self.url,
                                                           "type": type(msg).__name__})
            return
        for req, update in msg.updates:
            forward = self._subs.get(req)
            if forward is not None:
                forward(update)
