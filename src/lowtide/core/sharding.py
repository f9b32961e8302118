"""Sharded tracking: N tracker processes, acks routed by window (rule 8).

Acks are routed by window: window ``w`` belongs to shard ``w % n_shards``. Every shard
sees every front and heartbeat, rounded up past the windows it does not own. A listener
combines the shards' reports; the global min is the minimum over shards.

A shard's tracker holds its own windows only, compressed (window ``w`` at ``w //
n_shards``; see :class:`~lowtide.core.tracker.Tracker`), so its table, scans and
releases shrink with the number of shards. Its reported min time per segment is the
start, in real slots, of the first window *it owns* that it does not know complete: no
owned window below it holds anything, and every other window belongs to another shard,
whose own report covers it; the minimum over shards (capped as below) stays safe.

Why not the rule as the paper states it. A shard's min time can go *down*: a node that
processes an item at time t (shard 0's window) may emit a child at t+1 (shard 1's window).
If shard 0 applies the parent's receive-ack first, both shards look complete past t+1
for a moment. The paper's listener accepts a shard update only if its node-time vector
is <= the element-wise minimum of all shards' latest vectors. With two or more nodes
that is not enough: it can combine shard 0's new report with an *older* accepted report
of shard 1 that predates the child's ack (see ``test_paper_rule_is_unsafe_with_two_nodes``).

What we do instead, and why it is safe. Each flush that carries acks also carries
NodeTime(node, counter, min_time) to every shard, applied atomically with the flush's
acks for that shard. For node n let lo[n] / hi[n] be the smallest / largest counter
over the shards' latest vectors. Flushes (n, c) with lo[n] < c <= hi[n] have been
applied by some shard but not by all; every ack they carry is at a time >= their
``min_time``. The aggregate is ``min(min over shards of latest min times, min over those
flushes of min_time)``. Below that cap every shard's table holds exactly the flushes
applied by all shards: a consistent cut of the protocol, hence a legal tracker state.
At quiescence no flush is in transit, the cap vanishes, and the aggregate is the plain
minimum (liveness).

Key ranges (rule 15). A key range is a checksum row of its own (``graph.cell``), routed
by window like a segment's, so reports and releases carry one min time per row: each
segment's, then each key range's (:func:`cell_names`). The aggregator takes, per range,
the same capped minimum over shards as per segment, and the argument above holds row by
row: a flush's ``min_time`` is its lowest ack in *any* row, ranges included, so below
the cap every shard holds the same flushes in every range's row too; and a shard's
range min time is built like a segment's (the first owned window not known complete,
below a bound that is the same range of its inbound segments, or the fronts feeding
it), a claim about its own windows that the minimum over shards makes a claim about
all. A split segment's own row holds nothing, so its min time is the minimum over its
ranges' combined ones: exactly what a consumer that ignores ranges sees on one tracker.

>>> from lowtide.core.graph import SegmentGraph
>>> layout = ShardLayout(n_shards=2, window_slots=10)
>>> layout.shard_of_time(25), layout.shard_bound(0, 25), layout.shard_bound(1, 25)
(0, 20, 30)
"""

from __future__ import annotations

from dataclasses import dataclass

from lowtide.core.errors import FrontBehind
from lowtide.core.fronts import AT_START
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import (
    AckBatch,
    DeclareFront,
    Flush,
    Heartbeat,
    MinTimeUpdate,
    NodeTime,
    RegisterFront,
    RetireFront,
    ShardFlush,
    ShardRelease,
    ShardReport,
    UnregisterFront,
)
from lowtide.core.time import TIME_LIMIT
from lowtide.core.tracker import Tracker, TrackerConfig


def cell_names(graph: SegmentGraph) -> tuple[str, ...]:
    """The name of each checksum row, in ``graph.cell`` order: every segment's, then
    each key range's ``"<segment>#<r>"``, the order of a report's min times."""
    return (*graph.names, *(graph.range_name(s, r) for s in range(len(graph))
                            for r in range(graph.ranges_of(s))))


@dataclass(frozen=True)
class ShardLayout:
    n_shards: int
    window_slots: int = 1

    def __post_init__(self) -> None:
        if self.n_shards <= 0:
            raise ValueError("n_shards must be positive")

    def shard_of_time(self, time: int) -> int:
        return (time // self.window_slots) % self.n_shards

    def shard_bound(self, shard: int, time: int) -> int:
        """A heartbeat at ``time`` as seen by ``shard``: rounded up to the start of the
        first window the shard owns that the heartbeat does not cover completely."""
        w0 = time // self.window_slots
        return (w0 + (shard - w0) % self.n_shards) * self.window_slots

    def split(self, batch: AckBatch) -> list[AckBatch]:
        owner = (batch.time // self.window_slots) % self.n_shards
        return [batch.take(owner == k) for k in range(self.n_shards)]


class ShardRouter:
    """Agent side: turns one node's flushes into per-shard flushes (rule 8)."""

    def __init__(self, layout: ShardLayout, node: int) -> None:
        self.layout = layout
        self.node = node
        self._counter = 0
        self._sent_bound: list[dict[int, int]] = [{} for _ in range(layout.n_shards)]

    def route(self, flush: Flush) -> list[ShardFlush]:
        node_time = None
        if len(flush.acks):
            self._counter += 1
            # A window start, so the aggregate stays on window boundaries.
            w = self.layout.window_slots
            node_time = NodeTime(self.node, self._counter, int(flush.acks.time.min()) // w * w)
        out: list[ShardFlush] = []
        for k, acks in enumerate(self.layout.split(flush.acks)):
            heartbeats = self._heartbeats_for(k, flush.heartbeats)
            if node_time is not None or heartbeats:
                out.append(ShardFlush(k, node_time, acks, heartbeats))
        return out

    def _heartbeats_for(
        self, shard: int, heartbeats: tuple[Heartbeat, ...]
    ) -> tuple[Heartbeat, ...]:
        """Only heartbeats whose rounded bound moved for this shard are worth sending."""
        sent = self._sent_bound[shard]
        out = []
        for hb in heartbeats:
            rounded = self.layout.shard_bound(shard, hb.time)
            if rounded > sent.get(hb.front, -1):
                sent[hb.front] = rounded
                out.append(hb)
        return tuple(out)


class TrackerShard:
    """One shard: a tracker over its own windows, plus node times and reports."""

    def __init__(self, config: TrackerConfig, layout: ShardLayout, index: int) -> None:
        if config.grid.window_slots != layout.window_slots:
            raise ValueError("shard layout and tracker grid disagree on window_slots")
        self.index = index
        self.layout = layout
        # Holds only the windows it owns, compressed (see Tracker): n times less to scan.
        self.tracker = Tracker(
            config,
            release_on_advance=False,
            owned_every=layout.n_shards,
            owned_index=index,
        )
        self._node_times: dict[int, int] = {}
        self._applied: list[tuple[int, int, int]] = []
        self._last_report: ShardReport | None = None
        # the highest min time reported, per checksum row (segment or key range)
        self._reported = [0] * config.graph.n_cells

    def register_front(self, msg: RegisterFront, now_ms: int = 0) -> None:
        time = self.layout.shard_bound(self.index, msg.time)
        floor = self._floor(msg.segment, msg.front)
        if time < floor and msg.front not in self.tracker.fronts():
            # a report saying "nothing below floor" may be announced (or on its way)
            raise FrontBehind(
                f"front {msg.front} registers at {msg.time}, below min time {floor} "
                f"that shard {self.index} reported: declare every front that may still "
                "produce with the pipeline"
            )
        self.tracker.register_front(
            RegisterFront(msg.front, msg.segment, time, msg.owner, msg.session), now_ms)

    def declare_front(self, msg: DeclareFront, now_ms: int = 0) -> None:
        """Held at the shard's rounding of ``time``, like a heartbeat there; never
        below what the shard reported."""
        time = msg.time
        if time != AT_START:
            floor = self._floor(msg.segment, msg.front)
            time = max(self.layout.shard_bound(self.index, time), floor)
        self.tracker.declare_front(
            DeclareFront(msg.front, msg.segment, time, msg.owner, msg.retire_after_ms), now_ms)

    def _floor(self, segment: str, front: int) -> int:
        """What this shard reported for what ``front`` feeds: its segment, or each key
        range of it that the front feeds (rule 15: a new front starts at or above each)."""
        g = self.tracker.graph
        return max(self._reported[c] for c in g.cells_fed(g.index(segment), front))

    def retire_front(self, msg: RetireFront) -> None:
        self.tracker.retire_front(msg)

    def unregister_front(self, msg: UnregisterFront, now_ms: int = 0) -> None:
        self.tracker.unregister_front(msg, now_ms)

    def receive(self, flush: ShardFlush, session: int | None = None, now_ms: int = 0) -> None:
        """Node time, acks and heartbeats of one flush, all or nothing (``session``:
        as for :meth:`Tracker.apply_flush`)."""
        heartbeats = [
            Heartbeat(h.front, self.layout.shard_bound(self.index, h.time), h.owner)
            for h in flush.heartbeats
        ]
        nt = flush.node_time
        if nt is not None and nt.counter <= self._node_times.get(nt.node, 0):
            return  # a resent flush: already applied
        self.tracker.apply_flush(flush.acks, heartbeats, session, now_ms)
        if nt is not None:
            self._node_times[nt.node] = nt.counter
            self._applied.append((nt.node, nt.counter, nt.min_time))

    def release(self, msg: ShardRelease) -> None:
        self.tracker.release(msg.min_times)

    def node_times(self) -> dict[int, int]:
        """The latest counter applied per node (for snapshots)."""
        return dict(self._node_times)

    def min_times(self) -> tuple[int, ...]:
        """The min time of each checksum row, in :func:`cell_names` order."""
        t = self.tracker
        return (*t.min_times(), *(m for name in t.graph.names for m in t.range_min_times(name)))

    def step(self, now_ms: int) -> ShardReport | None:
        """A report if the shard's min times or node times changed since the last one."""
        self.tracker.step(now_ms)
        report = ShardReport(
            self.index,
            self.min_times(),
            tuple(sorted(self._node_times.items())),
            tuple(self._applied),
        )
        last = self._last_report
        if last and not report.flushes and last.min_times == report.min_times:
            return None
        self._applied = []
        self._last_report = report
        self._reported = [max(a, b) for a, b in zip(self._reported, report.min_times, strict=True)]
        return report


class ShardAggregator:
    """Listener side: the guarded minimum over shards, per checksum row (a segment or a
    key range, rule 15) and global."""

    def __init__(self, graph: SegmentGraph, n_shards: int) -> None:
        self.graph = graph
        self._names = cell_names(graph)
        self._latest: list[ShardReport | None] = [None] * n_shards
        self._vectors: list[dict[int, int]] = [{} for _ in range(n_shards)]
        self._flush_min: dict[int, dict[int, int]] = {}
        self._cells = [0] * graph.n_cells  # announced, per checksum row
        self._global = 0

    def receive(self, report: ShardReport) -> list[MinTimeUpdate]:
        self._latest[report.shard] = report
        self._vectors[report.shard] = dict(report.node_times)
        for node, counter, min_time in report.flushes:
            self._flush_min.setdefault(node, {})[counter] = min_time
        reports = [r for r in self._latest if r is not None]
        if len(reports) < len(self._latest):
            return []
        cap = self._in_transit_cap()
        updates: list[MinTimeUpdate] = []
        for s in range(len(self.graph)):
            self._combine(s, cap, reports, updates)
        low = min(self.min_times())
        if low > self._global:
            self._global = low
            updates.append(MinTimeUpdate(None, low))
        return updates

    def _combine(self, s: int, cap: int, reports: list[ShardReport],
                 updates: list[MinTimeUpdate]) -> None:
        """Segment ``s``'s key ranges, each the capped minimum over the shards, then the
        segment: the minimum over its ranges, or the capped minimum if it has none."""
        ranges = [self.graph.cell(s, r) for r in range(self.graph.ranges_of(s))]
        for cell in ranges:
            self._raise(cell, min(cap, *(r.min_times[cell] for r in reports)), updates)
        if ranges:
            self._raise(s, min(self._cells[cell] for cell in ranges), updates)
        else:
            self._raise(s, min(cap, *(r.min_times[s] for r in reports)), updates)

    def _raise(self, cell: int, time: int, updates: list[MinTimeUpdate]) -> None:
        if time > self._cells[cell]:
            self._cells[cell] = time
            updates.append(MinTimeUpdate(self._names[cell], time))

    def min_times(self) -> tuple[int, ...]:
        """Each segment's announced min time."""
        return tuple(self._cells[: len(self.graph)])

    def range_min_times(self, segment: str) -> tuple[int, ...]:
        """The announced min time of each key range of ``segment`` (empty without)."""
        s = self.graph.index(segment)
        first = self.graph.cell(s, 0)
        return tuple(self._cells[first : first + self.graph.ranges_of(s)])

    def min_time(self, segment: str | None = None) -> int:
        """The global min time, a segment's, or a key range's (``"<segment>#<r>"``)."""
        if segment is None:
            return self._global
        s, r = self.graph.resolve(segment)
        return self._cells[s if r is None else self.graph.cell(s, r)]

    def release(self) -> ShardRelease:
        return ShardRelease(tuple(self._cells))

    def _in_transit_cap(self) -> int:
        cap = TIME_LIMIT
        for node, pending in self._flush_min.items():
            lo = min(v.get(node, 0) for v in self._vectors)
            for counter in [c for c in pending if c <= lo]:
                del pending[counter]
            if pending:
                cap = min(cap, min(pending.values()))
        return cap
