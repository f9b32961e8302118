"""What every engine does: dedup, refusals and row counts around a core tracker (a
central one, a shard) or the shards' aggregate (a coordinator), fed decoded requests.

Plain objects, no asyncio, no sockets: the server's state task is their only caller,
and tests drive them directly with messages and the clock (tests/service/engine/).
Every state change goes through :meth:`Engine.handle`, so the write-ahead log can
record exactly the requests that were applied and replay them through the same path
after a crash.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.core.dead_fronts import DeadFront, FrontTimeout
from lowtide.core.diagnostics import StuckWindow
from lowtide.core.errors import ProtocolError
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import (
    AckBatch,
    MinTimeUpdate,
    ShardReport,
)
from lowtide.core.time import TIME_LIMIT, TimeGrid
from lowtide.core.tracker import TrackerConfig
from lowtide.service.engine.dedup import Dedup
from lowtide.service.engine.front_events import FrontEvents
from lowtide.service.errors import ServiceError, Unproven, error_of
from lowtide.wire.messages import (
    Batch,
    ChangeGraph,
    Error,
    ErrorCode,
    FrontOp,
    Ok,
    QueryBatch,
    Refused,
    ShardReleaseFrame,
)

#: Requests that change tracker state, hence are logged and deduplicated.
StateRequest = Batch | FrontOp | ChangeGraph
Logged = Batch | FrontOp | ChangeGraph | ShardReleaseFrame | Refused


@dataclass(frozen=True)
class EngineConfig:
    graph: SegmentGraph
    grid: TimeGrid = TimeGrid()
    initial_windows: int = 1024
    max_windows: int = 1 << 20
    stuck_after_ms: int = 5_000
    dedup_retention_ms: int = 24 * 3_600_000
    max_keys: int = 1_000_000
    #: a live producer keeps its front from its owner's other sessions while seen within
    #: this long (:mod:`lowtide.core.holders`)
    front_lease_ms: int = 1_000
    #: a live front silent this long is dead, and the policy then (None: never)
    front_timeout: FrontTimeout | None = None

    def tracker_config(self) -> TrackerConfig:
        return TrackerConfig(
            self.graph,
            self.grid,
            initial_windows=self.initial_windows,
            max_windows=self.max_windows,
            stuck_after_ms=self.stuck_after_ms,
            front_lease_ms=self.front_lease_ms,
            front_timeout=self.front_timeout,
        )


@dataclass(frozen=True)
class StepResult:
    """What one step (or tick) produced: updates for subscribers, stuck windows to
    report, (on a shard) a report for the coordinator, and (on a coordinator) a
    release for every shard."""

    updates: tuple[MinTimeUpdate, ...] = ()
    stuck: tuple[StuckWindow, ...] = ()
    report: ShardReport | None = None
    release: ShardReleaseFrame | None = None
    dead: tuple[DeadFront, ...] = ()  # live fronts found dead (retired, or waited for)


class Engine(ABC):
    """Dedup and error handling shared by the central tracker, a shard and a
    coordinator."""

    #: its steps' min times hold every request it confirmed before them, so a question
    #: about the latest min time (``MinTimeAt``'s ``LATEST_MS``) is answered after the
    #: next step; one whose min times come from shards answers it as one about "now"
    steps_hold_confirmed = False

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.graph = config.graph
        self.dedup = Dedup(config.dedup_retention_ms, config.max_keys)
        self.acks_applied = 0
        # Rows per segment (rule 9 counts), for rows/s: since this process started, like
        # acks_applied (a restarted server counts from zero, plus the log it replays).
        self.received = np.zeros(len(config.graph.names), np.int64)
        self.sent = np.zeros(len(config.graph.names), np.int64)
        # acks into a key range (rule 15) count for its segment
        self._segment_of = (np.array(self.graph.cell_segments, np.int32)
                            if self.graph.key_ranges else None)
        #: min times stay below this (a shard that refused a flush it cannot prove)
        self.hold = TIME_LIMIT
        #: told of every refusal, to log it (the write-ahead log sets it after replay)
        self.on_refused: Callable[[Refused], None] | None = None
        self._expired_ms = -1
        #: the clock of the request being handled (declarations count deadlines from it)
        self.now_ms = 0
        self.front_events = FrontEvents()
        #: the graph changes applied (rule 16), for the status: one entry each
        self.generations: list[dict[str, Any]] = []

    def handle(self, msg: StateRequest, now_ms: int) -> Ok | Error:
        """Apply a request at most once; the reply says what happened. A refusal is
        final: a resend gets the same error, never a duplicate's Ok (rule 10)."""
        key = msg.key if isinstance(msg, Batch) else ""
        self._expire(now_ms)
        if self.dedup.seen(msg.session, msg.req, key):
            reply = self.dedup.outcome(msg.session, msg.req)
            self.dedup.record(msg.session, msg.req, "", now_ms)
            return reply
        try:
            failed = self.dedup.failure(msg.session)
            if failed is not None:
                raise ServiceError(ErrorCode.SESSION_FAILED, failed)
            self.now_ms = now_ms
            self._apply(msg)
        except (ProtocolError, ServiceError) as exc:
            return self._refuse(msg, exc, now_ms)
        self.dedup.record(msg.session, msg.req, key, now_ms)
        if isinstance(msg, Batch):
            self.acks_applied += len(msg.acks)
            self._count_rows(msg.acks)
        return Ok(msg.req)

    def _refuse(self, msg: StateRequest, exc: Exception, now_ms: int) -> Error:
        """Remember the refusal (and log it): a background flush that is refused fails
        its session, because its acks are now unknown here while its items may be in
        flight, and a later heartbeat of the session would let min times pass them."""
        err = error_of(msg.req, exc)
        fails = isinstance(msg, Batch) and not msg.key and err.code != ErrorCode.SESSION_FAILED
        hold = exc.hold if isinstance(exc, Unproven) else TIME_LIMIT
        refused = Refused(msg.session, msg.req, err.code, err.message, fails, hold)
        self.remember(refused, now_ms)
        if self.on_refused is not None:
            self.on_refused(refused)
        return err

    def _expire(self, now_ms: int) -> None:
        """Forget old dedup keys and sessions, with the requests rather than on the
        clock's ticks: a replay of the log then forgets exactly when the server did
        (a key forgotten before its resend was applied again, and must be again)."""
        if now_ms > self._expired_ms:
            self._expired_ms = now_ms
            self.dedup.expire(now_ms)

    def remember(self, refused: Refused, now_ms: int) -> None:
        self._expire(now_ms)
        err = Error(refused.req, refused.code, refused.message)
        self.dedup.record_error(refused.session, refused.req, err, now_ms)
        if refused.fails_session:
            self.dedup.fail(
                refused.session,
                f"session {refused.session} failed at request {refused.req}, a background "
                f"flush refused with {err.code.name}: {err.message}",
            )
        self.hold = min(self.hold, refused.hold)
        self.front_events.refused(refused)

    def _count_rows(self, acks: AckBatch) -> None:
        """Counts are +1 per send, -1 per receive: positive entries are rows sent into
        their segment, negative ones rows received out of it. One numpy pass per batch.
        (An agent merges one flush by segment and window, so a send and a receive of
        the same segment and window in one flush cancel: then both totals undercount
        by the same amount, and sent - received stays exact.)"""
        if len(acks) == 0:
            return
        n = len(self.received)
        counts = acks.count.astype(np.float64)  # bincount weights; exact below 2**53
        segs = acks.segment if self._segment_of is None else self._segment_of[acks.segment]
        sent = np.bincount(segs, weights=np.maximum(counts, 0), minlength=n)
        received = np.bincount(segs, weights=np.maximum(-counts, 0), minlength=n)
        self.sent += sent.astype(np.int64)
        self.received += received.astype(np.int64)

    def adopt_graph(self, graph: SegmentGraph) -> None:
        """Serve a later generation of the graph (rule 16): its attached segments
        count rows from zero."""
        grown = len(graph) - len(self.graph)
        self.graph = graph
        self.received = np.concatenate((self.received, np.zeros(grown, np.int64)))
        self.sent = np.concatenate((self.sent, np.zeros(grown, np.int64)))

    def identity(self) -> dict[str, Any]:
        """What a state dir must have been written for, besides the graph: the time
        grid (slots and windows mean nothing under another) and, on a shard, which
        windows it owns."""
        grid = self.config.grid
        return {"delta_ms": grid.delta_ms, "window_slots": grid.window_slots}

    def status_document(self) -> dict[str, Any]:
        """:meth:`status` with each segment's ``received`` and ``sent`` rows (a
        coordinator's status already holds its shards' sums)."""
        body = self.status()
        for i, (seg, received, sent) in enumerate(
                zip(body["segments"], self.received, self.sent, strict=True)):
            seg.setdefault("received", int(received))
            seg.setdefault("sent", int(sent))
            seg.setdefault("source", self.graph.is_source(i))
        body.setdefault("front_events", self.front_events.export())
        return body

    def report_batch(self, msg: QueryBatch, now_ms: int) -> Ok:
        """A query's driver says which batch it runs (not state: never logged). Only a
        central tracker uses it; elsewhere stuck windows count from their bound."""
        return Ok(msg.req)

    def tick(self, now_ms: int) -> StepResult:
        """Periodic work between requests (the coordinator's releases); none in the
        state, so that a replay of the log, which has no ticks, repeats it exactly."""
        return StepResult()

    @abstractmethod
    def _apply(self, msg: StateRequest) -> None: ...

    @abstractmethod
    def step(self, now_ms: int) -> StepResult: ...

    @abstractmethod
    def current(self, segment: str | None) -> MinTimeUpdate: ...

    @abstractmethod
    def status(self) -> dict[str, Any]: ...

    @abstractmethod
    def export(self) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
        """Everything needed to resume: JSON-able metadata and named arrays."""

    @abstractmethod
    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray[Any, Any]]) -> None: ...

    # Shard and coordinator duties; a central tracker has none of them.
    shards: tuple[str, ...] = ()
    """URLs of the shards agents send acks to (coordinator only)."""

    def release(self, msg: ShardReleaseFrame) -> None:
        raise ServiceError(ErrorCode.BAD_REQUEST, "release frames go to shards")

    def watch(self) -> ShardReport:
        """A report covering every flush not yet known complete (shard only)."""
        raise ServiceError(ErrorCode.BAD_REQUEST, "only shards send reports")

    def apply_logged(self, msg: Logged, now_ms: int) -> str | None:
        """Replay one logged request; it was valid when logged, so it is valid now (and
        a refused one stays refused). A graph change that no longer applies says why:
        recovery must not go on without it (rule 16)."""
        if isinstance(msg, ShardReleaseFrame):
            self.release(msg)
        elif isinstance(msg, Refused):
            self.remember(msg, now_ms)
        else:
            reply = self.handle(msg, now_ms)
            if isinstance(msg, ChangeGraph) and isinstance(reply, Error):
                return f"graph generation {msg.generation} does not apply: {reply.message}"
        return None
