"""The asyncio tracker server: one task owns the engine, connections feed it.

Connection tasks only read and decode frames and put them in the inbox. The state task
takes everything waiting (a group), applies it, writes the group to the log, steps the
tracker once, and then sends the replies and the notifications. Replies therefore
always follow logging (rule 6), and one step serves a whole group, which is what
keeps throughput up under many small senders.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from lowtide.core.errors import ProtocolError
from lowtide.core.graph import SegmentGraph
from lowtide.core.time import Clock
from lowtide.service import net
from lowtide.service.channel import register_inproc, unregister_inproc
from lowtide.service.client.connection import ConnectionConfig
from lowtide.service.clock import SystemClock
from lowtide.service.engine.base import Engine, StateRequest, StepResult
from lowtide.service.engine.coordinator import CoordinatorEngine
from lowtide.service.errors import ConnectionLost, ServiceError, error_of
from lowtide.service.ha.leader_log import LeaderLog, LeadLost
from lowtide.service.ha.role import TrackerRole
from lowtide.service.ha.standby import StepLogDamaged
from lowtide.service.logs import LogBudget
from lowtide.service.persistence.generations import log_generations, recover
from lowtide.service.persistence.state_dir import stored_graph
from lowtide.service.persistence.state_log import StateLog
from lowtide.service.server.fail_stop import FailStop
from lowtide.service.server.freshness import SlaWatch
from lowtide.service.server.history import MinTimeHistory
from lowtide.service.server.inbox import Admit, Call, Gone, Item, Outbox, Peer, Request, Tick
from lowtide.service.server.metrics import ServerMetrics
from lowtide.service.server.peers import PeerConnections
from lowtide.service.server.shard_watch import ShardWatch
from lowtide.service.server.standing import StandingRequests
from lowtide.service.server.status_doc import status_document
from lowtide.service.server.step_log import log_step
from lowtide.service.server.ticker import Ticker
from lowtide.service.server.welcome import check_version, welcome
from lowtide.service.web.app import WebApp
from lowtide.service.web.view import WebView
from lowtide.wire.messages import (
    LATEST_MS,
    Batch,
    ChangeGraph,
    Error,
    ErrorCode,
    FrontLate,
    FrontOp,
    Hello,
    Message,
    MinTimeAt,
    Ok,
    QueryBatch,
    ShardReleaseFrame,
    ShardReportFrame,
    Status,
    StatusRequest,
    Subscribe,
    Unsubscribe,
    WatchShard,
    Welcome,
)

if TYPE_CHECKING:
    # for types only: ServerConfig.build() imports this module
    from lowtide.service.server.config import ServerConfig

log = logging.getLogger("lowtide.service.server")

MAX_GROUP = 1024
INBOX = 4096


class TrackerServer:
    def __init__(self, config: ServerConfig, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.engine: Engine | None = None
        #: a coordinator's connections to its shards
        self.shard_watch: ShardWatch | None = None
        self.metrics = ServerMetrics(config.pipeline)
        self._inbox: asyncio.Queue[Item] = asyncio.Queue(INBOX)
        self._standing = StandingRequests(config.limits)
        self._ticker = Ticker(config.tick_every_ms(), self.clock)
        self._watchers: set[Peer] = set()
        self._posted: set[asyncio.Task[None]] = set()
        self._wal: StateLog | LeaderLog | None = None
        #: in a group of trackers (rule 18): standby, then leader until fenced
        self.role = None if config.ha is None else TrackerRole(config.ha, config.engine)
        self.leading = asyncio.Event()  # set once it serves (at once, unless a standby)
        self.ended = asyncio.Event()  # set when it stopped leading: see ``lost``
        self.lost = ""
        self._tasks: list[asyncio.Task[None]] = []
        self._servers: list[asyncio.Server] = []
        self.port = 0
        self.metrics_port = 0
        self.web: WebApp | None = None  # the web view, if config.web_port is set
        self.web_port = 0
        self._next_metrics_ms = 0
        self._history = MinTimeHistory()
        self.inproc_url = ""
        self._changed = False  # a graph change in the group being run
        self._log_budget = LogBudget()  # per peer, and per segment for stuck windows
        self._conns = PeerConnections(config, self._inbox, self.metrics, self._log_budget)
        self._fail_stop = FailStop(self.metrics, self._conns.close_all, self._send)
        sla = config.sla()
        self.freshness = None if sla is None else SlaWatch(sla)

    @property
    def url(self) -> str:
        return f"tcp://{self.config.host}:{self.port}" if self.config.listen else self.inproc_url

    @property
    def web_url(self) -> str | None:
        """The web view's address; with a secret, its login link (``?token=``)."""
        if self.web is None:
            return None
        host = self.config.web_host
        url = f"http://{f'[{host}]' if ':' in host else host}:{self.web_port}/"
        return url if self.web.token is None else f"{url}?token={self.web.token}"

    # ---------------------------------------------------------------- life
    async def start(self) -> None:
        cfg = self.config
        graph = cfg.graph
        if self.role is not None:  # it listens once it leads
            self._tasks = [asyncio.get_running_loop().create_task(self._lead())]
            return
        if cfg.state_dir is not None:
            graph = graph or stored_graph(cfg.state_dir)
            self._wal = StateLog(
                cfg.state_dir, fsync=cfg.fsync, snapshot_every_ms=cfg.snapshot_every_ms
            )
        try:
            await self._listen(graph)
        except BaseException:
            if self._wal is not None:
                self._wal.close()  # and with it the state directory's lock
            raise

    async def _lead(self) -> None:
        assert self.role is not None
        try:
            self._wal = await self.role.lead(self.clock.now_ms)
            if self._wal is not None:
                await self._listen(self.role.graph or self.config.graph)
        except (LeadLost, StepLogDamaged, ValueError) as exc:  # ValueError: no confluent-kafka
            self._lose_lead(exc, [])

    async def _listen(self, graph: SegmentGraph | None) -> None:
        cfg = self.config
        if graph is not None:
            self._adopt(graph)
        loop = asyncio.get_running_loop()
        self._standing.limits = self._conns.fit_file_limit()
        self.inproc_url = register_inproc(loop, self._conns.accept_inproc)
        if cfg.listen:
            server, self.port = await net.serve_tcp(cfg.host, cfg.port, self._conns.serve,
                                                   self._conns.gate)
            self._servers.append(server)
        if cfg.metrics_port is not None:
            http, self.metrics_port = await net.serve_http(
                cfg.metrics_host, cfg.metrics_port, self.metrics.http
            )
            self._servers.append(http)
        if cfg.web_port is not None:
            self.web = WebApp(WebView(cfg.pipeline), cfg.secret)
            self._refresh_web(self.status())
            web, self.web_port = await net.serve_http(cfg.web_host, cfg.web_port,
                                                      self.web.respond)
            self._servers.append(web)
        self._tasks += [loop.create_task(self._state_loop()),
                        loop.create_task(self._ticker.run(lambda: self._inbox.put(Tick())))]
        self.leading.set()
        limits = self._conns.gate.limits
        log.info("serving", extra={"url": self.url, "state_dir": str(cfg.state_dir or ""),
                                   "max_connections": limits.max_connections,
                                   "max_handshakes": limits.max_handshakes})

    async def stop(self) -> None:
        if self.role is not None:
            self.role.stop()
        unregister_inproc(self.inproc_url)
        for server in self._servers:
            server.close()
        self._conns.close_all()
        tasks = [*self._tasks, *self._conns.tasks]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.shard_watch is not None:
            await self.shard_watch.close()
        if self._wal is not None:
            self._wal.close()

    def post(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` in the state task, after what is already queued (same loop only)."""
        task = asyncio.get_running_loop().create_task(self._inbox.put(Call(fn)))
        self._posted.add(task)
        task.add_done_callback(self._posted.discard)

    def move_shard(self, shard: int, url: str) -> None:
        """A coordinator's shard restarted elsewhere (its port was taken): every client
        reconnects, and learns the new address from its Welcome."""

        def move() -> None:
            assert self.shard_watch is not None
            self.shard_watch.move(shard, url)
            self._conns.close_all()

        self.post(move)

    def _adopt(self, graph: SegmentGraph) -> None:
        engine = (self.config.engine(graph) if self.role is None
                  else self.role.engine(graph, self.clock.now_ms()))
        if isinstance(engine, CoordinatorEngine):
            connection = ConnectionConfig(secret=self.config.secret, limits=self.config.limits)
            self.shard_watch = ShardWatch(engine, connection, self.post)
        if isinstance(self._wal, StateLog):
            assert self.config.state_dir is not None
            engine = recover(self.config.engine, self.config.state_dir, self._wal, graph)
            log_generations(self.config.state_dir, engine, self.config.fsync)
        self.engine = engine
        with contextlib.suppress(ProtocolError, ServiceError):
            current: dict[str | None, int] = {None: engine.current(None).time}
            current.update({n: engine.current(n).time for n in graph.names})
            current.update({graph.range_name(s, r): engine.current(graph.range_name(s, r)).time
                            for s in range(len(graph)) for r in range(graph.ranges_of(s))})
            self._history.seed(self.clock.now_ms(), current)

    def _welcome(self, hello: Hello, graph: SegmentGraph | None) -> Welcome:
        """Runs in the state task: may adopt the client's graph."""
        check_version(hello)
        if self.engine is None:
            if graph is None:
                raise ServiceError(
                    ErrorCode.GRAPH_MISMATCH, "this tracker has no pipeline graph yet"
                )
            self._adopt(graph)
        assert self.engine is not None
        return welcome(hello, graph, self.engine, self.config)

    # ------------------------------------------------------------ state task
    async def _state_loop(self) -> None:
        inbox = self._inbox
        while True:
            items = [await inbox.get()]
            while len(items) < MAX_GROUP and not inbox.empty():
                items.append(inbox.get_nowait())
            if self._fail_stop.error is not None:
                self._fail_stop.refuse(items)
                continue
            try:
                self._run_group(items)
            except LeadLost as exc:
                self._lose_lead(exc, items)
            except Exception as exc:
                self._fail_stop.failed(exc, items)

    def _lose_lead(self, exc: Exception, items: list[Item]) -> None:
        """Nothing may be confirmed or announced from here on (rule 18): its clients
        are let go to find the leader, and ``lowtide serve`` ends."""
        self._fail_stop.lost_lead(exc, items, self.role.config.url if self.role else "")
        for server in self._servers:
            server.close()
        self.lost = str(exc)
        self.ended.set()

    def _run_group(self, items: list[Item]) -> None:
        now = self.clock.now_ms()
        out: Outbox = []
        ticked = False
        for item in items:
            if isinstance(item, Request):
                self._dispatch(item.peer, item.msg, now, out)
            elif isinstance(item, Admit):
                self._admit_now(item)
            elif isinstance(item, Gone):
                self._standing.gone(item.peer)
                self._watchers.discard(item.peer)
                self._log_budget.forget(item.peer)
            elif isinstance(item, Call):
                item.fn()
            else:
                ticked = True
        engine = self.engine
        if engine is None:
            return self._send(out)
        committed = self._wal is not None and self._wal.commit(now)
        if self._changed and self.config.state_dir is not None:
            log_generations(self.config.state_dir, engine, self.config.fsync)
        self._changed = False  # its generation logged before confirmed, like any request
        step = engine.step(now)
        if self._wal is not None and not committed and any(
                d.retired_ms is not None for d in step.dead):
            self._wal.mark(now)  # a retirement in a step with no request: replay it too
        self._history.observe(now, step.updates)
        # confirmations with the answers the step gave: a task that asked for a min time
        # behind its batch reads both in one wake-up
        self._send(out + self._standing.answers(now, self._history))
        self._ticker.expect(self._standing.questions.next_due_ms())
        self._publish(step)
        if ticked:
            self._tick(engine, now)
        return None

    def _admit_now(self, item: Admit) -> None:
        if item.reply.done():  # its handshake timed out while it waited in the inbox
            return
        try:
            item.reply.set_result(self._welcome(item.hello, item.graph))
        except ServiceError as exc:
            item.reply.set_exception(exc)

    def _tick(self, engine: Engine, now: int) -> None:
        self._publish(engine.tick(now))
        if self.shard_watch is not None:
            self.shard_watch.tick(now)
        if now >= self._next_metrics_ms:  # a full status walks every open window: not each tick
            self._next_metrics_ms = now + self.config.metrics_every_ms
            status = self.status()
            self.metrics.observe(status, now, self.config.grid)
            if self.freshness is not None:
                self.freshness.check(status, engine.graph, now, self.metrics,
                                     self._log_budget)
            self._refresh_web(status)
        if isinstance(self._wal, LeaderLog):
            self._wal.beat(now)  # a woken, fenced leader learns it here
        elif self._wal is not None and self._wal.snapshot_due(now):
            try:  # a failed snapshot is retried (see StateLog.snapshot): never fatal
                self._wal.snapshot(engine, now)
            except OSError as exc:
                self._log_budget.warn(
                    log, "snapshot", "snapshot failed, retrying", error=str(exc),
                    state_dir=str(self.config.state_dir),
                    fix="free descriptors (ulimit -n) or disk space; until a snapshot "
                        "succeeds the log keeps growing",
                )

    def _refresh_web(self, status: dict[str, object]) -> None:
        if self.web is not None:
            self.web.view.observe(status, self.engine.graph if self.engine else None)

    def _dispatch(self, peer: Peer, msg: Message, now: int, out: Outbox) -> None:
        engine = self.engine
        if engine is None:
            out.append((peer, Error(0, ErrorCode.BAD_REQUEST, "no pipeline graph yet")))
        elif (forbidden := peer.forbidden(msg)) is not None:
            self._log_budget.warn(log, peer, "refused request", code=forbidden.code.name,
                                  error=forbidden.message, client=peer.name,
                                  peer=peer.channel.peer)
            out.append((peer, forbidden))
        elif isinstance(msg, Batch | FrontOp | ChangeGraph):
            out.append((peer, self._apply(engine, peer, msg, now)))
        elif isinstance(msg, QueryBatch):
            out.append((peer, engine.report_batch(msg, now)))
        elif isinstance(msg, FrontLate):  # status only: neither deduplicated nor logged
            engine.front_events.report_late(msg)
            out.append((peer, Ok(msg.req)))
        elif isinstance(msg, Subscribe | Unsubscribe | MinTimeAt):
            if (isinstance(msg, MinTimeAt) and msg.at_ms == LATEST_MS
                    and not engine.steps_hold_confirmed):
                msg = replace(msg, at_ms=now)
            self._standing.request(engine, peer, msg, out)
        elif isinstance(msg, StatusRequest):
            out.append((peer, Status(msg.req, json.dumps(self.status()))))
        elif isinstance(msg, ShardReleaseFrame | WatchShard):
            self._shard_duty(engine, peer, msg, out)
        else:
            out.append((peer, Error(0, ErrorCode.BAD_REQUEST, f"unexpected {type(msg).__name__}")))

    def _apply(self, engine: Engine, peer: Peer, msg: StateRequest, now: int) -> Ok | Error:
        reply = engine.handle(msg, now)
        if isinstance(reply, Error):
            self._log_budget.warn(
                log, peer, "refused request",
                code=reply.code.name, error=reply.message, client=peer.name,
            )
            self.metrics.error(reply.code.name)
        elif isinstance(msg, ChangeGraph) and not reply.duplicate:
            self._changed = True  # logged with the graph it made (rule 16)
            if self._wal is not None:
                self._wal.append(replace(msg, fingerprint=engine.graph.fingerprint()))
        elif not reply.duplicate and self._wal is not None:
            self._wal.append(msg)
        return reply

    def _shard_duty(
        self, engine: Engine, peer: Peer, msg: ShardReleaseFrame | WatchShard, out: Outbox
    ) -> None:
        try:
            if isinstance(msg, WatchShard):
                report = engine.watch()
                self._watchers.add(peer)
                out.append((peer, Ok(msg.req)))
                out.append((peer, ShardReportFrame(report)))
            else:
                engine.release(msg)
                if self._wal is not None:
                    self._wal.append(msg)
        except ServiceError as exc:
            out.append((peer, error_of(getattr(msg, "req", 0), exc)))

    def _publish(self, step: StepResult) -> None:
        if step.report is not None:
            self._send([(peer, ShardReportFrame(step.report)) for peer in self._watchers])
        if step.release is not None and self.shard_watch is not None:
            self.shard_watch.release(step.release)
        log_step(step, self.engine.graph.names if self.engine else (), self.config,
                 self._log_budget)
        if not step.updates:
            return
        self.metrics.updates(step.updates, self.clock.now_ms(), self.config.grid)
        self._send(self._standing.notifies(step.updates))

    def _send(self, out: Outbox) -> None:
        """Each peer's messages, in order, in one write."""
        by_peer: dict[Peer, list[Message]] = {}
        for peer, msg in out:
            by_peer.setdefault(peer, []).append(msg)
        for peer, msgs in by_peer.items():
            try:
                peer.channel.send_all(msgs)
            except ConnectionLost as exc:
                self._log_budget.warn(
                    log, peer, "dropped peer", peer=peer.channel.peer, reason=str(exc)
                )

    def status(self) -> dict[str, object]:
        return status_document(
            self.config, self.url, len(self._conns.peers), self.clock, self.engine,
            role=self.role, shard_watch=self.shard_watch, freshness=self.freshness,
        )
