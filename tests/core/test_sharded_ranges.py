"""Key ranges (rule 15) on a sharded tracker (rule 8): worked examples, no sockets.

A shard reports a min time per checksum row (each segment's, then each key range's);
the aggregator takes, per range, the capped minimum over the shards, and a split
segment's min time is the minimum over its ranges' combined ones.
"""

from __future__ import annotations

import numpy as np
import pytest

from lowtide.core.errors import ProtocolError
from lowtide.core.graph import SegmentGraph, SegmentSpec
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
)
from lowtide.core.sharding import (
    ShardAggregator,
    ShardLayout,
    TrackerShard,
    cell_names,
)
from lowtide.core.time import TimeGrid
from lowtide.core.tracker import TrackerConfig
from tests.core.helpers import one_shard_beside_central

# src split into 2 key ranges: fronts 1 and 4 feed range 1 only, any other front every
# range; sink is not split
RANGED = SegmentGraph.of(
    SegmentSpec("src", (), key_ranges=2, front_ranges=((1, (1,)), (4, (1,)))),
    ("sink", ("src",)),
)
SRC, SINK = 0, 1
SRC0, SRC1 = RANGED.cell(SRC, 0), RANGED.cell(SRC, 1)


def shard(index: int, n_shards: int = 2, window_slots: int = 10) -> TrackerShard:
    config = TrackerConfig(RANGED, grid=TimeGrid(window_slots=window_slots))
    return TrackerShard(config, ShardLayout(n_shards, window_slots), index)


def beat(s: TrackerShard, *heartbeats: Heartbeat) -> None:
    s.receive(ShardFlush(s.index, None, AckBatch.empty(), heartbeats))


def acks(*rows: tuple[int, int, int, int]) -> AckBatch:
    return AckBatch.of(Ack(*r) for r in rows)


def test_rows_are_named_segments_first_then_key_ranges() -> None:
    assert cell_names(RANGED) == ("src", "sink", "src#0", "src#1")
    assert [RANGED.cell(SRC, r) for r in (0, 1)] == [2, 3]


def test_a_shard_reports_a_min_time_per_key_range() -> None:
    s0, s1 = shard(0), shard(1)  # windows of 10 slots: shard 0 owns [0, 10), [20, 30) ...
    for s in (s0, s1):
        s.register_front(RegisterFront(1, "src", 0))
        s.register_front(RegisterFront(2, "src", 0))
        beat(s, Heartbeat(2, 47))  # front 1 (range 1) stays at 0
    # src#0 follows front 2 alone; src#1 front 1 too; src and sink the minimum
    r0, r1 = s0.step(0), s1.step(0)
    assert r0 is not None and r1 is not None
    assert r0.min_times == (0, 0, 40, 0)  # (src, sink, src#0, src#1)
    assert r1.min_times == (10, 10, 50, 10)  # front 1 at 0 holds nothing shard 1 owns below 10
    # a row of range 0 at 45 holds src#0 of shard 0, which owns [40, 50)
    s0.receive(ShardFlush(0, NodeTime(7, 1, 40), acks((SRC0, 45, 0xA, +1))))
    later = s0.step(0)
    assert later is not None and later.min_times == (0, 0, 40, 0)
    assert later.flushes == ((7, 1, 40),)


def test_the_aggregator_takes_each_range_s_minimum_over_shards() -> None:
    agg = ShardAggregator(RANGED, n_shards=2)
    assert agg.receive(ShardReport(0, (0, 0, 40, 0), ())) == []  # shard 1 not heard yet
    # src#1 stays at 0 (shard 0's), and so do src and sink
    assert agg.receive(ShardReport(1, (10, 10, 50, 10), ())) == [MinTimeUpdate("src#0", 40)]
    assert agg.range_min_times("src") == (40, 0) and agg.min_time("src#0") == 40
    assert agg.min_times() == (0, 0) and agg.min_time() == 0
    # front 1 moves: range 1 catches up, and src (the minimum over its ranges) with it
    assert agg.receive(ShardReport(0, (30, 30, 40, 30), ())) == [  # shard 1 says 10
        MinTimeUpdate("src#1", 10),
        MinTimeUpdate("src", 10),
        MinTimeUpdate("sink", 10),
        MinTimeUpdate(None, 10),
    ]
    assert agg.receive(ShardReport(1, (50, 50, 50, 50), ())) == [
        MinTimeUpdate("src#1", 30),
        MinTimeUpdate("src", 30),
        MinTimeUpdate("sink", 30),
        MinTimeUpdate(None, 30),
    ]
    assert agg.release() == ShardRelease((30, 30, 40, 30))


def test_a_split_segment_is_the_minimum_over_its_combined_ranges() -> None:
    """Each range's combined min time only goes up; the segment's is their minimum, so
    it may pass the minimum over the shards' own segment min times (a report's ranges
    peaking at different times), and stays what a consumer that ignores ranges sees."""
    agg = ShardAggregator(RANGED, n_shards=2)
    agg.receive(ShardReport(1, (40, 40, 40, 40), ()))
    agg.receive(ShardReport(0, (10, 10, 30, 10), ()))
    assert (agg.range_min_times("src"), agg.min_time("src")) == ((30, 10), 10)
    # shard 0's src#0 goes down to 10 (a shard's min times may: rule 8), src#1 up to 30
    updates = agg.receive(ShardReport(0, (10, 10, 10, 30), ()))
    assert agg.range_min_times("src") == (30, 30)
    assert MinTimeUpdate("src", 30) in updates and agg.min_time("src") == 30


def test_the_in_transit_cap_holds_every_range() -> None:
    agg = ShardAggregator(RANGED, n_shards=2)
    agg.receive(ShardReport(0, (10, 10, 10, 10), ((1, 1),), ((1, 1, 3),)))
    agg.receive(ShardReport(1, (10, 10, 10, 10), ((1, 1),), ((1, 1, 3),)))
    # shard 0 applied node 1's flush 2 (a range-1 row at 12 and its child): shard 1
    # not yet, so neither range passes 12 however far both shards say they are
    agg.receive(ShardReport(0, (50, 50, 50, 50), ((1, 2),), ((1, 2, 12),)))
    assert agg.receive(ShardReport(1, (60, 60, 60, 60), ((1, 1),))) == [
        MinTimeUpdate("src#0", 12),
        MinTimeUpdate("src#1", 12),
        MinTimeUpdate("src", 12),
        MinTimeUpdate("sink", 12),
        MinTimeUpdate(None, 12),
    ]
    agg.receive(ShardReport(1, (60, 60, 60, 60), ((1, 2),), ((1, 2, 12),)))
    assert agg.range_min_times("src") == (50, 50)


def test_one_shard_with_key_ranges_behaves_like_a_central_tracker() -> None:
    flushes = [  # range 0 moves on while a row of range 1 (front 1's) is in flight
        Flush(0, 1, acks((SRC0, 3, 0xA, 1), (SRC1, 4, 0xB, 1)), (Heartbeat(2, 9),)),
        Flush(0, 2, acks((SINK, 3, 0xA1, 1), (SRC0, 3, 0xA, -1)), (Heartbeat(1, 9),)),
        Flush(0, 3, acks((SINK, 3, 0xA1, -1), (SRC1, 4, 0xB, -1)), (Heartbeat(2, 14),)),
        Flush(0, 4, AckBatch.empty(), (Heartbeat(1, 12),)),
    ]
    config = TrackerConfig(RANGED, grid=TimeGrid(window_slots=2))
    fronts = [RegisterFront(front, "src", 0) for front in (1, 2)]
    central, agg = one_shard_beside_central(config, fronts, flushes)
    assert agg.min_times() == central.min_times() == (12, 12)
    assert agg.range_min_times("src") == central.range_min_times("src") == (14, 12)


def test_a_release_lets_a_shard_forget_each_range_s_complete_windows() -> None:
    s = shard(0, n_shards=1, window_slots=1)
    s.register_front(RegisterFront(2, "src", 0))
    s.receive(ShardFlush(0, NodeTime(1, 1, 3), acks((SRC0, 3, 1, 1), (SRC0, 3, 1, -1)),
                         (Heartbeat(2, 9),)))
    rep = s.step(0)
    assert rep is not None and rep.min_times == (9, 9, 9, 9)
    s.release(ShardRelease((9, 9, 9, 5)))
    assert np.array_equal(s.tracker.snapshot().bases, np.array([9, 9, 9, 5]))


def test_a_new_front_starts_at_or_above_each_range_it_feeds_as_reported() -> None:
    """A shard refuses a front below what it reported for a range the front feeds (the
    report may be announced already); ranges the front does not feed do not count."""
    only = shard(0, n_shards=1, window_slots=1)
    only.register_front(RegisterFront(1, "src", 0))  # range 1
    only.register_front(RegisterFront(2, "src", 0))  # every range
    beat(only, Heartbeat(2, 50), Heartbeat(1, 20))
    rep = only.step(0)
    assert rep is not None and rep.min_times == (20, 20, 50, 20)
    with pytest.raises(ProtocolError, match="below min time 50"):
        only.register_front(RegisterFront(3, "src", 30))  # feeds range 0 too, at 50
    with pytest.raises(ProtocolError, match="below min time 20"):
        only.register_front(RegisterFront(4, "src", 10))  # range 1 only, at 20
    only.register_front(RegisterFront(4, "src", 30))  # below range 0's 50: fine
    only.register_front(RegisterFront(3, "src", 50))


def test_a_restarted_shard_keeps_each_range_s_released_floor() -> None:
    """A restarted shard has reported nothing yet: its floor for a new front is what
    the aggregator released for each range the front feeds (its snapshot's bases),
    not the segment's, the minimum over the ranges."""
    before = shard(0, n_shards=1, window_slots=1)
    before.release(ShardRelease((20, 20, 50, 20)))  # src#0 announced at 50, src#1 at 20
    restarted = shard(0, n_shards=1, window_slots=1)
    restarted.tracker.restore(before.tracker.snapshot())
    with pytest.raises(ProtocolError, match="below its segment's min time 50"):
        restarted.register_front(RegisterFront(3, "src", 30))  # feeds range 0 too
    restarted.register_front(RegisterFront(4, "src", 30))  # range 1 only
