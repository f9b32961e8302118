"""A shard's table holds only the windows it owns, compressed (window w at w // N).

Everything outside the table stays in real windows and slot times; these tests pin the
mapping down: round trips, scans and releases in real windows, refusals, and a worked
example of the min times a shard reports (safe: the start of the first owned real window
not known complete).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.core.errors import AckBehindHead, ProtocolError, TableOverflow
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import (
    Ack,
    AckBatch,
    Heartbeat,
    MinTimeUpdate,
    NodeTime,
    RegisterFront,
    ShardFlush,
)
from lowtide.core.sharding import ShardAggregator, ShardLayout, TrackerShard
from lowtide.core.table import ChecksumTable
from lowtide.core.time import TimeGrid
from lowtide.core.tracker import TrackerConfig

Cells = dict[tuple[int, int], tuple[int, int]]


def put(t: ChecksumTable, segment: int, windows: list[int], xor: int = 5, count: int = 1) -> None:
    n = len(windows)
    t.apply(
        np.full(n, segment, np.int32),
        np.asarray(windows, np.int64),
        np.full(n, xor, np.uint64),
        np.full(n, count, np.int64),
    )


def cells(t: ChecksumTable) -> Cells:
    windows, xors, counts, segments = t.entries()
    return {
        (int(s), int(w)): (int(x), int(c))
        for w, x, c, s in zip(windows, xors, counts, segments, strict=True)
    }


def first_owned_at_or_after(window: int, every: int, index: int) -> int:
    return window + (index - window) % every


# ------------------------------------------------------------------ the table
def test_round_trip_real_compressed_real() -> None:
    """Window w = c * N + k is stored at column c; every API answer is real again."""
    for every in (1, 2, 3, 5):
        for index in range(every):
            t = ChecksumTable(1, initial_windows=4, owned_every=every, owned_index=index)
            owned = [c * every + index for c in range(40)]
            put(t, 0, owned)
            assert sorted(w for _, w in cells(t)) == owned
            assert t.open_windows(0, limit=10**6)[0].tolist() == owned
            assert t.first_open(0, limit=10**6) == owned[0]
            assert t.capacity == 64  # 40 held windows, not 40 * every
            assert t.base(0) == index == t.bases().tolist()[0]


def test_a_strided_scan_answers_owned_windows_only() -> None:
    t = ChecksumTable(2, initial_windows=8, owned_every=3, owned_index=2)  # owns 2, 5, 8, ...
    put(t, 0, [8, 14])
    assert t.first_open(0, limit=100) == 8
    assert t.first_open(0, limit=8) == 8  # nothing open below 8: first owned at or after 8
    assert t.first_open(0, limit=6) == 8  # [2, 6) holds 2 and 5, both zero: next owned is 8
    assert t.first_open(0, limit=0) == 2  # the base
    assert t.first_open(1, limit=10) == 11
    t.release(0, 12)  # drops 2 and 5, stops at the open window 8
    assert t.base(0) == 8
    put(t, 0, [8], count=-1)
    t.release(0, 12)
    assert t.base(0) == 14  # 11 was zero, and 14 is the first owned window at or after 12
    with pytest.raises(AckBehindHead, match=r"window 11 .* complete up to window 14"):
        put(t, 0, [11])


def test_a_strided_table_refuses_windows_it_does_not_own() -> None:
    t = ChecksumTable(1, initial_windows=8, owned_every=2, owned_index=1)
    put(t, 0, [1, 3])
    before = cells(t)
    with pytest.raises(ProtocolError, match=r"window 4 .* does not hold"):
        put(t, 0, [5, 4])
    assert cells(t) == before
    with pytest.raises(ValueError):
        ChecksumTable(1, owned_every=2, owned_index=2)


def test_strided_entries_and_load_round_trip() -> None:
    t = ChecksumTable(2, initial_windows=4, max_windows=64, owned_every=4, owned_index=3)
    t.release(0, 20)  # base 23
    put(t, 0, [23, 31, 99], xor=9)
    put(t, 1, [3, 7], count=-1)
    other = ChecksumTable(2, initial_windows=2, max_windows=64, owned_every=4, owned_index=3)
    put(other, 1, [11])  # wiped by load
    other.load(t.bases(), t.entries())
    assert cells(other) == cells(t)
    assert other.bases().tolist() == t.bases().tolist() == [23, 3]
    # a real base that is not owned loads as the first owned window at or after it
    one = (np.array([23]), np.array([1], np.uint64), np.array([1]), np.array([0], np.int32))
    other.load(np.array([21, 0]), one)
    assert other.bases().tolist() == [23, 3] and cells(other) == {(0, 23): (1, 1)}


ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("apply"),
            st.lists(
                st.tuples(
                    st.integers(0, 1), st.integers(-2, 40), st.integers(0, 3), st.integers(-1, 1)
                ),
                min_size=1,
                max_size=5,
            ),
            st.booleans(),  # add a row for a window the table does not own
        ),
        st.tuples(st.just("release"), st.integers(0, 1), st.integers(0, 200)),
        st.tuples(st.just("scan"), st.integers(0, 1), st.integers(0, 200)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(
    ops=ops,
    initial=st.sampled_from([1, 2, 4, 8]),
    shape=st.sampled_from([(1, 0), (2, 0), (2, 1), (3, 1), (4, 3)]),
)
def test_strided_table_matches_a_dictionary_model_in_real_windows(
    ops: list[tuple], initial: int, shape: tuple[int, int]
) -> None:
    every, index = shape
    max_windows = 32  # held (compressed) windows
    t = ChecksumTable(
        2, initial_windows=initial, max_windows=max_windows, owned_every=every, owned_index=index
    )
    model: Cells = {}
    base = [index, index]  # real windows

    def expect_scan(s: int, limit: int) -> int:
        open_ = sorted(w for (ms, w) in model if ms == s and base[s] <= w < limit)
        return open_[0] if open_ else first_owned_at_or_after(max(base[s], limit), every, index)

    for op in ops:
        if op[0] == "apply":
            rows = [(s, base[s] + off * every, x, c) for s, off, x, c in op[1]]
            if op[2] and every > 1:
                rows.append((0, base[0] + 1, 1, 1))
            args = (
                np.array([r[0] for r in rows], np.int32),
                np.array([r[1] for r in rows], np.int64),
                np.array([r[2] for r in rows], np.uint64),
                np.array([r[3] for r in rows], np.int64),
            )
            if op[2] and every > 1:
                with pytest.raises(ProtocolError, match="does not hold"):
                    t.apply(*args)
            elif any(w < base[s] for s, w, _, _ in rows):
                with pytest.raises(AckBehindHead):
                    t.apply(*args)
            elif any((w - base[s]) // every >= max_windows for s, w, _, _ in rows):
                with pytest.raises(TableOverflow):
                    t.apply(*args)
            else:
                t.apply(*args)
                for s, w, x, c in rows:
                    ox, oc = model.get((s, w), (0, 0))
                    model[(s, w)] = (ox ^ x, oc + c)
                model = {k: v for k, v in model.items() if v != (0, 0)}
        elif op[0] == "release":
            _, s, target = op
            if target > base[s]:
                open_ = [w for (ms, w) in model if ms == s and base[s] <= w < target]
                base[s] = min(open_) if open_ else first_owned_at_or_after(target, every, index)
            t.release(s, target)
        else:  # a scan alone moves the clean mark: the next checks must not be fooled
            _, s, limit = op
            assert t.first_open(s, limit) == expect_scan(s, limit)
        assert cells(t) == model
        for s in (0, 1):
            assert t.base(s) == base[s]
            for limit in (0, base[s], base[s] + 3, base[s] + 7 * every, base[s] + 100 * every):
                assert t.first_open(s, limit) == expect_scan(s, limit)
                open_ = sorted(w for (ms, w) in model if ms == s and base[s] <= w < limit)
                assert t.open_windows(s, limit)[0].tolist() == open_


# ------------------------------------------------------------------ a shard
GRAPH = SegmentGraph.of(("src", ()), ("out", ("src",)))


def acks(*rows: tuple[int, int, int, int]) -> AckBatch:
    return AckBatch.of(Ack(*r) for r in rows)


def test_worked_example_of_the_min_times_a_shard_reports() -> None:
    """2 shards, windows of 10 slots: shard 0 owns [0, 10), [20, 30), [40, 50), ...;
    shard 1 owns [10, 20), [30, 40), [50, 60), ... Each reports, in real slot time, the
    start of the first window *it owns* that it does not know complete: a claim about its
    own windows, which the minimum over shards makes a claim about all of them."""
    layout = ShardLayout(2, window_slots=10)
    config = TrackerConfig(GRAPH, grid=TimeGrid(window_slots=10))
    s0, s1 = (TrackerShard(config, layout, k) for k in (0, 1))
    agg = ShardAggregator(GRAPH, 2)
    for s in (s0, s1):
        s.register_front(RegisterFront(1, "src", 0))
    # one item at slot 35 (window 3, shard 1's), sent into src; the front is at 57
    s1.receive(ShardFlush(1, NodeTime(7, 1, 30), acks((0, 35, 0xA, 1)), (Heartbeat(1, 57),)))
    s0.receive(ShardFlush(0, NodeTime(7, 1, 30), AckBatch.empty(), (Heartbeat(1, 57),)))
    # shard 0 sees the heartbeat as 60 (its windows [0,10), [20,30), [40,50) are done);
    # shard 1 as 50 ([50, 60) is not fully covered), and window [30, 40) is open there
    assert (s0.tracker.fronts(), s1.tracker.fronts()) == ({1: ("src", 60)}, {1: ("src", 50)})
    r0, r1 = s0.step(0), s1.step(0)
    assert r0 is not None and r1 is not None
    assert (r0.min_times, r1.min_times) == ((60, 60), (30, 30))
    agg.receive(r0)
    assert agg.receive(r1) == [
        MinTimeUpdate("src", 30),
        MinTimeUpdate("out", 30),
        MinTimeUpdate(None, 30),
    ]
    # the item was received (a sink); shard 1 now knows [30, 40) complete
    s1.receive(ShardFlush(1, NodeTime(7, 2, 30), acks((0, 35, 0xA, -1))))
    s0.receive(ShardFlush(0, NodeTime(7, 2, 30), AckBatch.empty()))
    r0, r1 = s0.step(0), s1.step(0)
    assert r1 is not None and r1.min_times == (50, 50)
    assert r0 is not None
    agg.receive(r0)
    assert agg.receive(r1)[-1] == MinTimeUpdate(None, 50)
    # the shard's table holds its own windows only, compressed; snapshots stay real
    assert s1.tracker.snapshot().bases.tolist() == [1, 1]  # window 1 = slots [10, 20)
    # the aggregate (50) comes back as a release: shard 1 drops its windows 1 and 3,
    # shard 0 its windows 0, 2 and 4
    for s in (s0, s1):
        s.release(agg.release())
    assert s1.tracker.snapshot().bases.tolist() == [5, 5]
    assert s0.tracker.snapshot().bases.tolist() == [6, 6]
    # and an ack in a window it does not own is refused, state unchanged
    with pytest.raises(ProtocolError, match="does not hold"):
        s1.receive(ShardFlush(1, NodeTime(7, 3, 60), acks((0, 65, 0xB, 1))))
    assert s1.node_times() == {7: 2}


def test_a_shard_with_no_owned_window_below_its_bound_reports_its_first_window() -> None:
    """Shard 1 owns no window below slot 10: with nothing registered its min time is the
    start of its first window, 10 (shard 0 reports 0, so the aggregate stays 0)."""
    layout = ShardLayout(2, window_slots=10)
    config = TrackerConfig(GRAPH, grid=TimeGrid(window_slots=10))
    s0, s1 = (TrackerShard(config, layout, k) for k in (0, 1))
    r0, r1 = s0.step(0), s1.step(0)
    assert r0 is not None and r1 is not None
    assert (r0.min_times, r1.min_times) == ((0, 0), (10, 10))
    agg = ShardAggregator(GRAPH, 2)
    agg.receive(r0)
    agg.receive(r1)
    assert agg.min_time() == 0
