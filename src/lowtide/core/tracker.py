"""The tracker state machine: checksums per (segment, window), min times (rule 4).

Inputs (acks, heartbeats, fronts) are validated as a whole and then folded into state;
nothing is announced until :meth:`Tracker.step`, which walks the segments in
topological order and returns the min time updates and stuck windows as data.

Worked example, two segments, one front, window = 1 slot:

>>> from lowtide.core.graph import SegmentGraph
>>> from lowtide.core.messages import Ack, AckBatch, Heartbeat, RegisterFront
>>> tr = TrackerConfig(SegmentGraph.of(("src", ()), ("out", ("src",)))).build()
>>> tr.register_front(RegisterFront(front=1, segment="src", time=10))
>>> [u.time for u in tr.step(now_ms=0).updates]       # src, out and global jump to 10
[10, 10, 10]
>>> tr.apply(AckBatch.of([Ack(0, 10, 0xA, +1)]))        # item 0xA sent into src at t=10
>>> tr.heartbeat(Heartbeat(1, 12)); tr.step(0).updates  # src waits for the item
()
>>> tr.apply(AckBatch.of([Ack(1, 10, 0xB, +1), Ack(0, 10, 0xA, -1)]))  # child first
>>> [(u.segment, u.time) for u in tr.step(0).updates]
[('src', 12)]
>>> tr.apply(AckBatch.of([Ack(1, 10, 0xB, -1)]))        # the sink received the child
>>> [(u.segment, u.time) for u in tr.step(0).updates]
[('out', 12), (None, 12)]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from lowtide.core.dead_fronts import DeadFront, DeadFronts, FrontTimeout, InFlight
from lowtide.core.diagnostics import StuckDetector, StuckWindow, WaitingWindow
from lowtide.core.errors import GenerationOutOfOrder, GraphError, ProtocolError, UnknownSegment
from lowtide.core.fronts import (
    NEVER,
    DeadRow,
    Declared,
    FrontRow,
    FrontTable,
    SeenRow,
    check_time,
)
from lowtide.core.generations import (
    DetachedSegment,
    GraphChange,
    follows,
    next_graph,
    start_times,
)
from lowtide.core.graph import SegmentGraph
from lowtide.core.holders import HolderRow
from lowtide.core.messages import (
    I32,
    I64,
    U64,
    AckBatch,
    DeclareFront,
    Flush,
    Heartbeat,
    MinTimeUpdate,
    RegisterFront,
    RetireFront,
    UnregisterFront,
)
from lowtide.core.min_times import MinTimes
from lowtide.core.open_batches import QueryBatches
from lowtide.core.table import ChecksumTable
from lowtide.core.time import TIME_LIMIT, TimeGrid


@dataclass(frozen=True)
class TrackerConfig:
    graph: SegmentGraph
    grid: TimeGrid = TimeGrid()
    initial_windows: int = 1024
    max_windows: int = 1 << 20
    stuck_after_ms: int = 5_000
    #: how often steps look for stuck windows (None: a tenth of ``stuck_after_ms``,
    #: 100 ms to 1 s: :class:`~lowtide.core.diagnostics.StuckDetector`)
    stuck_check_ms: int | None = None
    #: how long a silent session keeps its front from another session of its owner
    #: (:mod:`lowtide.core.holders`); 0: a successor takes over at once
    front_lease_ms: int = 0
    #: a live front silent this long is dead, and what then (None: never dead)
    front_timeout: FrontTimeout | None = None
    #: a query's driver silent this long no longer holds stuck windows as waiting
    batch_forget_ms: int = 30_000

    def build(self) -> Tracker:
        return Tracker(self)


@dataclass(frozen=True)
class TrackerSnapshot:
    """Everything a tracker needs to resume exactly: sparse checksum cells, bases,
    fronts and announced min times. Plain data, for the persistence layer to store."""

    graph_fingerprint: str
    window_slots: int
    bases: I64
    cells: tuple[I64, U64, I64, I32]
    fronts: tuple[FrontRow, ...]  # (front, segment, time, owner)
    done_bounds: tuple[int, ...]
    min_times: tuple[int, ...]
    global_min: int
    declared: tuple[Declared, ...] = ()
    done_fronts: tuple[int, ...] = ()
    holders: tuple[HolderRow, ...] = ()  # (front, session, seen_ms)
    seen: tuple[SeenRow, ...] = ()  # (front, seen_ms, by a keyed batch): dead fronts
    dead_fronts: tuple[DeadRow, ...] = ()  # (front, segment, owner) retired as dead
    generation: int = 0  # of the graph (rule 16)
    graph: SegmentGraph | None = None  # that generation's graph; None: generation 0


@dataclass(frozen=True)
class Step:
    updates: tuple[MinTimeUpdate, ...] = ()
    stuck: tuple[StuckWindow, ...] = ()
    retired: tuple[Declared, ...] = ()  # declared fronts retired by their deadline
    dead: tuple[DeadFront, ...] = ()  # live fronts found dead (retired, or waited for)


class Tracker:
    """One tracker (central, or the engine inside a shard).

    ``release_on_advance``: a central tracker forgets windows as soon as they are
    complete, so its min times never go back. A shard keeps them until the aggregator
    releases them, because acks may still land behind its own min time.

    ``owned_every`` / ``owned_index``: the tracker holds only windows ``w`` with
    ``w % owned_every == owned_index`` (shard ``owned_index`` of ``owned_every``), and
    refuses acks for the others. Its checksum table stores them compressed, so the
    table, its scans and releases are ``owned_every`` times smaller. Every time it
    takes or gives (acks, heartbeats, fronts, min times, releases, snapshots) stays a
    real slot time. A segment's min time is then the start of the first *owned* real
    window that is not known complete (open, or not yet below the bound): a claim
    about owned windows only, which the aggregator's minimum over shards turns into a
    claim about all windows.
    """

    def __init__(
        self,
        config: TrackerConfig,
        *,
        release_on_advance: bool = True,
        owned_every: int = 1,
        owned_index: int = 0,
    ) -> None:
        self.config = config
        self.graph = config.graph
        n = len(self.graph)
        self._release = release_on_advance
        self._w = config.grid.window_slots
        self._table = ChecksumTable(
            self.graph.n_cells,
            config.initial_windows,
            config.max_windows,
            owned_every=owned_every,
            owned_index=owned_index,
        )
        self._fronts = FrontTable(n, config.front_lease_ms)
        self._times = MinTimes(self.graph, self._table, self._fronts, self._w,
                               release_on_advance)
        #: the graph's generation (rule 16): how many changes made it
        self.generation = 0
        self._mark_cells()
        self._stuck = StuckDetector(config.stuck_after_ms, config.stuck_check_ms)
        self._dead = DeadFronts(config.front_timeout)
        #: the queries' open batches (their drivers report them): what may still deliver
        self.batches = QueryBatches(config.batch_forget_ms)
        self.now_ms = 0  # the clock of the latest step

    def _mark_cells(self) -> None:
        """Which checksum rows are split by key range, or detached (rule 16)."""
        g = self.graph
        self._ranged = np.array([g.ranges_of(s) > 0 for s in range(len(g))]
                                + [False] * (g.n_cells - len(g)))
        self._gone = np.zeros(g.n_cells, bool)
        self._gone[list(g.detached)] = True

    # ------------------------------------------------------------ generations
    def change_graph(self, change: GraphChange) -> tuple[DetachedSegment, ...]:
        """Apply the next generation of the graph, all or nothing (rule 16). Attached
        segments start at ``change.start`` (the global min time if None; never below
        it), or below at their inbound segments' min times; detached ones report what
        they had in flight, drop their fronts and forget their windows."""
        if change.generation != self.generation + 1:
            raise GenerationOutOfOrder(
                f"graph generation {change.generation} does not follow generation "
                f"{self.generation}: changes apply in order, one at a time")
        try:
            graph = next_graph(self.graph, change)
        except GraphError as err:
            raise ProtocolError(str(err)) from None
        low = self._times.global_min
        start = low if change.start is None else change.start
        check_time(start, "start")
        if change.attach and start < low:
            raise ProtocolError(f"segments attached at time {start}, below the global min "
                                f"time {low}: nothing below it may enter any more (attach "
                                f"at or after {low})")
        starts = start_times(graph, self._times.mins, start // self._w * self._w)
        gone = [self.graph.index(name) for name in change.detach]
        detached = tuple(DetachedSegment(self.graph.names[s], self._in_flight(s))
                         for s in gone)
        self._adopt(graph, starts)
        for s in gone:
            self._fronts.detach(s)
            self._table.clear(s)
        self.generation = change.generation
        return detached

    def _adopt(self, graph: SegmentGraph, starts: list[int]) -> None:
        self._table.add_rows([t // self._w for t in starts])
        self._fronts.add_segments(starts)
        self._times.grow(graph, starts)
        self.graph = graph
        self.config = replace(self.config, graph=graph)
        self._mark_cells()

    # ----------------------------------------------------------------- inputs
    def _source(self, front: int, name: str) -> int:
        segment = self.graph.index(name)
        if self.graph.is_detached(segment):
            raise ProtocolError(f"front {front}: segment {name!r} is detached")
        if not self.graph.takes_fronts(segment):
            raise ProtocolError(f"front {front}: {name!r} has inbound segments")
        return segment

    def register_front(self, msg: RegisterFront, now_ms: int = 0) -> None:
        """``now_ms``: the clock :meth:`step` gets (the holder's lease counts in it)."""
        segment = self._source(msg.front, msg.segment)
        self._fronts.register(msg.front, segment, msg.time, self._times.floor(segment, msg.front),
                              msg.owner, msg.session, now_ms)

    def unregister_front(self, msg: UnregisterFront, now_ms: int = 0) -> None:
        self._fronts.unregister(msg.front, msg.owner, msg.session, now_ms)

    def declare_front(self, msg: DeclareFront, now_ms: int = 0) -> None:
        """``now_ms``: the clock that :meth:`step` gets, for ``retire_after_ms``."""
        segment = self._source(msg.front, msg.segment)
        after = msg.retire_after_ms
        if after is not None and after < 0:
            raise ProtocolError(f"front {msg.front}: retire_after_ms must be >= 0")
        retire_at = NEVER if after is None else now_ms + after
        self._fronts.declare(msg.front, segment, msg.time, self._times.floor(segment, msg.front),
                             msg.owner, retire_at)

    def retire_front(self, msg: RetireFront) -> None:
        self._fronts.retire(msg.front, msg.owner)

    def heartbeat(self, msg: Heartbeat, now_ms: int = 0) -> None:
        self._beat(msg, None, now_ms)

    def apply(self, batch: AckBatch) -> None:
        """Fold a batch of acks in, all or nothing."""
        windows, bounds = self._windows(batch)
        self._table.apply(batch.segment, windows, batch.xor, batch.count, bounds=bounds)

    def apply_flush(self, acks: AckBatch, heartbeats: Iterable[Heartbeat] = (),
                    session: int | None = None, now_ms: int = 0) -> None:
        """Acks, then heartbeats (rule 3), validated together before any is applied.
        ``session``: the sender's own flush (its heartbeats must come from the session
        holding their fronts); None: a keyed batch (they prove the owner only)."""
        hbs = list(heartbeats)
        windows, bounds = self._windows(acks)
        checked = self._table.check(acks.segment, windows, bounds)
        self._check_heartbeats(hbs, session)
        self._table.apply(
            acks.segment, windows, acks.xor, acks.count, checked=checked, bounds=bounds
        )
        for hb in hbs:
            self._beat(hb, session, now_ms)

    def receive_flush(self, flush: Flush) -> None:
        self.apply_flush(flush.acks, flush.heartbeats)

    # ---------------------------------------------------------------- outputs
    def step(self, now_ms: int) -> Step:
        """Retire declared fronts whose deadline passed, find dead fronts (rule 17),
        then advance every segment as far as its bound and its checksums allow."""
        self.now_ms = now_ms
        retired = tuple(self._fronts.expire(now_ms))
        self.batches.expire(now_ms)
        dead = tuple(self._dead.check(self._fronts, now_ms, self._busy, self._in_flight))
        updates = self._times.step()
        return Step(tuple(updates), tuple(self._check_stuck(now_ms)), retired, dead)

    def release(self, min_times: Iterable[int]) -> None:
        """Forget windows below ``min_times`` (per checksum row: each segment's, then each
        key range's), never past an open one."""
        for s, time in enumerate(min_times):
            self._table.release(s, time // self._w)

    def snapshot(self) -> TrackerSnapshot:
        live, done = self._fronts.export()
        declared, done_fronts = self._fronts.export_declared()
        holders = self._fronts.holders.export()
        return TrackerSnapshot(
            self.graph.fingerprint(),
            self._w,
            self._table.bases(),
            self._table.entries(),
            live,
            done,
            tuple(self._times.mins),
            self._times.global_min,
            declared,
            done_fronts,
            holders,
            *self._fronts.export_seen(),
            self.generation,
            self.graph if self.generation else None,
        )

    def restore(self, snap: TrackerSnapshot) -> None:
        """Load ``snap`` (taken from a tracker of the same graph and grid, or of a later
        generation of it: rule 16)."""
        if snap.graph is not None and snap.generation != self.generation:
            if snap.generation < self.generation or not follows(self.graph, snap.graph):
                raise GenerationOutOfOrder(
                    f"snapshot of graph generation {snap.generation} does not follow this "
                    f"tracker's generation {self.generation}")
            self._adopt(snap.graph, [0] * (len(snap.graph) - len(self.graph)))
            self.generation = snap.generation
        if snap.graph_fingerprint != self.graph.fingerprint() or snap.window_slots != self._w:
            raise ProtocolError("snapshot was taken from a different graph or window size")
        self._table.load(snap.bases, snap.cells)
        self._fronts.restore(snap.fronts, snap.done_bounds, snap.declared, snap.done_fronts,
                             snap.holders, snap.seen, snap.dead_fronts)
        self._times.restore(snap.min_times, snap.global_min)

    # ---------------------------------------------------------------- queries
    def min_time(self, segment: str | None = None) -> int:
        """The global min time, a segment's, or a key range's (``"<segment>#<r>"``)."""
        if segment is None:
            return self._times.global_min
        s, r = self.graph.resolve(segment)
        return self._times.mins[s] if r is None else self._times.range_mins[s][r]

    def range_min_times(self, segment: str) -> tuple[int, ...]:
        """The min time of each key range of ``segment`` (empty without ranges)."""
        return tuple(self._times.range_mins[self.graph.index(segment)])

    def min_times(self) -> tuple[int, ...]:
        return tuple(self._times.mins)

    def bound(self, segment: str) -> int:
        return self._times.bound(self.graph.index(segment))

    def stuck(self) -> list[StuckWindow]:
        return self._stuck.current()

    def waiting(self) -> list[WaitingWindow]:
        """Overdue windows a running batch may still deliver (not losses)."""
        return self._stuck.waiting()

    def dead_fronts(self) -> list[DeadFront]:
        """Dead fronts the ``wait`` policy waits for."""
        return self._dead.waited()

    def fronts(self) -> dict[int, tuple[str, int]]:
        return {f: (self.graph.names[s], t) for f, (s, t) in self._fronts.live().items()}

    def declared_fronts(self) -> dict[int, Declared]:
        """Declared fronts that have not registered yet (they hold their segment)."""
        return self._fronts.declared()

    def open_windows(self, segment: str) -> tuple[I64, U64, I64]:
        """Windows of ``segment`` still held open by the checksum table."""
        s = self.graph.index(segment)
        return self._table.open_windows(s, (TIME_LIMIT - 1) // self._w)

    # -------------------------------------------------------------- internals
    def _beat(self, hb: Heartbeat, session: int | None, now_ms: int) -> None:
        """A heartbeat; one of a front retired as dead (rule 17) by its owner, at or
        above its segment's min time, rejoins it there: it was only slow."""
        dead = self._fronts.retired_as_dead(hb.front)
        if dead is None:
            self._fronts.heartbeat(hb.front, hb.time, hb.owner, session, now_ms)
            return
        segment, owner = dead
        floor = self._times.floor(segment, hb.front)
        if hb.owner == owner and hb.time >= floor:
            self._fronts.register(hb.front, segment, hb.time, floor, owner, session or 0,
                                  now_ms)

    def _busy(self, s: int) -> bool:
        """A batch acking into segment ``s`` is open (it may carry heartbeats)."""
        return self.batches.busy(self.graph.names[s])

    def _in_flight(self, s: int) -> InFlight:
        """What is in flight in ``s``: its own row and its key ranges' (rule 15)."""
        g, w = self.graph, self._w
        out: InFlight = ()
        for cell in (s, *(g.cell(s, r) for r in range(g.ranges_of(s)))):
            windows, _x, counts = self._table.open_windows(cell, (TIME_LIMIT - 1) // w)
            out += tuple((int(i) * w, (int(i) + 1) * w, int(c))
                         for i, c in zip(windows.tolist(), counts.tolist(), strict=True) if c)
        return out

    def _windows(self, batch: AckBatch) -> tuple[I64, tuple[int, int] | None]:
        """The acks' windows and their (min, max), after checking segments and times
        (the table checks the rest)."""
        if len(batch) == 0:
            return batch.time, None
        seg = batch.segment
        cells = self.graph.n_cells
        if int(seg.min()) < 0 or int(seg.max()) >= cells:
            raise UnknownSegment(f"ack for segment outside [0, {cells})")
        if self.graph.detached and bool(self._gone[seg].any()):
            s = int(seg[self._gone[seg]][0])
            raise ProtocolError(f"ack into segment {self.graph.names[s]!r}, which is "
                                "detached (rule 16)")
        if cells > len(self.graph) and bool(self._ranged[seg].any()):
            s = int(seg[self._ranged[seg]][0])
            raise ProtocolError(f"ack into segment {self.graph.names[s]!r} without a key "
                                "range: its acks are split by key range (rule 15)")
        low, high = int(batch.time.min()), int(batch.time.max())
        check_time(low, "ack")
        check_time(high, "ack")
        w = self._w
        windows = batch.time if w == 1 else batch.time // w
        return windows, (low // w, high // w)

    def _check_heartbeats(self, heartbeats: list[Heartbeat], session: int | None) -> None:
        latest: dict[int, int] = {}
        for hb in heartbeats:
            self._fronts.check_heartbeat(hb.front, hb.time, hb.owner, latest.get(hb.front),
                                         session=session)
            latest[hb.front] = hb.time

    def _check_stuck(self, now_ms: int) -> list[StuckWindow]:
        if not self._stuck.due(now_ms):
            return []
        g, w = self.graph, self._w
        rows = [(g.names[s], s, self._times.mins[s], self._times.limits[s]) for s in range(len(g))
                if not g.ranges_of(s)]
        rows += [(g.range_name(s, r), g.cell(s, r), t, self._times.range_limits[s][r])
                 for s in range(len(g)) for r, t in enumerate(self._times.range_mins[s])]
        open_windows = {name: self._table.open_windows(cell, limit)
                        for name, cell, time, limit in rows if time // w < limit}
        return self._stuck.observe(now_ms, open_windows, w, self.batches)
