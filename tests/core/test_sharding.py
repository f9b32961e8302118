"""Sharding building blocks: layout, router, shard, aggregator (unit level)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.core.errors import AckBehindHead, ProtocolError
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import (
    Ack,
    AckBatch,
    Flush,
    Heartbeat,
    MinTimeUpdate,
    NodeTime,
    RegisterFront,
    ShardFlush,
    ShardRelease,
    ShardReport,
    UnregisterFront,
)
from lowtide.core.sharding import ShardAggregator, ShardLayout, ShardRouter, TrackerShard
from lowtide.core.time import TimeGrid
from lowtide.core.tracker import TrackerConfig
from tests.core.helpers import one_shard_beside_central

GRAPH = SegmentGraph.of(("src", ()), ("out", ("src",)))


def acks(*rows: tuple[int, int, int, int]) -> AckBatch:
    return AckBatch.of(Ack(*r) for r in rows)


def shard(index: int, n_shards: int = 2, window_slots: int = 10) -> TrackerShard:
    config = TrackerConfig(GRAPH, grid=TimeGrid(window_slots=window_slots))
    return TrackerShard(config, ShardLayout(n_shards, window_slots), index)


# ------------------------------------------------------------------ layout
def test_layout_worked_example() -> None:
    layout = ShardLayout(n_shards=2, window_slots=10)
    assert [layout.shard_of_time(t) for t in (0, 9, 10, 25, 39)] == [0, 0, 1, 0, 1]
    # a heartbeat at 25 covers window [10, 20) fully, [20, 30) only partly
    assert (layout.shard_bound(0, 25), layout.shard_bound(1, 25)) == (20, 30)
    assert (layout.shard_bound(0, 20), layout.shard_bound(1, 20)) == (20, 30)
    assert (layout.shard_bound(0, 30), layout.shard_bound(1, 30)) == (40, 30)


def test_layout_needs_a_shard() -> None:
    with pytest.raises(ValueError):
        ShardLayout(0)


@settings(max_examples=300, deadline=None)
@given(
    n_shards=st.integers(1, 5),
    window_slots=st.integers(1, 7),
    time=st.integers(0, 10_000),
    data=st.data(),
)
def test_shard_bound_is_the_first_owned_window_not_fully_covered(
    n_shards: int, window_slots: int, time: int, data: st.DataObject
) -> None:
    layout = ShardLayout(n_shards, window_slots)
    k = data.draw(st.integers(0, n_shards - 1))
    b = layout.shard_bound(k, time)
    assert b % window_slots == 0 and layout.shard_of_time(b) == k
    assert b + window_slots > time  # window b is not fully covered by the heartbeat
    assert b - n_shards * window_slots < time - time % window_slots + window_slots
    # every window of shard k that ends at or below `time` starts below b
    for w in range(0, time // window_slots):
        if w % n_shards == k:
            assert (w + 1) * window_slots <= b
    assert layout.shard_bound(k, time + 1) >= b  # monotonic


def test_split_partitions_rows_by_window() -> None:
    layout = ShardLayout(n_shards=3, window_slots=2)
    batch = acks(*[(t % 2, t, t + 1, 1) for t in range(12)])
    parts = layout.split(batch)
    assert len(parts) == 3
    assert sum(len(p) for p in parts) == len(batch)
    for k, part in enumerate(parts):
        assert all(layout.shard_of_time(t) == k for t in part.time.tolist())
    assert parts[1].time.tolist() == [2, 3, 8, 9]


# ------------------------------------------------------------------ router
def test_router_sends_node_time_with_every_ack_flush_to_every_shard() -> None:
    router = ShardRouter(ShardLayout(3, window_slots=10), node=7)
    out = router.route(Flush(7, 1, acks((0, 40, 1, 1), (1, 20, 2, 1), (0, 21, 3, -1))))
    assert [sf.shard for sf in out] == [0, 1, 2]
    assert {sf.node_time for sf in out} == {NodeTime(7, 1, 20)}
    assert [sf.acks.time.tolist() for sf in out] == [[], [40], [20, 21]]
    out = router.route(Flush(7, 2, acks((0, 55, 4, 1))))
    assert {sf.node_time for sf in out} == {NodeTime(7, 2, 50)}  # rounded to its window start
    assert router.route(Flush(7, 3, AckBatch.empty())) == []


def test_router_sends_heartbeats_only_where_the_rounded_bound_moves() -> None:
    router = ShardRouter(ShardLayout(2, window_slots=10), node=1)
    out = router.route(Flush(1, 1, AckBatch.empty(), (Heartbeat(5, 25),)))
    assert [(sf.shard, sf.node_time, sf.heartbeats) for sf in out] == [
        (0, None, (Heartbeat(5, 25),)),
        (1, None, (Heartbeat(5, 25),)),
    ]
    assert router.route(Flush(1, 2, AckBatch.empty(), (Heartbeat(5, 28),))) == []
    out = router.route(Flush(1, 3, AckBatch.empty(), (Heartbeat(5, 31),)))
    assert [(sf.shard, sf.heartbeats) for sf in out] == [(0, (Heartbeat(5, 31),))]
    # with acks, every shard gets the flush; heartbeats still only where they matter
    out = router.route(Flush(1, 4, acks((0, 33, 1, 1)), (Heartbeat(5, 33),)))
    assert [(sf.shard, sf.heartbeats) for sf in out] == [(0, ()), (1, ())]


# ------------------------------------------------------------------ shard
def test_shard_and_layout_must_agree_on_window_size() -> None:
    with pytest.raises(ValueError):
        TrackerShard(TrackerConfig(GRAPH, grid=TimeGrid(window_slots=5)), ShardLayout(2, 10), 0)


def test_shard_rounds_registrations_and_heartbeats() -> None:
    s0, s1 = shard(0), shard(1)
    for s in (s0, s1):
        s.register_front(RegisterFront(1, "src", 25))
    assert (s0.tracker.fronts(), s1.tracker.fronts()) == ({1: ("src", 20)}, {1: ("src", 30)})
    s0.receive(ShardFlush(0, None, AckBatch.empty(), (Heartbeat(1, 47),)))
    s1.receive(ShardFlush(1, None, AckBatch.empty(), (Heartbeat(1, 47),)))
    assert (s0.tracker.fronts(), s1.tracker.fronts()) == ({1: ("src", 40)}, {1: ("src", 50)})
    s0.unregister_front(UnregisterFront(1))
    assert s0.tracker.fronts() == {}


def test_shard_reports_changes_and_the_flushes_it_applied() -> None:
    s0 = shard(0)
    s0.register_front(RegisterFront(1, "src", 0))
    first = s0.step(0)
    assert first == ShardReport(0, (0, 0), (), ())
    assert s0.step(0) is None  # nothing changed
    s0.receive(ShardFlush(0, NodeTime(4, 1, 5), acks((0, 5, 0xA, 1)), (Heartbeat(1, 30),)))
    s0.receive(ShardFlush(0, NodeTime(9, 1, 12), AckBatch.empty()))
    report = s0.step(0)
    assert report == ShardReport(0, (0, 0), ((4, 1), (9, 1)), ((4, 1, 5), (9, 1, 12)))
    assert s0.step(0) is None
    s0.receive(ShardFlush(0, NodeTime(4, 2, 5), acks((0, 5, 0xA, -1))))
    assert s0.step(0) == ShardReport(0, (40, 40), ((4, 2), (9, 1)), ((4, 2, 5),))


def test_shard_ignores_a_resent_flush() -> None:
    s0 = shard(0)
    flush = ShardFlush(0, NodeTime(4, 1, 5), acks((0, 5, 0xA, 1)))
    s0.receive(flush)
    s0.receive(flush)  # applied at most once: the XOR would otherwise cancel
    assert s0.tracker.open_windows("src")[0].tolist() == [0]
    s0.step(0)
    s0.receive(flush)
    assert s0.step(0) is None


def test_shard_refuses_a_bad_flush_as_a_whole() -> None:
    s0 = shard(0)
    s0.register_front(RegisterFront(1, "src", 0))
    with pytest.raises(ProtocolError):
        s0.receive(ShardFlush(0, NodeTime(4, 1, 5), acks((0, 5, 0xA, 1)), (Heartbeat(2, 9),)))
    assert s0.tracker.open_windows("src")[0].tolist() == []
    assert s0.step(0) == ShardReport(0, (0, 0), (), ())  # node time not taken either


def test_shard_drops_windows_only_when_released() -> None:
    s0 = shard(0, window_slots=1)
    s0.register_front(RegisterFront(1, "src", 0))
    s0.receive(ShardFlush(0, None, AckBatch.empty(), (Heartbeat(1, 10),)))
    s0.step(0)
    s0.receive(ShardFlush(0, NodeTime(1, 1, 4), acks((0, 4, 1, 1), (0, 4, 1, -1))))
    s0.release(ShardRelease((8, 6)))
    with pytest.raises(AckBehindHead):
        s0.receive(ShardFlush(0, NodeTime(1, 2, 6), acks((0, 6, 1, 1))))
    s0.receive(ShardFlush(0, NodeTime(1, 2, 6), acks((1, 6, 1, 1))))


# ------------------------------------------------------------------ aggregator
def report(shard: int, mins: tuple[int, int], vector: dict[int, int], flushes=()) -> ShardReport:
    return ShardReport(shard, mins, tuple(sorted(vector.items())), tuple(flushes))


def test_aggregator_waits_for_every_shard() -> None:
    agg = ShardAggregator(GRAPH, n_shards=2)
    assert agg.receive(report(0, (30, 30), {})) == []
    assert agg.receive(report(1, (20, 40), {})) == [
        MinTimeUpdate("src", 20),
        MinTimeUpdate("out", 30),
        MinTimeUpdate(None, 20),
    ]
    assert agg.min_times() == (20, 30) and agg.min_time() == 20
    assert agg.release() == ShardRelease((20, 30))


def test_aggregator_never_goes_back() -> None:
    agg = ShardAggregator(GRAPH, n_shards=2)
    agg.receive(report(0, (30, 30), {}))
    agg.receive(report(1, (40, 40), {}))
    assert agg.receive(report(0, (10, 10), {})) == []
    assert agg.min_times() == (30, 30)
    assert agg.receive(report(0, (50, 35), {})) == [
        MinTimeUpdate("src", 40),
        MinTimeUpdate("out", 35),
        MinTimeUpdate(None, 35),
    ]
    assert agg.min_times() == (40, 35)


def test_aggregator_caps_by_flushes_not_yet_applied_everywhere() -> None:
    agg = ShardAggregator(GRAPH, n_shards=2)
    agg.receive(report(0, (10, 10), {1: 1}, [(1, 1, 3)]))
    agg.receive(report(1, (11, 11), {1: 1}, [(1, 1, 3)]))
    assert agg.min_times() == (10, 10)
    # shard 0 applied node 1's flush 2 (acks at >= 12); shard 1 has not yet
    assert agg.receive(report(0, (50, 50), {1: 2}, [(1, 2, 12)])) == [
        MinTimeUpdate("src", 11),
        MinTimeUpdate("out", 11),
        MinTimeUpdate(None, 11),
    ]
    assert agg.receive(report(1, (60, 60), {1: 1})) == [
        MinTimeUpdate("src", 12),
        MinTimeUpdate("out", 12),
        MinTimeUpdate(None, 12),
    ]
    # once every shard applied it, the cap is gone
    assert agg.receive(report(1, (60, 60), {1: 2}, [(1, 2, 12)])) == [
        MinTimeUpdate("src", 50),
        MinTimeUpdate("out", 50),
        MinTimeUpdate(None, 50),
    ]


def test_one_shard_behaves_like_a_central_tracker() -> None:
    flushes = [
        Flush(0, 1, acks((0, 3, 0xA, 1), (0, 6, 0xB, 1)), (Heartbeat(1, 9),)),
        Flush(0, 2, acks((1, 5, 0xA1, 1), (0, 3, 0xA, -1))),
        Flush(0, 3, acks((1, 5, 0xA1, -1), (0, 6, 0xB, -1)), (Heartbeat(1, 12),)),
    ]
    config = TrackerConfig(GRAPH, grid=TimeGrid(window_slots=2))
    central, agg = one_shard_beside_central(config, [RegisterFront(1, "src", 0)], flushes)
    assert agg.min_times() == central.min_times() == (12, 12)


def test_release_lets_shards_forget_complete_windows() -> None:
    s = shard(0, n_shards=1, window_slots=1)
    s.register_front(RegisterFront(1, "src", 0))
    s.receive(
        ShardFlush(0, NodeTime(1, 1, 3), acks((0, 3, 1, 1), (0, 3, 1, -1)), (Heartbeat(1, 9),))
    )
    rep = s.step(0)
    assert rep is not None and rep.min_times == (9, 9)
    assert s.tracker.open_windows("src")[0].tolist() == []
    s.release(ShardRelease((9, 9)))
    assert np.array_equal(s.tracker.snapshot().bases, np.array([9, 9]))


# ------------------------------------------------- regression: registration floor
def test_a_shard_refuses_a_front_below_a_min_time_it_reported() -> None:
    """Found by test_properties: the shard's floor used to be its released base only.
    A report saying "nothing below 5" may be on its way to the aggregator (or already
    announced, before the release comes back), so a front starting at 0 would make that
    announcement false."""
    graph = SegmentGraph.of(("s", ()))
    only = TrackerShard(TrackerConfig(graph), ShardLayout(1), 0)
    agg = ShardAggregator(graph, 1)
    only.register_front(RegisterFront(1, "s", 0))
    only.receive(ShardFlush(0, None, AckBatch.empty(), (Heartbeat(1, 5),)))
    report = only.step(0)
    assert report is not None and report.min_times == (5,)
    with pytest.raises(ProtocolError, match="below"):
        only.register_front(RegisterFront(2, "s", 4))
    assert only.tracker.fronts() == {1: ("s", 5)}
    only.register_front(RegisterFront(2, "s", 5))
    only.register_front(RegisterFront(1, "s", 6))  # a live front re-registering: a heartbeat
    assert agg.receive(report) == [MinTimeUpdate("s", 5), MinTimeUpdate(None, 5)]


def test_the_registration_floor_is_checked_per_shard_after_rounding() -> None:
    s0, s1 = shard(0), shard(1)  # 2 shards, windows of 10 slots
    for s in (s0, s1):
        s.register_front(RegisterFront(1, "src", 0))
        s.receive(ShardFlush(s.index, None, AckBatch.empty(), (Heartbeat(1, 25),)))
    reports = [s0.step(0), s1.step(0)]
    assert [r.min_times for r in reports if r is not None] == [(20, 20), (30, 30)]
    # a front at 21: shard 0 sees it from window [20, 30), shard 1 from [30, 40): fine
    for s in (s0, s1):
        s.register_front(RegisterFront(2, "src", 21))
    # a front at 15 would put items into shard 1's window [10, 20), reported complete
    s0.register_front(RegisterFront(3, "src", 15))
    with pytest.raises(ProtocolError):
        s1.register_front(RegisterFront(3, "src", 15))
