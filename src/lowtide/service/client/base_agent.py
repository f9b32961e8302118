"""What every agent does: the calls a process makes to the tracker and waits for
(front operations, keyed batches, flush, status, min times at a wall time), one
agent per process and tracker (:meth:`BaseAgent.shared`), a fresh session after a
fork. Where the agent's event loop runs is the subclass's: :class:`Agent` on a thread
of its own, :class:`CallerAgent` on the calling thread during each call.

Ordering: one agent sends everything to a server over one connection, in the order
it was issued; before any front operation or keyed batch, acks and heartbeats still
waiting in the local tracker go first, so they are never overtaken (rules 2 and 3).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import secrets
import threading
import weakref
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Iterable, Iterator
from typing import Any, ClassVar, Self, TypeVar

from lowtide.core.generations import GraphChange, follows, next_graph
from lowtide.core.graph import SegmentGraph, SegmentSpec
from lowtide.core.messages import AckBatch, Heartbeat
from lowtide.core.time import TimeGrid
from lowtide.service.client.agent_state import AgentConfig, AgentState
from lowtide.service.client.batches import BatchKey, Outcome, Pending, PendingBatch
from lowtide.service.errors import ConnectionLost
from lowtide.wire.messages import (
    BatchState,
    ChangeGraph,
    FrontAction,
    QueryBatch,
    graph_of,
    graph_spec,
)

log = logging.getLogger("lowtide.service.agent")

T = TypeVar("T")
SharedKey = tuple[str, str, TimeGrid | None]


class BaseAgent(ABC):
    # Each subclass has its own (see __init_subclass__): a CallerAgent is never
    # handed out for an Agent.
    _shared: ClassVar[dict[SharedKey, BaseAgent]] = {}
    # Class-wide, and replaced in a forked child (see _fresh_locks): a lock that some
    # other thread of the parent held at fork time would never be released there.
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()
    #: every agent of this process, shared or not: what close_agents() can reach
    live: ClassVar[weakref.WeakSet[BaseAgent]] = weakref.WeakSet()
    _boot_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._shared = {}

    def __init__(self, url: str, graph: SegmentGraph, config: AgentConfig | None = None) -> None:
        self.url = url
        self.graph = graph
        self.config = config or AgentConfig()
        self._pid = -1
        self._boot()
        BaseAgent.live.add(self)

    @classmethod
    def connect(
        cls, url: str, graph: SegmentGraph, *, secret: bytes | None = None, **options: Any
    ) -> Self:
        return cls(url, graph, AgentConfig(secret=secret, **options))

    @classmethod
    def shared(cls, url: str, graph: SegmentGraph, *, secret: bytes | None = None,
               grid: TimeGrid | None = None) -> Self:
        """This process's agent for ``url``, ``graph`` and ``grid`` (None: the
        tracker's), created on first use."""
        key = (url, graph.fingerprint(), grid)
        with BaseAgent._shared_lock:
            agent = cls._shared.get(key)
            if isinstance(agent, cls):
                return agent
            agent = cls._shared[key] = cls.connect(url, graph, secret=secret, grid=grid)
            stale = [a for a in cls._shared.values() if a is not agent and a._stale()]
        for old in stale:  # outside the lock: closing forgets them under it
            old.close()
        return agent

    def _stale(self) -> bool:
        """Whether :meth:`shared` may close this agent when it makes another: never,
        unless a subclass knows better (:class:`CallerAgent`)."""
        return False

    # ------------------------------------------------------------ lifecycle
    def _boot(self) -> None:
        """Fresh state for this process: session, event loop, its state, and where
        the loop runs (:meth:`_start_loop`)."""
        self._pid = os.getpid()
        self._closed = False
        self.session = secrets.randbits(62) + 1
        self._loop = asyncio.new_event_loop()
        self._state = AgentState(self.url, self.graph, self.session, self.config)
        self._start_loop()

    @abstractmethod
    def _start_loop(self) -> None:
        """Make the loop run (now, or during calls) and start the state's connection."""

    @abstractmethod
    def _running(self) -> bool:
        """Whether the loop can still run calls (False once closed)."""

    @abstractmethod
    def _stop_loop(self, timeout_s: float) -> None:
        """Close the state's connections, then stop and close the loop."""

    @abstractmethod
    def _spawn(self, coro: Awaitable[T], timeout_s: float) -> Outcome[T]:
        """Start ``coro`` on the loop, ``timeout_s`` from now."""

    def _ensure(self) -> None:
        if os.getpid() == self._pid:
            if self._closed:
                raise ConnectionLost(f"the agent for {self.url} was closed (its tracker "
                                     "stopped?): connect a new one")
            return
        with BaseAgent._boot_lock:
            if os.getpid() != self._pid:  # another thread of this child may have won
                log.info("fork detected: new agent session", extra={"pid": os.getpid()})
                self._boot()

    def close(self, timeout_s: float = 5.0) -> None:
        """Flush what is buffered (best effort within ``timeout_s``) and disconnect."""
        if os.getpid() != self._pid or not self._running():
            return
        self._flush_before_close(timeout_s)
        self._stop_loop(timeout_s)
        self._closed = True
        self._forget()

    def _flush_before_close(self, timeout_s: float) -> None:
        try:
            self._call(self._state.flush_all(), timeout_s)
        except Exception as exc:  # closing must not fail
            log.warning("close: unflushed acks", extra={"url": self.url, "reason": repr(exc)})

    def _forget(self) -> None:
        with BaseAgent._shared_lock:
            shared = type(self)._shared
            for key in [k for k, a in shared.items() if a is self]:
                del shared[key]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def grid(self) -> TimeGrid:
        """The tracker's time grid, as the handshake agreed it (waits up to 30 s for
        the first one): label with this grid, never with a default."""
        self._ensure()
        return self._call(self._state.tracker_grid(), 30.0)

    @contextlib.contextmanager
    def together(self) -> Iterator[None]:
        """Requests issued inside the block go out together (:class:`CallerAgent`:
        in one write at its end). This agent's loop writes what one of its turns
        sends in one write already."""
        yield

    # ------------------------------------------------------------ blocking calls
    def _result(self, fut: Outcome[T]) -> T:
        try:
            return fut.result()
        except TimeoutError as exc:
            raise TimeoutError(f"{exc} ({self._state.describe()})") from None
        except (concurrent.futures.CancelledError, asyncio.CancelledError):
            raise ConnectionLost(f"{self.url}: the agent was closed while this call "
                                 "waited") from None

    def _call(self, coro: Awaitable[T], timeout_s: float) -> T:
        return self._result(self._spawn(coro, timeout_s))

    def register_front(
        self, front: int, segment: str, time: int, timeout_s: float = 30.0, *, owner: str = ""
    ) -> None:
        """The front feeds source segment ``segment`` with items of slot >= time. It
        belongs to this agent: no other session may move (re-register, heartbeat) or
        unregister it (FrontOwned), unless it names the same ``owner`` (with the same
        secret): a restarted process that takes over its fronts, or a Spark task that
        heartbeats for the driver. A front that registers below what its segment
        announced is refused (FrontBehind) unless it was declared."""
        self._ensure()
        self.graph.index(segment)
        self._call(self._state.front_op(FrontAction.REGISTER, front, segment, time, owner),
                   timeout_s)

    def unregister_front(
        self, front: int, timeout_s: float = 30.0, *, owner: str | None = None
    ) -> None:
        """The front is done; ``owner``: the name it was registered with (None: the one
        this agent registered it with)."""
        self._ensure()
        self._call(self._state.front_op(FrontAction.UNREGISTER, front, "", 0, owner), timeout_s)

    def declare_front(
        self, front: int, segment: str, time: int | None = None, timeout_s: float = 30.0, *,
        owner: str = "", retire_after_ms: int | None = None,
    ) -> None:
        """``front`` may still produce into ``segment`` from slot ``time`` on (None:
        from where the segment's fronts start): the segment's min time waits for it
        until it registers (whoever registers it owns it) or is retired, by
        :meth:`retire_front` with the same ``owner``, or by the tracker once
        ``retire_after_ms`` passed (None: never). Declaring a front that is live or
        done already changes nothing."""
        self._ensure()
        self.graph.index(segment)
        after = -1 if retire_after_ms is None else retire_after_ms
        if retire_after_ms is not None and retire_after_ms < 0:
            raise ValueError("retire_after_ms must be >= 0 (None: never)")
        at = -1 if time is None else time
        self._call(self._state.front_op(FrontAction.DECLARE, front, segment, at, owner, after),
                   timeout_s)

    def retire_front(self, front: int, timeout_s: float = 30.0, *, owner: str = "") -> None:
        """Stop waiting for a declared front that never registered (``owner``: the name
        it was declared with)."""
        self._ensure()
        self._call(self._state.front_op(FrontAction.RETIRE, front, "", 0, owner), timeout_s)

    def report_late(self, front: int, counts: tuple[int, int, int, int],
                    timeout_s: float = 10.0) -> None:
        """Tell the tracker what ``front`` did with late records since its producer
        started: (clamped, rejected, raised, out of range); status views show it."""
        self._ensure()
        self._call(self._state.report_late(front, counts), timeout_s)

    def send_batch(
        self,
        key: BatchKey,
        acks: AckBatch,
        heartbeats: Iterable[Heartbeat] = (),
        timeout_s: float = 30.0,
        *,
        owner: str | None = None,
    ) -> bool:
        """Apply ``acks`` then ``heartbeats`` at most once under ``key``; returns once
        the tracker confirmed (after logging). True if applied now, False if it had
        been applied before (a retry). Raises the core ProtocolError the tracker
        raised, or TimeoutError (then retry with the same key: it is safe).
        ``owner``: the name the heartbeats' fronts were registered with (None: as this
        agent registered them, else this session), unless a heartbeat carries its
        owner id."""
        return self.submit_batch(key, acks, heartbeats, timeout_s, owner=owner).wait()

    def submit_batch(
        self,
        key: BatchKey,
        acks: AckBatch,
        heartbeats: Iterable[Heartbeat] = (),
        timeout_s: float = 30.0,
        *,
        owner: str | None = None,
    ) -> PendingBatch:
        """:meth:`send_batch` without waiting: the caller goes on (a Spark task emits
        its last rows) while the batch travels, and calls ``wait()`` before it may
        report success. Batches go out in the order they were submitted, after
        everything submitted or buffered before them; ``timeout_s`` counts from now."""
        self._ensure()
        if key.batch_id < 0:
            raise ValueError(f"batch ids start at 0, got {key.batch_id}")
        fut = self._send_keyed(key, acks, tuple(heartbeats), owner, timeout_s)
        return PendingBatch(fut, self._result)

    def _send_keyed(self, key: BatchKey, acks: AckBatch, hbs: tuple[Heartbeat, ...],
                    owner: str | None, timeout_s: float) -> Outcome[bool]:
        return self._spawn(self._state.keyed(key, acks, hbs, owner), timeout_s)

    def report_batch(self, query: str, batch: int, state: BatchState,
                     segments: Iterable[str] = (), timeout_s: float = 10.0) -> None:
        """Tell the tracker that ``query`` opened, still runs, or closed ``batch``
        (``state``), acking into ``segments``; or stopped. A stuck window that a running
        batch may still deliver is then reported as waiting for it, not as missing."""
        self._ensure()
        msg = QueryBatch(0, query, batch, state, tuple(segments))
        self._call(self._state.main_request(msg), timeout_s)

    def change_graph(self, *, attach: Iterable[SegmentSpec | tuple[str, Iterable[str]]] = (),
                     detach: Iterable[str] = (), replace: Iterable[str] = (),
                     start: int | None = None, timeout_s: float = 30.0) -> SegmentGraph:
        """Make the tracker's next graph generation (rule 16) and use it from now on:
        ``attach`` segments (declared as for ``SegmentGraph.of``; they may read existing
        ones), ``detach`` or ``replace`` existing ones; attached segments start at slot
        ``start`` (None: the global min time; never below it). Returns the new graph.
        Refused (ServiceError) if another change came first: ask again."""
        self._ensure()
        doc = self.status(timeout_s)
        current = graph_of(doc["graph"])
        specs = tuple(s if isinstance(s, SegmentSpec) else SegmentSpec(s[0], tuple(s[1]))
                      for s in attach)
        change = GraphChange(int(doc.get("generation", 0)) + 1, specs, tuple(detach),
                             tuple(replace), start)
        made = next_graph(current, change)  # a bad change is refused here, in one line
        attached = graph_spec(made)[len(current):]
        msg = ChangeGraph(0, 0, change.generation, attached, change.detach, change.replace,
                          -1 if start is None else start, made.fingerprint())
        self._call(self._state.main_request(msg), timeout_s)
        self.graph = self._state.graph = made
        return made

    def follow_graph(self, timeout_s: float = 10.0) -> SegmentGraph:
        """Use the tracker's current graph generation (rule 16) when it follows from
        this agent's: a segment attached since gets its index (a front joins a
        consumer attached to its log); every earlier index means the same."""
        self._ensure()
        current = graph_of(self.status(timeout_s)["graph"])
        if follows(self.graph, current):
            self.graph = self._state.graph = current
        return self.graph

    def flush(self, timeout_s: float = 30.0) -> None:
        """Send what the local tracker holds and wait until every earlier request is
        confirmed; raises the first error a fire-and-forget flush met since last time."""
        self._ensure()
        self._call(self._state.flush_all(), timeout_s)

    def status(self, timeout_s: float = 10.0) -> dict[str, Any]:
        self._ensure()
        return self._call(self._state.status(), timeout_s)

    def min_time_at(self, segment: str | None, at_ms: int, timeout_s: float = 30.0) -> int:
        """``segment``'s min time (None: global) as it was at the tracker's wall time
        ``at_ms``. The tracker answers once its clock has passed ``at_ms``, so every
        caller asking the same question gets the same answer (deterministic decisions
        in retried Spark tasks). 0 for times older than the tracker's history (10
        minutes, in memory: a restarted tracker has none before its restart)."""
        return self.ask_min_time_at(segment, at_ms, timeout_s).wait()

    def ask_min_time_at(self, segment: str | None, at_ms: int,
                        timeout_s: float = 30.0) -> Pending[int]:
        """:meth:`min_time_at` without waiting: the question goes out now, after every
        request issued before it on this agent's connection (a keyed batch submitted
        just before is applied first: one round trip for both)."""
        self._ensure()
        if segment is not None:
            self.graph.resolve(segment)  # a segment, or a key range "<segment>#<r>"
        return Pending(self._ask_min_time(segment, at_ms, timeout_s), self._result)

    def _ask_min_time(self, segment: str | None, at_ms: int, timeout_s: float) -> Outcome[int]:
        return self._spawn(self._state.min_time_at(segment, at_ms), timeout_s)

    def min_times_at(self, segments: list[str | None], at_ms: int,
                     timeout_s: float = 30.0) -> list[int]:
        """:meth:`min_time_at` of each of ``segments`` (e.g. the key ranges a task
        steps), asked together: one round trip's wait, not one per segment."""
        self._ensure()
        for segment in segments:
            if segment is not None:
                self.graph.resolve(segment)
        return self._call(self._state.min_times_at(segments, at_ms), timeout_s)


def _fresh_locks() -> None:
    BaseAgent._shared_lock = threading.Lock()
    BaseAgent._boot_lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_locks)


def close_shared(url: str | None = None, timeout_s: float = 2.0) -> None:
    """Flush and close this process's shared agents (of ``url``; None: all). A tracker
    this process stops takes them along: left running, they would dial its port every
    second, and whatever listens there next (a Spark worker's callback socket, say)
    would read their frames."""
    with BaseAgent._shared_lock:
        agents = [a for cls in _kinds(BaseAgent) for a in cls._shared.values()
                  if url is None or a.url == url]
    for agent in agents:
        agent.close(timeout_s=timeout_s)


# on the way out: what ``add_acks`` buffered in the last milliseconds would otherwise
# die with the daemon thread
atexit.register(close_shared)


def _kinds(cls: type[Any]) -> list[type[BaseAgent]]:
    """Every subclass of ``cls``, their subclasses too."""
    return [k for sub in cls.__subclasses__() for k in (sub, *_kinds(sub))]
