"""Key ranges (rule 15) and cycles (rule 11) in the central tracker: worked examples
(key ranges on shards: test_sharded_ranges.py)."""

from __future__ import annotations

import pytest

from lowtide.core.errors import ProtocolError
from lowtide.core.graph import SegmentGraph, SegmentSpec
from lowtide.core.messages import Ack, AckBatch, Heartbeat, NodeTime, RegisterFront, ShardFlush
from lowtide.core.sharding import ShardLayout, TrackerShard
from lowtide.core.tracker import Step, TrackerConfig

# src split into 4 key ranges; front 1 feeds range 3 only (the lagging one), front 2
# the other three; agg is split alike, so its ranges follow src's
RANGED = SegmentGraph.of(
    SegmentSpec("src", (), key_ranges=4, front_ranges=((1, (3,)), (2, (0, 1, 2)))),
    SegmentSpec("agg", ("src",), key_ranges=4),
    ("sink", ("agg",)),
)
SRC, AGG, SINK = 0, 1, 2


def changes(step: Step) -> dict[str | None, int]:
    return {u.segment: u.time for u in step.updates}


def test_ranges_fed_by_a_fast_front_move_on_while_a_lagging_one_waits() -> None:
    tr = TrackerConfig(RANGED).build()
    tr.register_front(RegisterFront(1, "src", 0))
    tr.register_front(RegisterFront(2, "src", 0))
    tr.heartbeat(Heartbeat(2, 50))  # front 1 (range 3) stays at 0
    got = changes(tr.step(0))
    assert {k: got[k] for k in ("src#0", "src#1", "src#2", "agg#0", "agg#2")} == \
        dict.fromkeys(("src#0", "src#1", "src#2", "agg#0", "agg#2"), 50)
    assert "src#3" not in got and tr.min_time("src") == 0 and tr.min_time("agg") == 0
    assert tr.range_min_times("agg") == (50, 50, 50, 0) and tr.min_time("agg#1") == 50
    # an item of range 1 in agg holds range 1 only
    tr.apply(AckBatch.of([Ack(RANGED.cell(AGG, 1), 60, 0xA, +1)]))
    tr.heartbeat(Heartbeat(2, 90))
    tr.heartbeat(Heartbeat(1, 70))
    tr.step(0)
    assert tr.range_min_times("agg") == (90, 60, 90, 70)
    assert tr.min_time("agg") == 60 == tr.min_time("sink")  # the minimum over ranges
    tr.apply(AckBatch.of([Ack(RANGED.cell(AGG, 1), 60, 0xA, -1)]))
    got = changes(tr.step(0))
    assert got["agg#1"] == 90 and got["agg"] == 70 and tr.min_time() == 70


def test_acks_into_a_split_segment_must_name_their_range() -> None:
    tr = TrackerConfig(RANGED).build()
    with pytest.raises(ProtocolError, match="without a key range"):
        tr.apply(AckBatch.of([Ack(SRC, 1, 0xA, +1)]))
    # a shard takes a graph with key ranges (rule 8 per range), and refuses alike
    shard = TrackerShard(TrackerConfig(RANGED), ShardLayout(2, window_slots=1), 1)
    with pytest.raises(ProtocolError, match="without a key range"):
        shard.receive(ShardFlush(1, NodeTime(1, 1, 1), AckBatch.of([Ack(SRC, 1, 0xA, +1)])))
    shard.register_front(RegisterFront(2, "src", 0))  # ranges 0..2
    shard.receive(ShardFlush(1, NodeTime(1, 1, 1),
                             AckBatch.of([Ack(RANGED.cell(SRC, 2), 1, 0xA, +1)]),
                             (Heartbeat(2, 5),)))
    shard.step(0)
    assert shard.tracker.range_min_times("src") == (5, 5, 1, 5)  # the row holds range 2


def test_a_new_front_starts_at_or_above_every_range_it_feeds() -> None:
    tr = TrackerConfig(RANGED).build()
    tr.register_front(RegisterFront(1, "src", 0))
    tr.register_front(RegisterFront(2, "src", 0))
    tr.heartbeat(Heartbeat(2, 50))
    tr.step(0)
    with pytest.raises(ProtocolError, match="below its segment's min time 50"):
        tr.register_front(RegisterFront(3, "src", 10))  # feeds every range, 0..2 at 50
    tr.register_front(RegisterFront(3, "src", 50))


# in -> work <-> retry -> (work) ; work -> out
LOOP = SegmentGraph.of(("in", ()), ("work", ("in", "retry")), ("retry", ("work",)),
                       ("out", ("work",)))
IN, WORK, RETRY, OUT = (LOOP.index(n) for n in ("in", "work", "retry", "out"))


def test_a_loop_shares_one_min_time_and_items_keep_their_time_around_it() -> None:
    tr = TrackerConfig(LOOP).build()
    tr.register_front(RegisterFront(1, "in", 0))
    tr.apply(AckBatch.of([Ack(IN, 5, 0xA, +1)]))
    tr.apply(AckBatch.of([Ack(WORK, 5, 0xB, +1), Ack(IN, 5, 0xA, -1)]))
    tr.apply(AckBatch.of([Ack(RETRY, 5, 0xC, +1), Ack(WORK, 5, 0xB, -1)]))  # failed: retry
    tr.heartbeat(Heartbeat(1, 20))
    got = changes(tr.step(0))
    # work holds nothing now, but the item in retry can come back into it at 5
    assert got["in"] == 20 and tr.min_time("work") == tr.min_time("retry") == 5
    tr.apply(AckBatch.of([Ack(WORK, 5, 0xD, +1), Ack(RETRY, 5, 0xC, -1)]))  # back, time 5
    assert tr.step(0) == Step()
    tr.apply(AckBatch.of([Ack(OUT, 5, 0xE, +1), Ack(WORK, 5, 0xD, -1)]))  # done: leaves
    got = changes(tr.step(0))
    assert got["work"] == got["retry"] == 20 and tr.min_time("out") == 5
