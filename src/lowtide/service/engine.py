"""The state behind a server: a core tracker plus dedup, fed by decoded requests.

Plain objects, no asyncio: the server's state task is their only caller, and tests
can drive them directly. Every state change goes through :meth:`Engine.handle`, so the
write-ahead log can record exactly the requests that were applied and replay them
through the same path after a crash.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowtide.core.diagnostics import StuckWindow
from lowtide.core.errors import ProtocolError
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import (
    AckBatch,
    MinTimeUpdate,
    RegisterFront,
    ShardReport,
    UnregisterFront,
)
from lowtide.core.time import TimeGrid
from lowtide.core.tracker import Tracker, TrackerConfig, TrackerSnapshot
from lowtide.service.dedup import Dedup
from lowtide.service.errors import ServiceError, error_of
from lowtide.wire.messages import Batch, Error, ErrorCode, FrontOp, Ok, ShardReleaseFrame

#: Requests that change tracker state, hence are logged and deduplicated.
StateRequest = Batch | FrontOp
Logged = Batch | FrontOp | ShardReleaseFrame


@dataclass(frozen=True)
class EngineConfig:
    graph: SegmentGraph
    grid: TimeGrid = TimeGrid()
    initial_windows: int = 1024
    max_windows: int = 1 << 20
    stuck_after_ms: int = 5_000
    dedup_retention_ms: int = 24 * 3_600_000
    max_keys: int = 1_000_000

    def tracker_config(self) -> TrackerConfig:
        return TrackerConfig(
            self.graph,
            self.grid,
            initial_windows=self.initial_windows,
            max_windows=self.max_windows,
            stuck_after_ms=self.stuck_after_ms,
        )

    def build(self) -> CentralEngine:
        return CentralEngine(self)


@dataclass(frozen=True)
class StepResult:
    """What one step produced: updates for subscribers, stuck windows to report, and
    (on a shard) a report for the coordinator."""

    updates: tuple[MinTimeUpdate, ...] = ()
    stuck: tuple[StuckWindow, ...] = ()
    report: ShardReport | None = None


class Engine(ABC):
    """Dedup and error handling shared by the central tracker and a shard."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.graph = config.graph
        self.dedup = Dedup(config.dedup_retention_ms, config.max_keys)
        self.acks_applied = 0
        # Rows per segment (rule 9 counts), for rows/s: since this process started, like
        # acks_applied (a restarted server counts from zero, plus the log it replays).
        self.received = np.zeros(len(config.graph.names), np.int64)
        self.sent = np.zeros(len(config.graph.names), np.int64)

    def handle(self, msg: StateRequest, now_ms: int) -> Ok | Error:
        """Apply a request at most once; the reply says what happened."""
        key = msg.key if isinstance(msg, Batch) else ""
        if self.dedup.seen(msg.session, msg.req, key):
            earlier = self.dedup.error_of(msg.session, msg.req)
            self.dedup.record(msg.session, msg.req, "", now_ms)
            return earlier or Ok(msg.req, duplicate=True)
        try:
            self._apply(msg)
        except (ProtocolError, ServiceError) as exc:
            err = error_of(msg.req, exc)
            self.dedup.record_error(msg.session, msg.req, err, now_ms)
            return err
        self.dedup.record(msg.session, msg.req, key, now_ms)
        if isinstance(msg, Batch):
            self.acks_applied += len(msg.acks)
            self._count_rows(msg.acks)
        return Ok(msg.req)

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
        sent = np.bincount(acks.segment, weights=np.maximum(counts, 0), minlength=n)
        received = np.bincount(acks.segment, weights=np.maximum(-counts, 0), minlength=n)
        self.sent += sent.astype(np.int64)
        self.received += received.astype(np.int64)

    def status_document(self) -> dict[str, Any]:
        """:meth:`status` with each segment's ``received`` and ``sent`` rows (a
        coordinator's status already holds its shards' sums)."""
        body = self.status()
        for seg, received, sent in zip(body["segments"], self.received, self.sent, strict=True):
            seg.setdefault("received", int(received))
            seg.setdefault("sent", int(sent))
        return body

    def tick(self, now_ms: int) -> None:
        self.dedup.expire(now_ms)

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

    async def aclose(self) -> None:  # noqa: B027 (optional hook, most engines hold nothing)
        """Release what the engine holds beyond its state (the coordinator's lanes)."""

    def apply_logged(self, msg: Logged, now_ms: int) -> None:
        """Replay one logged request; it was valid when logged, so it is valid now."""
        if isinstance(msg, ShardReleaseFrame):
            self.release(msg)
        else:
            self.handle(msg, now_ms)


def tracker_status(tracker: Tracker, graph: SegmentGraph) -> dict[str, Any]:
    """Per segment min time, bound and open windows; fronts; stuck windows."""
    segments = []
    for name in graph.names:
        windows, _x, counts = tracker.open_windows(name)
        segments.append(
            {
                "segment": name,
                "min_time": tracker.min_time(name),
                "bound": tracker.bound(name),
                "open_windows": len(windows),
                "in_flight": int(counts.sum()),
            }
        )
    return {
        "global_min": tracker.min_time(None),
        "segments": segments,
        "fronts": {str(f): list(v) for f, v in sorted(tracker.fronts().items())},
        "stuck": [s.describe() for s in tracker.stuck()],
    }


def export_tracker(snap: TrackerSnapshot) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
    windows, xors, counts, segments = snap.cells
    meta = {
        "fingerprint": snap.graph_fingerprint,
        "window_slots": snap.window_slots,
        "fronts": [list(f) for f in snap.fronts],
        "done_bounds": list(snap.done_bounds),
        "min_times": list(snap.min_times),
        "global_min": snap.global_min,
    }
    arrays: dict[str, np.ndarray[Any, Any]] = {
        "bases": snap.bases,
        "windows": windows,
        "xors": xors,
        "counts": counts,
        "segments": segments,
    }
    return meta, arrays


def import_tracker(
    meta: dict[str, Any], arrays: dict[str, np.ndarray[Any, Any]]
) -> TrackerSnapshot:
    cells = (
        arrays["windows"].astype(np.int64),
        arrays["xors"].astype(np.uint64),
        arrays["counts"].astype(np.int64),
        arrays["segments"].astype(np.int32),
    )
    return TrackerSnapshot(
        meta["fingerprint"],
        meta["window_slots"],
        arrays["bases"],
        cells,
        tuple((int(f), int(s), int(t)) for f, s, t in meta["fronts"]),
        tuple(meta["done_bounds"]),
        tuple(meta["min_times"]),
        meta["global_min"],
    )


class CentralEngine(Engine):
    """One tracker for the whole pipeline."""

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.tracker = config.tracker_config().build()

    def _apply(self, msg: StateRequest) -> None:
        if isinstance(msg, FrontOp):
            if msg.register:
                self.tracker.register_front(RegisterFront(msg.front, msg.segment, msg.time))
            else:
                self.tracker.unregister_front(UnregisterFront(msg.front))
            return
        if msg.node_time is not None:
            raise ServiceError(
                ErrorCode.BAD_REQUEST, "node times go to shards, not a central tracker"
            )
        self.tracker.apply_flush(msg.acks, msg.heartbeats)

    def step(self, now_ms: int) -> StepResult:
        step = self.tracker.step(now_ms)
        return StepResult(step.updates, step.stuck)

    def current(self, segment: str | None) -> MinTimeUpdate:
        return MinTimeUpdate(segment, self.tracker.min_time(segment))

    def status(self) -> dict[str, Any]:
        return tracker_status(self.tracker, self.graph)

    def export(self) -> tuple[dict[str, Any], dict[str, np.ndarray[Any, Any]]]:
        meta, arrays = export_tracker(self.tracker.snapshot())
        return {"tracker": meta, "dedup": self.dedup.export()}, arrays

    def restore(self, meta: dict[str, Any], arrays: dict[str, np.ndarray[Any, Any]]) -> None:
        self.tracker.restore(import_tracker(meta["tracker"], arrays))
        self.dedup.load(meta["dedup"])
