"""The agent: one per process, the executor's (or front's) way to the tracker.

It is the local tracker of seed 000: ``add_acks`` and ``heartbeat`` are merged and
flushed by age or size in rule-2 order; ``send_batch`` carries a Spark task's output
under its rule-6 key and returns once the tracker has applied (and logged) it.

Threads: the public methods may be called from any thread. They hand work to a
background thread that runs the agent's own event loop; all state (local tracker,
connections, pending requests) lives there, so it needs no locks. Processes: the
agent notices a fork (pid change) and starts afresh in the child, with a new session;
the parent keeps whatever it had in flight. Connections are made lazily, in the
background, and remade after any failure; every unanswered request is then resent in
order, and servers apply each one at most once.

Ordering: one agent sends everything to a server over one connection, in the order
it was issued; before any front operation or keyed batch, acks and heartbeats still
waiting in the local tracker go first, so they are never overtaken (rules 2 and 3).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import itertools
import json
import logging
import os
import secrets
import threading
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, NoReturn, Protocol, TypeVar

from lowtide.core.graph import SegmentGraph
from lowtide.core.local import LocalTrackerConfig, merge_acks
from lowtide.core.messages import AckBatch, Flush, Heartbeat, MinTimeUpdate, NodeTime
from lowtide.core.sharding import ShardLayout, ShardRouter
from lowtide.core.time import TimeGrid
from lowtide.service.auth import nonce
from lowtide.service.clock import SystemClock
from lowtide.service.errors import ServiceError, exception_of
from lowtide.service.lane import Lane, LaneConfig, Reply
from lowtide.service.subscribe import AsyncSubscription, Forward, Subscription
from lowtide.wire.messages import (
    WIRE_VERSION,
    Batch,
    Error,
    FrontOp,
    Hello,
    Message,
    MinTimeAt,
    MinTimeAtReply,
    Notify,
    Ok,
    Role,
    Status,
    StatusRequest,
    Subscribe,
    Unsubscribe,
    Welcome,
    graph_spec,
)

log = logging.getLogger("lowtide.service.agent")

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


@dataclass(frozen=True)
class BatchKey:
    """Rule 6: what a Spark task's ack batch is known by. No attempt number: every
    attempt of a task sends the same acks under the same key."""

    query: str
    batch_id: int
    segment: str
    partition: int

    def text(self) -> str:
        return json.dumps([self.query, self.batch_id, self.segment, self.partition])


def stream_time(key: BatchKey, min_time: int) -> NodeTime:
    """The node time of a keyed batch in a sharded deployment (rule 8).

    Each (query, segment, partition) is a node of its own whose counter is the batch
    id + 1: every attempt of a batch, from any process, then carries the same node
    time, so a batch that one attempt got to some shards and a retry to the others
    completes, and the node count stays that of the streams. It needs batch ids of a
    stream to arrive in increasing order, as Spark's micro-batches do; a shard refuses
    one that comes after a later one."""
    stream = json.dumps([key.query, key.segment, key.partition]).encode()
    node = int.from_bytes(hashlib.blake2b(stream, digest_size=8).digest(), "little") >> 1
    return NodeTime(node, key.batch_id + 1, min_time)


@dataclass(frozen=True)
class AgentConfig:
    max_age_ms: int = 5
    max_entries: int = 65_536
    secret: bytes | None = None
    connect_timeout_s: float = 5.0
    name: str = ""

    def lane(self) -> LaneConfig:
        return LaneConfig(secret=self.secret, connect_timeout_s=self.connect_timeout_s)

    def build(self, url: str, graph: SegmentGraph) -> Agent:
        return Agent(url, graph, self)


class Outcome(Protocol[T_co]):
    """A call under way (a ``concurrent.futures.Future``, or a caller-driven task)."""

    def result(self) -> T_co: ...


class PendingBatch:
    """A keyed batch on its way to the tracker (:meth:`Agent.submit_batch`)."""

    def __init__(self, fut: Outcome[bool], result: Callable[[Outcome[bool]], bool]) -> None:
        self._fut = fut
        self._result = result

    def wait(self) -> bool:
        """Block until the tracker confirmed: True if applied now, False if it had
        been applied before; raises as :meth:`Agent.send_batch` does."""
        return self._result(self._fut)


class Agent:
    _shared: ClassVar[dict[tuple[str, str], Agent]] = {}
    # Class-wide, and replaced in a forked child (see _fresh_locks): a lock that some
    # other thread of the parent held at fork time would never be released there.
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()
    _boot_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, url: str, graph: SegmentGraph, config: AgentConfig | None = None) -> None:
        self.url = url
        self.graph = graph
        self.config = config or AgentConfig()
        self._pid = -1
        self._boot()

    @classmethod
    def connect(
        cls, url: str, graph: SegmentGraph, *, secret: bytes | None = None, **options: Any
    ) -> Agent:
        return cls(url, graph, AgentConfig(secret=secret, **options))

    @classmethod
    def shared(cls, url: str, graph: SegmentGraph, *, secret: bytes | None = None) -> Agent:
        """This process's agent for ``url`` and ``graph``, created on first use."""
        key = (url, graph.fingerprint())
        with cls._shared_lock:
            agent = cls._shared.get(key)
            if agent is None:
                agent = cls._shared[key] = cls.connect(url, graph, secret=secret)
            return agent

    # ------------------------------------------------------------ lifecycle
    def _boot(self) -> None:
        """Fresh state for this process: session, loop thread, link."""
        self._pid = os.getpid()
        self.session = secrets.randbits(62) + 1
        self._loop = asyncio.new_event_loop()
        self._link = _Link(self, self.session)
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="lowtide-agent", daemon=True
        )
        self._thread.start()
        self._loop.call_soon_threadsafe(self._link.start)

    def _ensure(self) -> None:
        if os.getpid() == self._pid:
            return
        with Agent._boot_lock:
            if os.getpid() != self._pid:  # another thread of this child may have won
                log.info("fork detected: new agent session", extra={"pid": os.getpid()})
                self._boot()

    def close(self, timeout_s: float = 5.0) -> None:
        """Flush what is buffered (best effort within ``timeout_s``) and disconnect."""
        if os.getpid() != self._pid or not self._thread.is_alive():
            return
        try:
            self._call(self._link.flush_all(), timeout_s)
        except Exception as exc:  # closing must not fail
            log.warning("close: unflushed acks", extra={"reason": repr(exc)})
        asyncio.run_coroutine_threadsafe(self._link.close(), self._loop).result(timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        self._forget()

    def _forget(self) -> None:
        with Agent._shared_lock:
            shared = type(self)._shared
            for key in [k for k, a in shared.items() if a is self]:
                del shared[key]

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ blocking calls
    def _spawn(self, coro: Awaitable[T], timeout_s: float) -> Outcome[T]:
        if threading.current_thread() is self._thread:
            raise RuntimeError("blocking agent call on the agent's own thread (from a callback?)")
        return asyncio.run_coroutine_threadsafe(_timed(coro, timeout_s), self._loop)

    def _result(self, fut: Outcome[T]) -> T:
        try:
            return fut.result()
        except TimeoutError as exc:
            raise TimeoutError(f"{exc} ({self._link.describe()})") from None

    def _call(self, coro: Awaitable[T], timeout_s: float) -> T:
        return self._result(self._spawn(coro, timeout_s))

    def register_front(self, front: int, segment: str, time: int, timeout_s: float = 30.0) -> None:
        """The front feeds source segment ``segment`` with items of slot >= time."""
        self._ensure()
        self.graph.index(segment)
        self._call(self._link.front_op(True, front, segment, time), timeout_s)

    def unregister_front(self, front: int, timeout_s: float = 30.0) -> None:
        self._ensure()
        self._call(self._link.front_op(False, front, "", 0), timeout_s)

    def send_batch(
        self,
        key: BatchKey,
        acks: AckBatch,
        heartbeats: Iterable[Heartbeat] = (),
        timeout_s: float = 30.0,
    ) -> bool:
        """Apply ``acks`` then ``heartbeats`` at most once under ``key``; returns once
        the tracker confirmed (after logging). True if applied now, False if it had
        been applied before (a retry). Raises the core ProtocolError the tracker
        raised, or TimeoutError (then retry with the same key: it is safe)."""
        return self.submit_batch(key, acks, heartbeats, timeout_s).wait()

    def submit_batch(
        self,
        key: BatchKey,
        acks: AckBatch,
        heartbeats: Iterable[Heartbeat] = (),
        timeout_s: float = 30.0,
    ) -> PendingBatch:
        """:meth:`send_batch` without waiting: the caller goes on (a Spark task emits
        its last rows) while the batch travels, and calls ``wait()`` before it may
        report success. Batches go out in the order they were submitted, after
        everything submitted or buffered before them; ``timeout_s`` counts from now."""
        self._ensure()
        if key.batch_id < 0:
            raise ValueError(f"batch ids start at 0, got {key.batch_id}")
        fut = self._spawn(self._link.keyed(key, acks, tuple(heartbeats)), timeout_s)
        return PendingBatch(fut, self._result)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Send what the local tracker holds and wait until every earlier request is
        confirmed; raises the first error a fire-and-forget flush met since last time."""
        self._ensure()
        self._call(self._link.flush_all(), timeout_s)

    def status(self, timeout_s: float = 10.0) -> dict[str, Any]:
        self._ensure()
        return self._call(self._link.status(), timeout_s)

    def min_time_at(self, segment: str | None, at_ms: int, timeout_s: float = 30.0) -> int:
        """``segment``'s min time (None: global) as it was at the tracker's wall time
        ``at_ms``. The tracker answers once its clock has passed ``at_ms``, so every
        caller asking the same question gets the same answer (deterministic decisions
        in retried Spark tasks). 0 for times older than the tracker's history (10
        minutes, in memory: a restarted tracker has none before its restart)."""
        self._ensure()
        if segment is not None:
            self.graph.index(segment)
        return self._call(self._link.min_time_at(segment, at_ms), timeout_s)

    # ------------------------------------------------------------ fire and forget
    def add_acks(self, acks: AckBatch) -> None:
        """Buffer acks in the local tracker; sent within ``max_age_ms``."""
        self._ensure()
        self._loop.call_soon_threadsafe(self._link.add_acks, acks)

    def heartbeat(self, front: int, time: int) -> None:
        """Buffer a heartbeat; it travels after every ack buffered before it (rule 3)."""
        self._ensure()
        self._loop.call_soon_threadsafe(self._link.add_heartbeat, Heartbeat(front, time))

    # ------------------------------------------------------------ subscriptions
    def subscribe(self, segment: str | None = None, timeout_s: float = 30.0) -> Subscription:
        """Blocking iterator of MinTimeUpdates (None: global), the current one first."""
        self._ensure()
        sub = Subscription(lambda: None)
        sub._cancel = self._start_subscription(segment, sub.put, timeout_s)
        return sub

    async def subscribe_async(self, segment: str | None = None) -> AsyncSubscription:
        """Like :meth:`subscribe`, as an asyncio iterator on the caller's loop."""
        self._ensure()
        sub = AsyncSubscription(lambda: None, asyncio.get_running_loop())
        fut = asyncio.run_coroutine_threadsafe(self._link.subscribe(segment, sub.put), self._loop)
        req = await asyncio.wrap_future(fut)
        sub._cancel = self._canceller(req)
        return sub

    def on_update(
        self, callback: Callable[[MinTimeUpdate], None], segment: str | None = None
    ) -> Callable[[], None]:
        """Call ``callback`` (on the agent's thread) with each update; returns a
        function that cancels the subscription."""
        self._ensure()
        return self._start_subscription(segment, callback, 30.0)

    def _start_subscription(
        self, segment: str | None, deliver: Callable[[MinTimeUpdate], None], timeout_s: float
    ) -> Callable[[], None]:
        if segment is not None:
            self.graph.index(segment)
        req = self._call(self._link.subscribe(segment, deliver), timeout_s)
        return self._canceller(req)

    def _canceller(self, req: int) -> Callable[[], None]:
        def cancel() -> None:
            self._loop.call_soon_threadsafe(self._link.unsubscribe, req)

        return cancel


def _fresh_locks() -> None:
    Agent._shared_lock = threading.Lock()
    Agent._boot_lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_locks)


class CallerAgent(Agent):
    """An agent without a thread of its own: the calling thread runs its event loop,
    during each call. A round trip then wakes one thread (the caller) instead of two
    (the agent's thread, then the caller); on a loaded machine each wake-up may wait
    for a core, and a Spark task blocks on such a round trip before it ends (rule 6).
    Measured in one A/B run of ``lowtide bench spark``'s pipeline: 1.6 points of
    throughput. For processes that only make calls: keyed batches (:meth:`send_batch`,
    and :meth:`submit_batch`, whose request goes out at once), front operations,
    status and min-time queries, from one thread at a time (others wait), never from
    inside a running asyncio loop. Buffered acks, heartbeats and subscriptions need a
    loop that always runs: they are refused here (use :class:`Agent`)."""

    _shared: ClassVar[dict[tuple[str, str], Agent]] = {}

    def _boot(self) -> None:
        self._pid = os.getpid()
        self.session = secrets.randbits(62) + 1
        self._loop = asyncio.new_event_loop()
        self._link = _Link(self, self.session)
        self._thread = None  # type: ignore[assignment]
        self._lock = threading.Lock()
        self._loop.call_soon(self._link.start)

    def _spawn(self, coro: Awaitable[T], timeout_s: float) -> Outcome[T]:
        with self._lock:
            task = self._loop.create_task(_timed(coro, timeout_s))
            # a few turns of the loop: a connected agent writes the request now
            self._loop.run_until_complete(_turns(3))
        return _Driven(self._loop, self._lock, task)

    def close(self, timeout_s: float = 5.0) -> None:
        if os.getpid() != self._pid or self._loop.is_closed():
            return
        try:
            self._call(self._link.flush_all(), timeout_s)
        except Exception as exc:  # closing must not fail
            log.warning("close: unflushed acks", extra={"reason": repr(exc)})
        with self._lock:
            with contextlib.suppress(Exception):
                self._loop.run_until_complete(asyncio.wait_for(self._link.close(), timeout_s))
            self._loop.close()
        self._forget()

    def _refuse(self, what: str) -> NoReturn:
        raise RuntimeError(f"{what} needs an agent whose loop always runs: use Agent, "
                           "not CallerAgent (it runs only during calls)")

    def add_acks(self, acks: AckBatch) -> None:
        self._refuse("add_acks")

    def heartbeat(self, front: int, time: int) -> None:
        self._refuse("heartbeat")

    def subscribe(self, segment: str | None = None, timeout_s: float = 30.0) -> Subscription:
        self._refuse("subscribe")

    async def subscribe_async(self, segment: str | None = None) -> AsyncSubscription:
        self._refuse("subscribe_async")

    def on_update(
        self, callback: Callable[[MinTimeUpdate], None], segment: str | None = None
    ) -> Callable[[], None]:
        self._refuse("on_update")


class _Driven(Generic[T]):
    """A CallerAgent's call under way: :meth:`result` runs the loop until it is done."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, lock: threading.Lock, task: asyncio.Task[T]
    ) -> None:
        self._loop, self._lock, self._task = loop, lock, task

    def result(self) -> T:
        with self._lock:
            return self._loop.run_until_complete(self._task)


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@atexit.register
def _close_shared() -> None:
    """Flush the process's shared agents on the way out: what ``add_acks`` buffered in
    the last milliseconds would otherwise die with the daemon thread."""
    with Agent._shared_lock:
        agents = [*Agent._shared.values(), *CallerAgent._shared.values()]
    for agent in agents:
        agent.close(timeout_s=2.0)


async def _timed(coro: Awaitable[T], timeout_s: float) -> T:
    try:
        return await asyncio.wait_for(coro, timeout_s)
    except TimeoutError:
        raise TimeoutError(f"no answer from the tracker within {timeout_s} s") from None


def _check(reply: Reply) -> Reply:
    if isinstance(reply, Error):
        raise exception_of(reply)
    return reply


class _Link:
    """The agent's loop-side state: local tracker, lanes, subscriptions."""

    def __init__(self, agent: Agent, session: int) -> None:
        self.agent = agent
        self.session = session
        self.clock = SystemClock()
        self._reqs = itertools.count(1)
        self._local_config = LocalTrackerConfig(
            TimeGrid(window_slots=1), agent.config.max_age_ms, agent.config.max_entries
        )
        self.local = self._local_config.build(session)
        self.main: Lane | None = None
        self.shards: list[Lane] = []
        self.router: ShardRouter | None = None
        self.layout: ShardLayout | None = None
        self.ready = asyncio.Event()
        self.refused: ServiceError | None = None
        self._changed = asyncio.Event()  # set on each welcome or refusal of the main lane
        self._subs: dict[int, Forward] = {}
        self._inflight: set[asyncio.Future[Reply]] = set()
        self._errors: list[Exception] = []
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self.main = self._lane(self.agent.url, self._on_welcome)
        self.main.start()

    def describe(self) -> str:
        lanes = [*([self.main] if self.main else []), *self.shards]
        return "; ".join(lane.describe() for lane in lanes) or "not started"

    def _lane(self, url: str, on_welcome: Callable[[Welcome], None]) -> Lane:
        config = self.agent.config.lane()
        return Lane(url, self._hello, config, on_welcome, self._on_push, self._on_refused)

    def _on_refused(self, exc: ServiceError) -> None:
        self.refused = exc
        self._changed.set()

    async def _ready(self) -> None:
        """Wait for the first welcome; raise why the server refused us, if it did."""
        while not self.ready.is_set():
            if self.refused is not None:
                raise self.refused
            self._changed.clear()
            await self._changed.wait()

    def _hello(self) -> Hello:
        name = self.agent.config.name or f"agent-{os.getpid()}"
        return Hello(WIRE_VERSION, Role.AGENT, nonce(), name, graph_spec(self.agent.graph))

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for lane in [*self.shards, *([self.main] if self.main else [])]:
            await lane.close()

    # ------------------------------------------------------------ topology
    def _on_welcome(self, welcome: Welcome) -> None:
        self.refused = None
        self._changed.set()
        if self.ready.is_set():
            self._retarget(welcome.shards)
            return
        if welcome.shards:
            self.layout = ShardLayout(len(welcome.shards), welcome.window_slots)
            self.router = ShardRouter(self.layout, self.session)
            self.shards = [self._lane(url, lambda _w: None) for url in welcome.shards]
            for lane in self.shards:
                lane.start()
        self.ready.set()
        # Acks buffered before we knew the server's window size were merged per slot;
        # send them as they are, then merge by the server's windows from now on.
        self._send_flush(self.local.flush())
        grid = TimeGrid(welcome.delta_ms, welcome.window_slots)
        self._local_config = LocalTrackerConfig(
            grid, self._local_config.max_age_ms, self._local_config.max_entries
        )
        self.local = self._local_config.build(self.session)

    def _retarget(self, urls: tuple[str, ...]) -> None:
        """A restarted coordinator may have started its shards on other ports: send
        there from now on (shard k is still shard k, with its state and dedup)."""
        if len(urls) != len(self.shards):
            log.error("shard count changed: restart the agent", extra={"shards": urls})
            return
        for lane, url in zip(self.shards, urls, strict=True):
            lane.url = url

    def _state_lanes(self) -> list[Lane]:
        assert self.main is not None
        return self.shards or [self.main]

    # ------------------------------------------------------------ local tracker
    def add_acks(self, acks: AckBatch) -> None:
        self.local.add_acks(acks, self.clock.now_ms())
        self._poll()

    def add_heartbeat(self, hb: Heartbeat) -> None:
        try:
            self.local.add_heartbeat(hb, self.clock.now_ms())
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
        if flush is None:
            return
        if self.router is None:
            batch = self._batch("", flush.acks, flush.heartbeats)
            self._submit(self._state_lanes()[0], batch, background=True)
            return
        for part in self.router.route(flush):
            batch = self._batch("", part.acks, part.heartbeats, part.node_time)
            self._submit(self.shards[part.shard], batch, background=True)

    def _batch(
        self, key: str, acks: AckBatch, hbs: tuple[Heartbeat, ...], nt: NodeTime | None = None
    ) -> Batch:
        return Batch(next(self._reqs), self.session, key, acks, hbs, nt)

    def _submit(
        self, lane: Lane, msg: Batch | FrontOp, background: bool = False
    ) -> asyncio.Future[Reply]:
        """Send ``msg``; ``background``: nobody awaits the reply, so an error is kept
        for the next :meth:`flush_all` to raise."""
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._inflight.add(fut)
        fut.add_done_callback(self._inflight.discard)
        if background:
            fut.add_done_callback(self._settled)
        lane.submit(msg.req, msg, fut)
        return fut

    def _settled(self, fut: asyncio.Future[Reply]) -> None:
        if fut.cancelled():
            return
        exc: BaseException | None = fut.exception()
        reply = None if exc is not None else fut.result()
        if isinstance(reply, Error):
            exc = exception_of(reply)
        if isinstance(exc, Exception):
            log.warning("flush refused", extra={"error": str(exc)})
            self._errors.append(exc)

    async def flush_all(self) -> None:
        await self._ready()
        self._send_flush(self.local.flush())
        if self._inflight:
            await asyncio.wait(list(self._inflight))
        errors, self._errors = self._errors, []
        if errors:
            raise errors[0]

    # ------------------------------------------------------------ requests
    async def front_op(self, register: bool, front: int, segment: str, time: int) -> None:
        await self._ready()
        self._send_flush(self.local.flush())
        futs = [
            self._submit(
                lane, FrontOp(next(self._reqs), self.session, register, front, segment, time)
            )
            for lane in self._state_lanes()
        ]
        for reply in await asyncio.gather(*futs):
            _check(reply)

    async def keyed(self, key: BatchKey, acks: AckBatch, hbs: tuple[Heartbeat, ...]) -> bool:
        await self._ready()
        self._send_flush(self.local.flush())
        merged = merge_acks(acks, self._local_config.grid.window_slots)
        text = key.text()
        if self.layout is None:
            futs = [self._submit(self._state_lanes()[0], self._batch(text, merged, hbs))]
        else:
            # merged times are window starts, so the aggregate stays on window boundaries
            nt = stream_time(key, int(merged.time.min())) if len(merged) else None
            parts = self.layout.split(merged)
            futs = [
                self._submit(lane, self._batch(text, part, hbs, nt))
                for lane, part in zip(self.shards, parts, strict=True)
            ]
        replies = [_check(r) for r in await asyncio.gather(*futs)]
        return any(isinstance(r, Ok) and not r.duplicate for r in replies)

    async def status(self) -> dict[str, Any]:
        assert self.main is not None
        req = next(self._reqs)
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.main.submit(req, StatusRequest(req), fut)
        reply = _check(await fut)
        assert isinstance(reply, Status)
        body: dict[str, Any] = json.loads(reply.json)
        return body

    async def min_time_at(self, segment: str | None, at_ms: int) -> int:
        await self._ready()
        assert self.main is not None
        req = next(self._reqs)
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.main.submit(req, MinTimeAt(req, segment, at_ms), fut)
        reply = _check(await fut)
        assert isinstance(reply, MinTimeAtReply)
        return reply.time

    # ------------------------------------------------------------ subscriptions
    async def subscribe(self, segment: str | None, deliver: Callable[[MinTimeUpdate], None]) -> int:
        assert self.main is not None
        req = next(self._reqs)
        self._subs[req] = Forward(deliver)
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.main.stand(req, Subscribe(req, segment), fut)
        try:
            _check(await fut)
        except Exception:
            self.unsubscribe(req)
            raise
        return req

    def unsubscribe(self, req: int) -> None:
        self._subs.pop(req, None)
        if self.main is not None:
            self.main.sit(req)
            self.main.post(Unsubscribe(req))

    def _on_push(self, msg: Message) -> None:
        if not isinstance(msg, Notify):
            log.warning("unexpected push", extra={"type": type(msg).__name__})
            return
        for req, update in msg.updates:
            forward = self._subs.get(req)
            if forward is not None:
                forward(update)
