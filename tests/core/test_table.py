"""Checksum table: ring wrap-around, growth, overflow, base, release, entries/load."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.core.errors import AckBehindHead, ProtocolError, TableOverflow
from lowtide.core.table import ChecksumTable

Cells = dict[tuple[int, int], tuple[int, int]]


def put(
    table: ChecksumTable, segment: int, windows: list[int], xors: list[int], count: int = 1
) -> None:
    n = len(windows)
    table.apply(
        np.full(n, segment, np.int32),
        np.asarray(windows, np.int64),
        np.asarray(xors, np.uint64),
        np.full(n, count, np.int64),
    )


def cells(table: ChecksumTable) -> Cells:
    """{(segment, window): (xor, count)} of every non-zero cell."""
    windows, xors, counts, segments = table.entries()
    return {
        (int(s), int(w)): (int(x), int(c))
        for w, x, c, s in zip(windows, xors, counts, segments, strict=True)
    }


def test_worked_example() -> None:
    t = ChecksumTable(n_segments=1, initial_windows=8, max_windows=64)
    put(t, 0, [3, 5], [7, 9])
    assert t.first_open(0, limit=100) == 3
    put(t, 0, [3], [7], count=-1)
    assert (t.first_open(0, limit=100), t.first_open(0, limit=4)) == (5, 4)


def test_capacity_is_a_power_of_two() -> None:
    assert ChecksumTable(1, initial_windows=5, max_windows=64).capacity == 8
    assert ChecksumTable(1, initial_windows=8, max_windows=64).capacity == 8
    assert ChecksumTable(1, initial_windows=1, max_windows=1).capacity == 1


@pytest.mark.parametrize(("initial", "maximum"), [(0, 10), (-1, 10), (16, 8)])
def test_bad_sizes(initial: int, maximum: int) -> None:
    with pytest.raises(ValueError):
        ChecksumTable(1, initial_windows=initial, max_windows=maximum)


def test_ring_wraps_around() -> None:
    t = ChecksumTable(n_segments=2, initial_windows=8, max_windows=8)
    put(t, 0, list(range(8)), [10 + w for w in range(8)])
    put(t, 0, list(range(6)), [10 + w for w in range(6)], count=-1)  # windows 0..5 complete
    assert t.first_open(0, limit=100) == 6
    t.release(0, 6)
    assert t.base(0) == 6
    # windows 8..13 reuse the columns of windows 0..5
    put(t, 0, list(range(8, 14)), [100 + w for w in range(8, 14)])
    assert t.capacity == 8
    assert cells(t) == {(0, w): (10 + w, 1) for w in (6, 7)} | {
        (0, w): (100 + w, 1) for w in range(8, 14)
    }
    # close 6 and 7: the scan wraps from column 7 to column 0
    put(t, 0, [6, 7], [16, 17], count=-1)
    assert t.first_open(0, limit=100) == 8
    assert t.first_open(0, limit=7) == 7
    t.release(0, 8)
    put(t, 0, [8, 9, 10, 11, 12], [108, 109, 110, 111, 112], count=-1)
    assert t.first_open(0, limit=100) == 13
    windows, xors, counts = t.open_windows(0, limit=100)
    assert windows.tolist() == [13] and xors.tolist() == [113] and counts.tolist() == [1]
    # the other segment was never touched
    assert t.first_open(1, limit=50) == 50 and t.base(1) == 0


def test_first_open_jumps_over_empty_stretches_past_capacity() -> None:
    t = ChecksumTable(1, initial_windows=4, max_windows=1 << 20)
    assert t.first_open(0, limit=10**12) == 10**12
    put(t, 0, [2], [1])
    assert t.first_open(0, limit=10**12) == 2


def test_first_open_below_base_returns_base() -> None:
    t = ChecksumTable(1, initial_windows=4, max_windows=64)
    t.release(0, 10)
    assert t.first_open(0, limit=3) == 10
    assert t.first_open(0, limit=10) == 10
    windows, _, _ = t.open_windows(0, limit=3)
    assert len(windows) == 0


def test_growth_preserves_contents_across_the_wrap() -> None:
    t = ChecksumTable(n_segments=2, initial_windows=4, max_windows=1 << 10)
    t.release(0, 5)  # segment 0 held from window 5: columns wrap at 8
    put(t, 0, [5, 6, 7, 8], [1, 2, 3, 4])
    put(t, 1, [0, 3], [5, 6], count=2)
    before = cells(t)
    put(t, 0, [5 + 20], [99])  # 21 windows past the base: grow to 32
    assert t.capacity == 32
    assert cells(t) == before | {(0, 25): (99, 1)}
    assert t.first_open(0, limit=100) == 5
    assert t.first_open(1, limit=100) == 0
    put(t, 0, [5, 6, 7, 8], [1, 2, 3, 4], count=-1)
    assert t.first_open(0, limit=100) == 25
    windows, _, _ = t.open_windows(1, limit=100)
    assert windows.tolist() == [0, 3]


def test_overflow_is_refused_and_changes_nothing() -> None:
    t = ChecksumTable(1, initial_windows=4, max_windows=16)
    t.release(0, 100)
    put(t, 0, [100, 115], [1, 2])  # 115 = base + max_windows - 1: fits
    before = cells(t)
    with pytest.raises(TableOverflow) as err:
        put(t, 0, [101, 116], [3, 4])
    assert "116" in str(err.value)
    assert issubclass(TableOverflow, ProtocolError)
    assert cells(t) == before
    assert t.capacity == 16


def test_ack_behind_base_is_refused_and_changes_nothing() -> None:
    t = ChecksumTable(1, initial_windows=8, max_windows=64)
    t.release(0, 4)
    put(t, 0, [6], [1])
    with pytest.raises(AckBehindHead) as err:
        put(t, 0, [7, 3], [2, 3])
    assert "window 3" in str(err.value)
    assert cells(t) == {(0, 6): (1, 1)}
    t.check(np.zeros(1, np.int32), np.array([4]))  # the base itself is fine
    with pytest.raises(AckBehindHead):
        t.check(np.zeros(1, np.int32), np.array([3]))


def test_release_clamps_at_open_windows_and_never_goes_back() -> None:
    t = ChecksumTable(1, initial_windows=8, max_windows=64)
    put(t, 0, [3], [1])
    t.release(0, 10)
    assert t.base(0) == 3
    t.release(0, 1)
    assert t.base(0) == 3
    put(t, 0, [3], [1], count=-1)
    t.release(0, 10)
    assert t.base(0) == 10
    t.release(0, 1_000)  # far past the capacity, nothing open: jump
    assert t.base(0) == 1_000
    put(t, 0, [1_000 + 7], [5])
    assert t.first_open(0, limit=2_000) == 1_007


def test_count_alone_keeps_a_window_open() -> None:
    # the same value sent twice: XOR 0, count 2 -- still open
    t = ChecksumTable(1, initial_windows=8, max_windows=64)
    put(t, 0, [2, 2], [7, 7])
    assert t.first_open(0, limit=10) == 2
    assert cells(t) == {(0, 2): (0, 2)}


def test_entries_and_load_round_trip_into_a_smaller_table() -> None:
    t = ChecksumTable(n_segments=3, initial_windows=8, max_windows=1 << 10)
    t.release(0, 6)
    t.release(2, 40)
    put(t, 0, [6, 9, 13], [1, 2, 3])
    put(t, 1, [0, 1], [4, 5], count=-1)
    put(t, 2, [40, 47, 90], [6, 7, 8], count=3)
    other = ChecksumTable(n_segments=3, initial_windows=2, max_windows=1 << 10)
    put(other, 1, [1], [77])  # stale content is wiped by load
    other.load(t.bases(), t.entries())
    assert cells(other) == cells(t)
    assert other.bases().tolist() == t.bases().tolist() == [6, 0, 40]
    for s in range(3):
        assert other.first_open(s, 1_000) == t.first_open(s, 1_000)
    # bases() is a copy
    t.bases()[0] = 999
    assert t.base(0) == 6


# ------------------------------------------------------------------ model check
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
        ),
        st.tuples(st.just("release"), st.integers(0, 1), st.integers(0, 60)),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops, initial=st.sampled_from([1, 2, 4, 8]))
def test_table_matches_a_dictionary_model(ops: list[tuple], initial: int) -> None:
    max_windows = 32
    t = ChecksumTable(n_segments=2, initial_windows=initial, max_windows=max_windows)
    model: Cells = {}
    base = [0, 0]
    for op in ops:
        if op[0] == "apply":
            rows = [(s, base[s] + off, x, c) for s, off, x, c in op[1]]
            args = (
                np.array([r[0] for r in rows], np.int32),
                np.array([r[1] for r in rows], np.int64),
                np.array([r[2] for r in rows], np.uint64),
                np.array([r[3] for r in rows], np.int64),
            )
            if any(w < base[s] for s, w, _, _ in rows):
                with pytest.raises(AckBehindHead):
                    t.apply(*args)
            elif any(w - base[s] >= max_windows for s, w, _, _ in rows):
                with pytest.raises(TableOverflow):
                    t.apply(*args)
            else:
                t.apply(*args)
                for s, w, x, c in rows:
                    ox, oc = model.get((s, w), (0, 0))
                    model[(s, w)] = (ox ^ x, oc + c)
                model = {k: v for k, v in model.items() if v != (0, 0)}
        else:
            _, s, target = op
            if target > base[s]:
                open_ = [w for (ms, w) in model if ms == s and base[s] <= w < target]
                base[s] = min(open_) if open_ else target
            t.release(s, target)
        assert cells(t) == model
        for s in (0, 1):
            assert t.base(s) == base[s]
            for limit in (0, base[s], base[s] + 3, base[s] + 100):
                open_ = sorted(w for (ms, w) in model if ms == s and base[s] <= w < limit)
                assert t.first_open(s, limit) == (open_[0] if open_ else max(base[s], limit))
                windows, _, _ = t.open_windows(s, limit)
                assert windows.tolist() == open_
