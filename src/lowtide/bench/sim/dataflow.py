"""The simulated cluster: the paper's chain of pass-through vertices on K nodes.

Every node hosts one front and one instance of each of the ``vertices`` vertices. An
item goes front -> v1 -> ... -> vN -> bench stand, repartitioned round-robin over the
K instances before each vertex. *Stage* s is vertex s (1..N); stage 0 is the front and
stage N+1 the bench stand (the sink, on its own node). Each worker node is one
single-server FIFO queue: it processes one item hop (or marker) at a time.

The flow is the same for every tracking mode; two hooks make the difference:

* a :class:`Gate` decides whether an arriving entry may queue for processing now or
  is held back (marker alignment, snapshot buffering);
* a :class:`Tracking` sees every front emission, processed hop and sink arrival (the
  points where lowtide acks).

Entries are ints: ``>= 0`` an item index, ``< 0`` the marker ``-epoch``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from lowtide.bench.sim.events import EventLoop, Links
from lowtide.core.acks import child_acks, root_acks

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
US_PER_MS = 1_000


@dataclass(frozen=True)
class SimConfig:
    """One simulated run. Slots are 1 ms of virtual time (``TimeGrid(delta_ms=1)``)."""

    nodes: int = 10
    vertices: int = 10
    inputs: int = 5_000  # items over all fronts (rounded to whole marker epochs per front)
    granularity: int = 10  # items per front between markers; lowtide: window of as many
    rate_per_front_per_s: int = 400
    latency_us: tuple[int, int] = (100, 500)
    process_cost_us: int = 10
    marker_cost_us: int = 10  # a marker is a message like an item: as costly to handle
    flush_interval_us: int = 1_000
    tracker_tick_us: int = 100
    snapshot_ms: int | None = None  # snapshot duration; None: no snapshotting
    snapshot_window_ms: int = 1_000
    seed: int = 1

    @property
    def window_slots(self) -> int:
        """A tracking window of about ``granularity`` items per front."""
        return max(1, round(self.granularity * US_PER_MS / self.rate_per_front_per_s))

    @property
    def items_per_front(self) -> int:
        g = self.granularity
        return max(g, round(self.inputs / self.nodes / g) * g)


@dataclass(frozen=True)
class Workload:
    """Items and front schedules, fixed before the run (deterministic in the seed)."""

    front: I64  # item -> its front (= its node)
    emit_us: I64
    slot: I64
    epoch: I64  # item -> the marker epoch it belongs to (markers follow their epoch)
    acks: U64  # (items, vertices + 1): ack value of the item's copy in segment s
    schedules: tuple[tuple[tuple[int, int], ...], ...]  # per front: (time_us, entry)

    @property
    def inputs(self) -> int:
        return len(self.front)


def make_workload(cfg: SimConfig, markers: bool) -> Workload:
    """Poisson arrivals at every front; ack values chained through the vertices (rule 5).
    Markers: after every ``granularity`` items, or with snapshots at each snapshot window
    boundary (time-based, as checkpoint barriers are injected) and after a front's last
    item for the epochs still open."""
    rng = np.random.default_rng(cfg.seed)
    k, per = cfg.nodes, cfg.items_per_front
    gaps = rng.exponential(1e6 / cfg.rate_per_front_per_s, size=(k, per))
    emit = np.cumsum(gaps, axis=1).astype(np.int64).reshape(-1)
    front = np.repeat(np.arange(k, dtype=np.int64), per)
    seq = np.tile(np.arange(per, dtype=np.uint64), k)
    acks = np.empty((k * per, cfg.vertices + 1), np.uint64)
    acks[:, 0] = np.concatenate([root_acks(f, seq[:per]) for f in range(k)])
    zeros = np.zeros(k * per, np.uint64)
    for s in range(1, cfg.vertices + 1):
        acks[:, s] = child_acks(acks[:, s - 1], operator=s, child_index=zeros)
    if cfg.snapshot_ms is None:
        epoch = seq.astype(np.int64) // cfg.granularity + 1
    else:
        epoch = emit // (cfg.snapshot_window_ms * US_PER_MS) + 1
    last_epoch = int(epoch.max())  # every front closes every epoch, even past its items
    schedules = tuple(
        _schedule(
            emit[f * per : (f + 1) * per],
            epoch[f * per : (f + 1) * per],
            f * per,
            last_epoch if markers else 0,
            cfg,
        )
        for f in range(k)
    )
    return Workload(front, emit, emit // US_PER_MS, epoch, acks, schedules)


def _schedule(
    emit: I64, epoch: I64, first: int, last_epoch: int, cfg: SimConfig
) -> tuple[tuple[int, int], ...]:
    """One front's entries in order: items, and marker ``-e`` right after epoch e ends
    (``last_epoch`` 0: no markers)."""
    out: list[tuple[int, int]] = []
    if cfg.snapshot_ms is None:  # a marker after every granularity items
        for i, (t, e) in enumerate(zip(emit.tolist(), epoch.tolist(), strict=True)):
            out.append((t, first + i))
            if last_epoch and (i + 1 == len(emit) or int(epoch[i + 1]) != e):
                out.append((t, -e))
        return tuple(out)
    window_us = cfg.snapshot_window_ms * US_PER_MS
    done = 1  # the next marker to send, at its snapshot window's end
    for i, (t, e) in enumerate(zip(emit.tolist(), epoch.tolist(), strict=True)):
        if last_epoch:
            out += [(m * window_us, -m) for m in range(done, e)]
            done = max(done, e)
        out.append((t, first + i))
    if last_epoch:  # the stream ends: close the open epochs now (a final heartbeat's twin)
        out += [(out[-1][0], -m) for m in range(done, last_epoch + 1)]
    return tuple(out)


@dataclass
class BufferStats:
    """Items held back at an instance: one count per (item, instance), and the time."""

    count: int = 0
    total_us: int = 0

    def release(self, since_us: int, now_us: int) -> None:
        self.count += 1
        self.total_us += now_us - since_us


class Gate(Protocol):
    def admit(self, node: int, stage: int, ch: int, entry: int) -> bool: ...
    def marker_processed(self, node: int, stage: int, ch: int, epoch: int) -> None: ...
    def marker_at_sink(self, ch: int, epoch: int) -> None: ...


class Tracking(Protocol):
    def emitted(self, node: int, item: int) -> None: ...
    def processed(self, node: int, stage: int, item: int) -> None: ...
    def sunk(self, item: int) -> None: ...
    def front_done(self, node: int) -> None: ...


class OpenGate:
    """Everything is processed as it comes; there are no markers."""

    def admit(self, node: int, stage: int, ch: int, entry: int) -> bool:
        return True

    def marker_processed(self, node: int, stage: int, ch: int, epoch: int) -> None:
        raise AssertionError("a marker in a run without markers")

    def marker_at_sink(self, ch: int, epoch: int) -> None:
        raise AssertionError("a marker in a run without markers")


class NoTracking:
    """The markers' runs: nothing reports to a tracker."""

    def emitted(self, node: int, item: int) -> None:
        pass

    def processed(self, node: int, stage: int, item: int) -> None:
        pass

    def sunk(self, item: int) -> None:
        pass

    def front_done(self, node: int) -> None:
        pass


@dataclass
class Dataflow:
    """Moves entries through fronts, vertex instances and the bench stand."""

    cfg: SimConfig
    work: Workload
    loop: EventLoop
    links: Links
    gate: Gate = field(default_factory=OpenGate)
    tracking: Tracking = field(default_factory=NoTracking)
    buffering: BufferStats = field(default_factory=BufferStats)
    marker_copies: int = 0
    marker_network_copies: int = 0

    def __post_init__(self) -> None:
        k, n = self.cfg.nodes, self.cfg.vertices
        self.stand = k  # the bench stand's node; tracker nodes come after it
        self.sink_stage = n + 1
        self.free_us = [0] * k
        self.sink_us = [-1] * self.work.inputs
        # next destination per (node, sender stage); starts apart so nodes do not herd
        self._rr = [[(node + s) % k for s in range(n + 1)] for node in range(k)]

    def start(self) -> None:
        for f, schedule in enumerate(self.work.schedules):
            if schedule:
                self.loop.at(schedule[0][0], self._emit, f, 0)

    def enqueue(self, node: int, stage: int, ch: int, entry: int) -> None:
        """Queue at the node's single server (FIFO); the hop completes when served."""
        cost = self.cfg.process_cost_us if entry >= 0 else self.cfg.marker_cost_us
        now, free = self.loop.now_us, self.free_us[node]
        done = (free if free > now else now) + cost
        self.free_us[node] = done
        self.loop.at(done, self._processed, node, stage, ch, entry)

    def broadcast(self, node: int, stage: int, marker: int) -> None:
        """A marker from (node, stage) to every instance of the next stage."""
        dsts = [self.stand] if stage == self.cfg.vertices else range(self.cfg.nodes)
        for dst in dsts:
            self.marker_copies += 1
            self.marker_network_copies += dst != node
            self._send(node, dst, stage + 1, marker)

    def _emit(self, front: int, k: int) -> None:
        schedule = self.work.schedules[front]
        entry = schedule[k][1]
        if entry >= 0:
            self.tracking.emitted(front, entry)
            self._route(front, 0, entry)
        else:
            self.broadcast(front, 0, entry)
        if k + 1 < len(schedule):
            self.loop.at(schedule[k + 1][0], self._emit, front, k + 1)
        else:
            self.tracking.front_done(front)

    def _route(self, node: int, stage: int, item: int) -> None:
        if stage == self.cfg.vertices:
            dst = self.stand
        else:
            rr = self._rr[node]
            dst = rr[stage]
            rr[stage] = (dst + 1) % self.cfg.nodes
        self._send(node, dst, stage + 1, item)

    def _send(self, src: int, dst: int, stage: int, entry: int) -> None:
        arrival = self.links.arrival_us(src, dst, self.loop.now_us)
        self.loop.at(arrival, self._arrive, dst, stage, src, entry)

    def _arrive(self, node: int, stage: int, ch: int, entry: int) -> None:
        if stage == self.sink_stage:
            if entry < 0:
                self.gate.marker_at_sink(ch, -entry)
            else:
                self.sink_us[entry] = self.loop.now_us
                self.tracking.sunk(entry)
        elif self.gate.admit(node, stage, ch, entry):
            self.enqueue(node, stage, ch, entry)

    def _processed(self, node: int, stage: int, ch: int, entry: int) -> None:
        if entry < 0:
            self.gate.marker_processed(node, stage, ch, -entry)
            return
        self.tracking.processed(node, stage, entry)
        self._route(node, stage, entry)
