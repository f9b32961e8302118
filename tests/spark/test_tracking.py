"""Vectorised ack arithmetic: per-time XOR, child indices, accumulator."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from lowtide.spark.tracking import AckAccumulator, as_i64, as_u64, child_index, xor_by_time


def _reference(times: list[int], acks: list[int]) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    for t, a in zip(times, acks, strict=True):
        x, c = out.get(t, (0, 0))
        out[t] = (x ^ a, c + 1)
    return out


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 2**64 - 1)), max_size=200))
def test_xor_by_time_matches_reference(rows: list[tuple[int, int]]) -> None:
    times = [t for t, _ in rows]
    acks = [a for _, a in rows]
    t, x, c = xor_by_time(np.array(times, np.int64), np.array(acks, np.uint64))
    assert list(t) == sorted(set(times))
    ref = _reference(times, acks)
    assert {int(a): (int(b), int(d)) for a, b, d in zip(t, x, c, strict=True)} == ref


@given(st.lists(st.integers(0, 30), max_size=100))
def test_child_index_counts_siblings(parents: list[int]) -> None:
    idx = child_index(np.array(parents, np.int64))
    seen: dict[int, int] = {}
    for p, i in zip(parents, idx.tolist(), strict=True):
        assert i == seen.get(p, 0)
        seen[p] = i + 1


def test_int64_roundtrip() -> None:
    a = np.array([0, 1, 2**63, 2**64 - 1], np.uint64)
    assert (as_u64(as_i64(a)) == a).all()
    assert as_i64(a)[2] < 0


def test_accumulator_merges_by_segment_and_window() -> None:
    acc = AckAccumulator()
    t = np.array([10, 10, 11, 25], np.int64)
    a = np.array([1, 2, 4, 8], np.uint64)
    acc.add(1, t, a, +1)
    acc.add(0, t, a, -1)
    b = acc.build(window_slots=10)
    rows = sorted(zip(b.segment.tolist(), b.time.tolist(), b.xor.tolist(), b.count.tolist(),
                      strict=True))
    assert rows == [(0, 10, 7, -3), (0, 20, 8, -1), (1, 10, 7, 3), (1, 20, 8, 1)]
    assert acc.rows_sent == 4 and acc.rows_received == 4
