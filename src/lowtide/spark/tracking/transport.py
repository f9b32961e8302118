"""The seam between the Spark layer and the tracker service.

Everything Spark-side that talks to the tracker goes through :func:`connect`, which
returns the process-wide agent for a :class:`TrackerRef` (``lowtide.service.Agent``
for ``tcp://`` URLs). A ``TrackerRef`` is small and picklable: it travels inside the
closures and data source options that Spark ships to executors.

Tests may plug an in-process agent in with :func:`register_scheme` (for example
``memory://``); the library itself has no fake tracker.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from lowtide.core.errors import LowtideError
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import AckBatch, Heartbeat
from lowtide.core.time import TimeGrid
from lowtide.wire.messages import graph_of, graph_spec


class Pending(Protocol):
    """A keyed batch on its way (``lowtide.service.PendingBatch``)."""

    def wait(self) -> bool: ...


class AgentLike(Protocol):
    """What the Spark layer needs from ``lowtide.service.Agent``."""

    def register_front(
        self, front: int, segment: str, time: int, timeout_s: float = 30.0, *, owner: str = ""
    ) -> None: ...

    def send_batch(
        self,
        key: Any,
        acks: AckBatch,
        heartbeats: Iterable[Heartbeat] = (),
        timeout_s: float = 30.0,
        *,
        owner: str | None = None,
    ) -> Any: ...

    def submit_batch(
        self,
        key: Any,
        acks: AckBatch,
        heartbeats: Iterable[Heartbeat] = (),
        timeout_s: float = 30.0,
        *,
        owner: str | None = None,
    ) -> Pending: ...

    def add_acks(self, acks: AckBatch) -> None: ...

    def heartbeat(self, front: int, time: int, *, owner: str | None = None) -> None: ...


#: how long the driver waits for the tracker after a micro-batch (a window's hold move,
#: a sink's acks) and a task for its acks' confirmation (``Pipeline(hold_wait_s=)``);
#: then the query stops, with one line that says what to do
HOLD_WAIT_S = 30.0


@dataclass(frozen=True)
class TrackerRef:
    """Where the tracker is and what graph it tracks; picklable and JSON-able."""

    url: str
    graph: SegmentGraph
    grid: TimeGrid = TimeGrid()
    secret: str | None = None
    #: tasks wait for the tracker's confirmation of their batches (rule 6); False only
    #: to measure what the wait costs (see Pipeline)
    confirm: bool = True
    #: how long a task waits for the tracker's answer (``hold_wait_s``), then fails
    wait_s: float = HOLD_WAIT_S

    def to_option(self) -> str:
        """Encode as one string (data source options are strings)."""
        doc = {
            "url": self.url,
            "graph": graph_spec(self.graph),  # with its key ranges (rule 15)
            "delta_ms": self.grid.delta_ms,
            "window_slots": self.grid.window_slots,
            "secret": self.secret,
            "confirm": self.confirm,
            "wait_s": self.wait_s,
        }
        return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()

    @classmethod
    def from_option(cls, text: str) -> TrackerRef:
        doc = json.loads(base64.urlsafe_b64decode(text.encode()))
        graph = graph_of(doc["graph"])
        grid = TimeGrid(doc["delta_ms"], doc["window_slots"])
        return cls(doc["url"], graph, grid, doc["secret"], doc.get("confirm", True),
                   doc.get("wait_s", HOLD_WAIT_S))


def tracker_silent(what: str, url: str, did_not: str, wait_s: float, so: str) -> str:
    """The one line of a query stopped because its tracker did not answer within
    ``hold_wait_s`` (a window's hold, a sink's or a task's acks).

    >>> tracker_silent("sink 's'", "tcp://h:1", "confirm the acks of batch 3", 30,
    ...                "the query stopped")  # doctest: +NORMALIZE_WHITESPACE
    "sink 's': the tracker at tcp://h:1 did not confirm the acks of batch 3 within 30 s
    (hold_wait_s), so the query stopped: check the tracker (lowtide status --url
    tcp://h:1), then start the query again from its checkpoint"
    """
    return (f"{what}: the tracker at {url} did not {did_not} within {wait_s:g} s "
            f"(hold_wait_s), so {so}: check the tracker (lowtide status --url {url}), then "
            "start the query again from its checkpoint")


_factories: dict[str, Callable[[TrackerRef], AgentLike]] = {}
_lock = threading.Lock()


def register_scheme(scheme: str, factory: Callable[[TrackerRef], AgentLike] | None) -> None:
    """Route ``scheme://`` URLs to ``factory`` (None removes the route)."""
    with _lock:
        if factory is None:
            _factories.pop(scheme, None)
        else:
            _factories[scheme] = factory


def connect(ref: TrackerRef) -> AgentLike:
    """The process-wide agent for ``ref`` (created on first use)."""
    scheme = ref.url.split("://", 1)[0]
    with _lock:
        factory = _factories.get(scheme)
    if factory is not None:
        return factory(ref)
    from lowtide.service import Agent, CallerAgent

    text = ref.secret if ref.secret is not None else os.environ.get("LOWTIDE_SECRET")
    secret = text.strip().encode() if text else None
    # a task only makes calls, and blocks on them: its own thread runs the agent's loop
    kind = CallerAgent if _in_task() else Agent
    # the grid is part of the handshake: a tracker with another refuses the agent
    agent: AgentLike = kind.shared(ref.url, ref.graph, secret=secret, grid=ref.grid)
    return agent


def together(ref: TrackerRef) -> contextlib.AbstractContextManager[Any]:
    """A block whose requests to ``ref``'s tracker go out together, in one write (the
    agent's :meth:`~lowtide.service.client.base_agent.BaseAgent.together`; an agent
    plugged in for tests without it: as they come)."""
    block = getattr(connect(ref), "together", None)
    return contextlib.nullcontext() if block is None else block()


def _in_task() -> bool:
    try:
        from pyspark import TaskContext
    except ImportError:
        return False
    return TaskContext.get() is not None


def batch_key(query: str, batch_id: int, segment: str, partition: int) -> Any:
    """The idempotency key of one task's ack batch (rule 6)."""
    try:
        from lowtide.service import BatchKey
    except ImportError:  # no service installed: a plain tuple for in-process agents
        return (query, batch_id, segment, partition)
    return BatchKey(query, batch_id, segment, partition)


@dataclass(frozen=True)
class TaskIdentity:
    query: str
    batch_id: int
    partition: int
    attempt: int


class NotAStreamingTask(LowtideError, RuntimeError):
    """A tracked operator ran outside a streaming query's micro-batch."""


def task_identity() -> TaskIdentity:
    """Query id, batch id and partition of the running Spark task (rule 6)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        raise NotAStreamingTask("not inside a Spark task")
    query = tc.getLocalProperty("sql.streaming.queryId")
    batch = tc.getLocalProperty("streaming.sql.batchId")
    if query is None or batch is None:
        raise NotAStreamingTask(
            "tracked operators run in streaming queries only (no sql.streaming.queryId)"
        )
    return TaskIdentity(query, int(batch), tc.partitionId(), tc.attemptNumber())
