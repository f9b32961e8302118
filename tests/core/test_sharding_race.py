"""The sharding race (rule 8): a shard's min time can go down when a parent's
receive-ack and its child's send-ack land in two shards.

(i)  One node: shard 0 applies the parent's receive-ack before shard 1 applies the
     child's send-ack. A listener that takes the plain minimum over the shards' latest
     reports announces a min time the child has not passed. The paper's node-time rule
     and our ShardAggregator both hold back.
(ii) Two nodes: the paper's rule itself is unsafe. It combines shard 0's new report
     with an *older* accepted report of shard 1 from before the child's ack. The
     ShardAggregator caps the aggregate by the flushes some shard has not applied yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lowtide.core.acks import child_acks, root_acks
from lowtide.core.graph import SegmentGraph
from lowtide.core.local import LocalTracker, LocalTrackerConfig
from lowtide.core.messages import (
    Ack,
    AckBatch,
    Heartbeat,
    RegisterFront,
    ShardFlush,
    ShardReport,
)
from lowtide.core.sharding import ShardAggregator, ShardLayout, ShardRouter, TrackerShard
from lowtide.core.time import TIME_LIMIT, TimeGrid
from lowtide.core.tracker import TrackerConfig

GRID = TimeGrid(window_slots=1)
LAYOUT = ShardLayout(n_shards=2, window_slots=1)  # even slots: shard 0, odd slots: shard 1
FRONT = 1


class PlainMin:
    """No node-time guarding: per segment, the minimum over the shards' latest reports."""

    def __init__(self, n_shards: int) -> None:
        self.latest: list[ShardReport | None] = [None] * n_shards

    def receive(self, report: ShardReport) -> tuple[int, ...] | None:
        self.latest[report.shard] = report
        return _min_over(self.latest)


class PaperListener:
    """The paper's rule: accept a shard's report only when its node-time vector is <= the
    element-wise minimum of all shards' latest vectors; the min time is the minimum over
    the accepted reports. Charitable reading: a report not accepted on arrival is
    accepted later, as soon as the vectors allow it."""

    def __init__(self, n_shards: int) -> None:
        self.latest: list[ShardReport | None] = [None] * n_shards
        self.accepted: list[ShardReport | None] = [None] * n_shards

    def receive(self, report: ShardReport) -> tuple[int, ...] | None:
        self.latest[report.shard] = report
        if any(r is None for r in self.latest):
            return None
        vectors = [dict(r.node_times) for r in self.latest if r is not None]
        nodes = set().union(*vectors)
        floor = {n: min(v.get(n, 0) for v in vectors) for n in nodes}
        for k, r in enumerate(self.latest):
            if r is not None and all(c <= floor[n] for n, c in r.node_times):
                self.accepted[k] = r
        return _min_over(self.accepted)


def _min_over(reports: list[ShardReport | None]) -> tuple[int, ...] | None:
    if any(r is None for r in reports):
        return None
    return tuple(
        min(ts) for ts in zip(*(r.min_times for r in reports if r is not None), strict=True)
    )


@dataclass
class Cluster:
    """Shards, one local tracker and router per node, and three kinds of listeners."""

    graph: SegmentGraph
    nodes: tuple[int, ...]
    shards: list[TrackerShard] = field(init=False)
    local: dict[int, LocalTracker] = field(init=False)
    routers: dict[int, ShardRouter] = field(init=False)
    plain: PlainMin = field(init=False)
    paper: PaperListener = field(init=False)
    ours: ShardAggregator = field(init=False)
    in_flight: dict[int, tuple[str, int]] = field(default_factory=dict)  # value -> (segment, time)

    def __post_init__(self) -> None:
        config = TrackerConfig(self.graph, grid=GRID)
        self.shards = [TrackerShard(config, LAYOUT, k) for k in range(LAYOUT.n_shards)]
        self.local = {n: LocalTrackerConfig(GRID).build(n) for n in self.nodes}
        self.routers = {n: ShardRouter(LAYOUT, n) for n in self.nodes}
        self.plain = PlainMin(LAYOUT.n_shards)
        self.paper = PaperListener(LAYOUT.n_shards)
        self.ours = ShardAggregator(self.graph, LAYOUT.n_shards)

    def ack(self, node: int, segment: str, time: int, value: int, count: int) -> None:
        seg = self.graph.index(segment)
        self.local[node].add_acks(AckBatch.of([Ack(seg, time, value, count)]), now_ms=0)
        if count > 0:
            self.in_flight[value] = (segment, time)
        else:
            del self.in_flight[value]

    def flush(self, node: int) -> dict[int, ShardFlush]:
        """The node's flush, split per shard (not delivered yet)."""
        flush = self.local[node].flush()
        assert flush is not None
        return {sf.shard: sf for sf in self.routers[node].route(flush)}

    def deliver(self, shard_flush: ShardFlush) -> None:
        self.shards[shard_flush.shard].receive(shard_flush)

    def report(self, shard: int) -> ShardReport:
        rep = self.shards[shard].step(now_ms=0)
        assert rep is not None
        return rep

    def true_min(self, segment: str | None) -> int:
        """Smallest time truly in flight in ``segment`` (None: anywhere)."""
        times = [t for s, t in self.in_flight.values() if segment in (None, s)]
        return min(times, default=TIME_LIMIT)

    def assert_safe(self, mins: tuple[int, ...] | None, who: str) -> None:
        if mins is None:
            return
        for name, announced in zip(self.graph.names, mins, strict=True):
            assert announced <= self.true_min(name), (
                f"{who} announced {name} >= {announced}, but an item at "
                f"{self.true_min(name)} is in flight there"
            )

    def premature(self, mins: tuple[int, ...] | None) -> list[str]:
        if mins is None:
            return []
        return [
            name
            for name, announced in zip(self.graph.names, mins, strict=True)
            if announced > self.true_min(name)
        ]


def roots(n: int) -> list[int]:
    return [int(v) for v in root_acks(FRONT, np.arange(n, dtype=np.uint64))]


def child(parent: int, operator: int) -> int:
    return int(child_acks(np.array([parent], np.uint64), operator, np.zeros(1, np.uint64))[0])


def test_single_node_race_plain_min_announces_a_false_min_time() -> None:
    # the race: min time t; items t and t+1 land in shards 0 and 1; t+1 is fully
    # processed; processing t emits a child at t+1 ("replay in grouping operators").
    graph = SegmentGraph.of(("src", ()), ("grouped", ("src",)))
    c = Cluster(graph, nodes=(1,))
    for s in c.shards:
        s.register_front(RegisterFront(FRONT, "src", 0))
    t = 10
    a, b = roots(2)
    a1, b1 = child(a, operator=1), child(b, operator=1)

    c.ack(1, "src", t, a, +1)
    c.ack(1, "src", t + 1, b, +1)
    c.local[1].add_heartbeat(Heartbeat(FRONT, t + 2), now_ms=0)
    for sf in c.flush(1).values():
        c.deliver(sf)
    # item t+1 goes all the way through: its shard's checksum is back to zero
    c.ack(1, "grouped", t + 1, b1, +1)
    c.ack(1, "src", t + 1, b, -1)
    c.ack(1, "grouped", t + 1, b1, -1)
    for sf in c.flush(1).values():
        c.deliver(sf)
    for k in (0, 1):
        rep = c.report(k)
        for listener in (c.plain, c.paper):
            c.assert_safe(listener.receive(rep), type(listener).__name__)
        c.ours.receive(rep)
    assert c.plain.latest[0] is not None and c.plain.latest[1] is not None
    assert c.plain.latest[0].min_times == (t, t)  # item t holds shard 0
    assert c.plain.latest[1].min_times == (t + 3, t + 3)  # shard 1 is complete past t+1
    assert c.ours.min_times() == (t, t)

    # item t is processed: child at t+1 (shard 1), parent's receive at t (shard 0)
    c.ack(1, "grouped", t + 1, a1, +1)
    c.ack(1, "src", t, a, -1)
    parts = c.flush(1)
    c.deliver(parts[0])  # shard 0 applies its part first ...
    rep0 = c.report(0)
    assert rep0.min_times == (t + 2, t + 2)

    plain = c.plain.receive(rep0)
    assert plain == (t + 2, t + 2)
    assert c.premature(plain) == ["grouped"], "plain min should announce past the child"
    assert c.true_min("grouped") == t + 1 < plain[1]

    c.assert_safe(c.paper.receive(rep0), "paper rule")  # one node: the paper's rule holds
    c.ours.receive(rep0)
    c.assert_safe(c.ours.min_times(), "ShardAggregator")
    assert c.ours.min_times() == (t, t) and c.ours.min_time() == t

    c.deliver(parts[1])  # ... then shard 1 sees the child
    rep1 = c.report(1)
    for listener in (c.plain, c.paper):
        c.assert_safe(listener.receive(rep1), type(listener).__name__)
    c.ours.receive(rep1)
    c.assert_safe(c.ours.min_times(), "ShardAggregator")
    assert c.ours.min_times() == (t + 2, t + 1) and c.ours.min_time() == t + 1

    c.ack(1, "grouped", t + 1, a1, -1)  # the child leaves: everything reaches t+2
    for sf in c.flush(1).values():
        c.deliver(sf)
    c.ours.receive(c.report(1))
    assert c.ours.min_times() == (t + 2, t + 1)  # until shard 0 reports node time 4 too
    c.ours.receive(c.report(0))
    assert c.ours.min_times() == (t + 2, t + 2) and c.ours.min_time() == t + 2


def test_paper_rule_is_unsafe_with_two_nodes() -> None:
    graph = SegmentGraph.of(("src", ()), ("out", ("src",)))
    n, m = 1, 2
    c = Cluster(graph, nodes=(n, m))
    for s in c.shards:
        s.register_front(RegisterFront(FRONT, "src", 0))
    t = 10
    p, q = roots(2)  # p at t (shard 0), q at 20 (shard 0), both from node n's front
    p1, q1 = child(p, operator=1), child(q, operator=1)

    c.ack(n, "src", t, p, +1)
    c.ack(n, "src", 20, q, +1)
    c.local[n].add_heartbeat(Heartbeat(FRONT, 30), now_ms=0)
    for sf in c.flush(n).values():  # n:1 reaches both shards
        c.deliver(sf)
    old = [c.report(0), c.report(1)]
    assert [r.min_times for r in old] == [(t, t), (31, 31)]  # shard 1 complete past t+1
    for rep in old:
        for listener in (c.plain, c.paper):
            c.assert_safe(listener.receive(rep), type(listener).__name__)
        c.ours.receive(rep)
    assert c.paper.accepted == old

    # node m processes q (unrelated to p): child q' at 21 -> shard 1, q's receive -> shard 0
    c.ack(m, "out", 21, q1, +1)
    c.ack(m, "src", 20, q, -1)
    m1 = c.flush(m)
    # node n processes p: child p' at t+1 -> shard 1 (already complete), p's receive -> shard 0
    c.ack(n, "out", t + 1, p1, +1)
    c.ack(n, "src", t, p, -1)
    n2 = c.flush(n)
    assert set(m1) == set(n2) == {0, 1}  # both flushes carry acks for both shards

    # shard 1 applies m's flush, then n's; shard 0 applies n's flush first
    c.deliver(m1[1])
    c.deliver(n2[1])
    rep1 = c.report(1)
    c.deliver(n2[0])
    rep0 = c.report(0)
    assert dict(rep1.node_times) == {n: 2, m: 1} and rep1.min_times == (31, t + 1)
    assert dict(rep0.node_times) == {n: 2} and rep0.min_times == (20, 20)

    for rep in (rep1, rep0):
        paper = c.paper.receive(rep)
        c.ours.receive(rep)
        c.assert_safe(c.ours.min_times(), "ShardAggregator")
    # the paper listener accepted shard 0's new report (vector {n: 2} <= {n: 2, m: 0})
    # and kept shard 1's old one, from before p' was sent
    assert c.paper.accepted == [rep0, old[1]]
    assert paper == (20, 20)
    assert c.true_min("out") == t + 1
    assert c.premature(paper) == ["out"], (
        "the paper's rule announces out >= 20 while p' (t+1) is in flight"
    )
    assert min(paper) > c.true_min(None)  # and a premature global min time
    # ours: m's flush is applied by shard 1 only, so the aggregate is capped at its min_time
    assert c.ours.min_times() == (20, t + 1) and c.ours.min_time() == t + 1

    # shard 0 catches up, then the children leave: the cap vanishes and min times advance
    c.deliver(m1[0])
    c.ours.receive(c.report(0))
    assert c.ours.min_times() == (30, t + 1)
    c.ack(m, "out", t + 1, p1, -1)
    c.ack(m, "out", 21, q1, -1)
    for sf in c.flush(m).values():
        c.deliver(sf)
    for k in (0, 1):
        c.ours.receive(c.report(k))
    assert c.ours.min_times() == (30, 30) and c.ours.min_time() == 30
