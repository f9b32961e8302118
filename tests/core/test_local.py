"""Local tracker: merging, ordering, heartbeats, size and age flushes, deadlines."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.core.errors import NonMonotonicHeartbeat
from lowtide.core.graph import SegmentGraph
from lowtide.core.local import LocalTracker, LocalTrackerConfig, merge_acks
from lowtide.core.messages import Ack, AckBatch, Heartbeat, RegisterFront
from lowtide.core.time import TimeGrid
from lowtide.core.tracker import TrackerConfig


def acks(*rows: tuple[int, int, int, int]) -> AckBatch:
    return AckBatch.of(Ack(*r) for r in rows)


def rows(batch: AckBatch) -> list[tuple[int, int, int, int]]:
    return [(a.segment, a.time, a.xor, a.count) for a in batch.to_acks()]


def local(window_slots: int = 10, max_age_ms: int = 5, max_entries: int = 65_536) -> LocalTracker:
    grid = TimeGrid(window_slots=window_slots)
    return LocalTrackerConfig(grid, max_age_ms=max_age_ms, max_entries=max_entries).build(node=3)


def test_merge_by_segment_and_window() -> None:
    merged = merge_acks(
        acks((0, 12, 0b001, 1), (0, 17, 0b010, 1), (1, 3, 0b100, 1), (0, 25, 0b1000, -1)),
        window_slots=10,
    )
    # slots 12 and 17 share window [10, 20): one entry, XORed, counts summed, time = start
    assert rows(merged) == [(1, 0, 0b100, 1), (0, 20, 0b1000, -1), (0, 10, 0b011, 2)]


def test_merge_orders_by_descending_segment_then_window() -> None:
    batch = acks(*[(s, t, 1 + 16 * s + t, 1) for s in (0, 2, 1) for t in (4, 0, 9, 2)])
    merged = merge_acks(batch, window_slots=1)
    keys = [(s, t) for s, t, _, _ in rows(merged)]
    assert keys == sorted(keys, reverse=True)
    assert len(keys) == 12


def test_send_and_receive_of_the_same_item_cancel_out() -> None:
    merged = merge_acks(acks((0, 5, 0xAB, 1), (1, 5, 0xCD, 1), (0, 5, 0xAB, -1)), window_slots=1)
    assert rows(merged) == [(1, 5, 0xCD, 1)]
    assert len(merge_acks(acks((0, 5, 0xAB, 1), (0, 5, 0xAB, -1)), 1)) == 0
    assert len(merge_acks(AckBatch.empty(), 1)) == 0


def test_a_zero_xor_with_a_non_zero_count_is_kept() -> None:
    # the same value sent twice (a duplicate): XOR cancels, the count tells
    merged = merge_acks(acks((0, 5, 0xAB, 1), (0, 5, 0xAB, 1)), window_slots=1)
    assert rows(merged) == [(0, 5, 0, 2)]


def test_flush_lists_acks_then_the_latest_heartbeat_per_front() -> None:
    lt = local()
    lt.add_heartbeat(Heartbeat(front=2, time=5), now_ms=0)
    lt.add_acks(acks((0, 12, 1, 1), (1, 3, 4, 1)), now_ms=0)
    lt.add_heartbeat(Heartbeat(front=1, time=20), now_ms=1)
    lt.add_heartbeat(Heartbeat(front=2, time=9), now_ms=1)
    lt.add_heartbeat(Heartbeat(front=2, time=9), now_ms=2)  # equal is fine
    assert lt.pending() == 4  # two acks, two fronts
    flush = lt.flush()
    assert flush is not None
    assert (flush.node, flush.seq) == (3, 1)
    assert rows(flush.acks) == [(1, 0, 4, 1), (0, 10, 1, 1)]
    assert flush.heartbeats == (Heartbeat(1, 20), Heartbeat(2, 9))
    assert lt.pending() == 0 and lt.flush() is None


def test_heartbeats_must_not_go_back_while_pending() -> None:
    lt = local()
    lt.add_heartbeat(Heartbeat(1, 10), now_ms=0)
    with pytest.raises(NonMonotonicHeartbeat):
        lt.add_heartbeat(Heartbeat(1, 9), now_ms=0)
    flush = lt.flush()
    assert flush is not None and flush.heartbeats == (Heartbeat(1, 10),)


def test_sequence_numbers_count_flushes() -> None:
    lt = local()
    seqs = []
    for i in range(3):
        lt.add_acks(acks((0, i, 1 + i, 1)), now_ms=i)
        flush = lt.flush()
        assert flush is not None
        seqs.append(flush.seq)
    assert seqs == [1, 2, 3]


def test_age_flush_and_deadline_follow_the_oldest_entry() -> None:
    lt = local(max_age_ms=5)
    assert lt.next_deadline_ms() is None
    assert lt.poll(now_ms=1_000) is None
    lt.add_acks(acks((0, 1, 1, 1)), now_ms=10)
    assert lt.next_deadline_ms() == 15
    lt.add_acks(acks((0, 20, 2, 1)), now_ms=13)
    lt.add_heartbeat(Heartbeat(1, 2), now_ms=14)
    assert lt.next_deadline_ms() == 15  # newer entries do not push the deadline
    assert lt.poll(now_ms=14) is None
    flush = lt.poll(now_ms=15)
    assert flush is not None and len(flush.acks) == 2 and flush.heartbeats == (Heartbeat(1, 2),)
    assert lt.next_deadline_ms() is None
    lt.add_heartbeat(Heartbeat(1, 3), now_ms=40)  # a heartbeat alone also starts the clock
    assert lt.next_deadline_ms() == 45


def test_size_flush() -> None:
    lt = local(max_age_ms=1_000, max_entries=3)
    lt.add_acks(acks((0, 1, 1, 1), (0, 2, 2, 1)), now_ms=0)
    lt.add_heartbeat(Heartbeat(1, 0), now_ms=0)  # heartbeats do not count towards the size
    assert lt.poll(now_ms=0) is None
    lt.add_acks(acks((1, 1, 3, 1)), now_ms=0)  # the size counts raw acks, before merging
    flush = lt.poll(now_ms=0)
    assert flush is not None and rows(flush.acks) == [(1, 0, 3, 1), (0, 0, 3, 2)]
    assert lt.poll(now_ms=0) is None


def test_empty_batches_do_not_start_the_clock() -> None:
    lt = local()
    lt.add_acks(AckBatch.empty(), now_ms=0)
    assert lt.next_deadline_ms() is None and lt.pending() == 0
    assert lt.flush() is None


def test_fully_cancelled_acks_still_flush_as_an_empty_batch() -> None:
    lt = local()
    lt.add_acks(acks((0, 5, 0xAB, 1)), now_ms=0)
    lt.add_acks(acks((0, 5, 0xAB, -1)), now_ms=1)
    flush = lt.poll(now_ms=5)
    assert flush is not None and len(flush.acks) == 0 and flush.heartbeats == ()


ack_rows = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(1, 15), st.sampled_from([1, -1])),
    max_size=30,
)


@settings(max_examples=100, deadline=None)
@given(rows_=ack_rows, window_slots=st.integers(1, 4), split=st.integers(0, 30))
def test_a_merged_flush_leaves_the_tracker_as_raw_acks_would(
    rows_: list[tuple[int, int, int, int]], window_slots: int, split: int
) -> None:
    graph = SegmentGraph.of(("a", ()), ("b", ("a",)), ("c", ("b",)))
    config = TrackerConfig(graph, grid=TimeGrid(window_slots=window_slots), initial_windows=2)
    raw, merged = config.build(), config.build()
    for tr in (raw, merged):
        tr.register_front(RegisterFront(1, "a", 0))
    lt = LocalTrackerConfig(TimeGrid(window_slots=window_slots)).build(node=0)
    lt.add_acks(acks(*rows_[:split]), now_ms=0)
    lt.add_acks(acks(*rows_[split:]), now_ms=1)
    lt.add_heartbeat(Heartbeat(1, 41), now_ms=1)
    flush = lt.flush()
    assert flush is not None
    raw.apply(acks(*rows_))
    raw.heartbeat(Heartbeat(1, 41))
    merged.receive_flush(flush)
    assert raw.step(0) == merged.step(0)
    for name in graph.names:
        rw, rx, rc = raw.open_windows(name)
        mw, mx, mc = merged.open_windows(name)
        assert rw.tolist() == mw.tolist()
        assert np.array_equal(rx, mx) and np.array_equal(rc, mc)
    assert all(t % window_slots == 0 for t in flush.acks.time.tolist())
