"""Vectorised ack arithmetic: the packed tracking column, per-time XOR, child indices,
accumulator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lowtide.spark.tracking import (
    HELD_RANGE,
    ID_MASK,
    PACK_RANGE,
    WRAP_SLOTS,
    AckAccumulator,
    TimeGroups,
    ack_ids,
    as_i64,
    as_u64,
    child_ids,
    child_index,
    pack,
    plan_reference_slot,
    slots_of,
    track_children,
    with_ids,
    xor_by_time,
)
from lowtide.spark.tracking.kernels import DENSE_SPAN

NOW_SLOT = 178_000_000_000  # 2026 at delta_ms=10

#: slot offsets scaled by 1 stay inside the compiled kernels' dense table (a micro-batch);
#: by 20,000 a batch spans more than DENSE_SPAN (a backlog) and numpy groups it
SPREADS = pytest.mark.parametrize("spread", [1, 20_000], ids=["dense", "backlog"])


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


@given(st.integers(0, 2**33),
       st.lists(st.tuples(st.integers(-PACK_RANGE + 1, PACK_RANGE - 1),
                          st.integers(0, 2**64 - 1)), min_size=1, max_size=50),
       st.integers(-(HELD_RANGE - PACK_RANGE) + 1, HELD_RANGE - PACK_RANGE - 1))
def test_packed_slots_unwrap_exactly_against_any_near_reference(
    packer: int, rows: list[tuple[int, int]], drift: int
) -> None:
    """Round trip: a row packed against one clock comes back with its exact slot and its
    32-bit id against another clock, whatever the position of the wraps (property:
    exact within the ranges)."""
    ref = NOW_SLOT + packer
    slots = np.array([ref + d for d, _ in rows], np.int64)
    acks = np.array([a for _, a in rows], np.uint64)
    p = pack(slots, acks, ref)
    assert slots_of(p, ref + drift).tolist() == slots.tolist()
    assert ack_ids(p).tolist() == np.maximum(acks & ID_MASK, 1).tolist()


def test_pack_and_unwrap_refuse_rows_out_of_range() -> None:
    """Sources refuse rows labelled far from their clock; a task refuses rows that a
    late clock might unwrap to the wrong cycle, instead of acking the wrong slot."""
    ok = np.array([NOW_SLOT - PACK_RANGE + 1, NOW_SLOT + PACK_RANGE - 1], np.int64)
    p = pack(ok, np.zeros(2, np.uint64), NOW_SLOT)
    assert slots_of(p, NOW_SLOT).tolist() == ok.tolist()
    for bad in (NOW_SLOT - PACK_RANGE, NOW_SLOT + PACK_RANGE, 100):
        with pytest.raises(ValueError, match="label rows with the wall clock"):
            pack(np.array([NOW_SLOT, bad], np.int64), np.zeros(2, np.uint64), NOW_SLOT)
    with pytest.raises(ValueError, match="cannot be tracked"):
        slots_of(p, NOW_SLOT + HELD_RANGE)  # the oldest row, read 186 days later


def test_plans_built_hours_apart_share_their_reference_slot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A planned unwrap's reference is part of the stage's generated code: queries
    planned an hour apart get the same one (Spark compiles their code once), always
    within 2**23 slots of the clock, so rows unwrap as against the clock itself."""
    from lowtide.core.time import TimeGrid
    from lowtide.spark.tracking import column

    grid = TimeGrid(10)
    seen = []
    for ms in (1_779_999_000_000, 1_780_003_600_000):  # an hour apart
        monkeypatch.setattr(column, "wall_ms", lambda ms=ms: ms)
        ref = plan_reference_slot(grid)
        assert abs(ref - grid.slot_of(ms)) <= 1 << 23
        ok = np.array([grid.slot_of(ms) - PACK_RANGE + 1, grid.slot_of(ms)], np.int64)
        assert slots_of(pack(ok, np.zeros(2, np.uint64), grid.slot_of(ms)), ref).tolist() \
            == ok.tolist()
        seen.append(ref)
    assert seen[0] == seen[1]


def test_children_keep_their_parents_slots_and_ids_are_never_zero() -> None:
    slots = np.array([NOW_SLOT, NOW_SLOT + 1, NOW_SLOT - 5], np.int64)
    parents = pack(slots, np.array([1, 2, 2**32], np.uint64), NOW_SLOT)
    children = with_ids(parents, np.array([2**63 + 7, 8, 2**40], np.uint64))
    assert slots_of(children, NOW_SLOT).tolist() == slots.tolist()
    assert ack_ids(parents).tolist() == [1, 2, 1] and ack_ids(children).tolist() == [7, 8, 1]


@pytest.mark.parametrize("edge", [0, 2**31], ids=["slot 0 mod 2**32", "slot 2**31 mod 2**32"])
@given(rows=st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 2**64 - 1)), max_size=100))
def test_grouping_packed_rows_equals_grouping_their_slots(
    edge: int, rows: list[tuple[int, int]]
) -> None:
    """Grouping by the wrapped slot bits then unwrapping the groups gives the per-slot
    XORs of the ids, also for a micro-batch around either edge of the wrapped values
    (at 2**31 mod 2**32 the signed slot bits jump from 2**31 - 1 to -2**31)."""
    base = (NOW_SLOT // WRAP_SLOTS + 1) * WRAP_SLOTS + edge
    slots = np.array([base + t for t, _ in rows], np.int64)
    packed = pack(slots, np.array([a for _, a in rows], np.uint64), base)
    g = TimeGroups.of_packed(packed, base)
    got = {int(t): (int(x), int(c)) for t, x, c in
           zip(g.times, g.xor(ack_ids(packed)), g.counts, strict=True)}
    assert got == _reference(slots.tolist(), ack_ids(packed).tolist())


@SPREADS
@pytest.mark.parametrize("edge", [0, 2**31, 2**32 - 3],
                         ids=["slot 0 mod 2**32", "2**31 mod 2**32", "across the wrap"])
@given(rows=st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 2**64 - 1)), max_size=100))
def test_the_accumulator_sums_rows_per_slot_like_a_plain_loop(
    spread: int, edge: int, rows: list[tuple[int, int]]
) -> None:
    """``add`` (full slots) and ``add_packed`` (a tracking column, whose wrapped slot
    bits run past 2**32 - 1 to 0 "across the wrap") give the plain loop's per-slot XORs
    and counts, signed: sends positive, receipts negative."""
    base = (NOW_SLOT // WRAP_SLOTS + 1) * WRAP_SLOTS + edge
    slots = np.array([base + t * spread for t, _ in rows], np.int64)
    acks = np.array([a for _, a in rows], np.uint64)
    packed = pack(slots, acks, base)
    acc = AckAccumulator()
    acc.add(0, slots, acks, +1)
    acc.add_packed(1, packed, base, -1)
    got = acc.build(window_slots=1)
    want = {(0, t): (x, c) for t, (x, c) in _reference(slots.tolist(), acks.tolist()).items()}
    want |= {(1, t): (x, -c) for t, (x, c) in
             _reference(slots.tolist(), ack_ids(packed).tolist()).items()}
    assert {(int(g), int(t)): (int(x), int(c)) for g, t, x, c in
            zip(got.segment, got.time, got.xor, got.count, strict=True)} == want


@given(st.lists(st.integers(0, 2**32 - 1), unique=True, max_size=300), st.integers(0, 2**32 - 1))
def test_child_ids_are_distinct_for_distinct_parents_and_never_zero(
    parents: list[int], salt: int
) -> None:
    """A map's or a filter's children (one per parent) never collide in their ids, so a
    lost child cannot be hidden by a duplicated sibling with the same id; 0 would
    vanish from the XORs and is never used (the one exception to distinctness)."""
    p = np.array(parents, np.uint32)
    c = child_ids(p, salt)
    assert (c != 0).all()
    assert len(set(c.tolist())) >= len(parents) - 1  # a bijection, but for 0 -> 1
    assert np.array_equal(c, child_ids(p.copy(), salt))  # rule 5: a pure function
    if len(p):
        assert not np.array_equal(c, child_ids(p, salt ^ 1))
        assert not np.array_equal(c, child_ids(p, salt, np.ones(len(p), np.int64)))


@SPREADS
@pytest.mark.parametrize("kind", ["map", "filter", "flat_map"])
@given(rows=st.lists(st.tuples(st.integers(-6, 6), st.integers(1, 2**32 - 1), st.integers(0, 2)),
                     max_size=120))
def test_track_children_equals_a_row_by_row_reference(
    spread: int, kind: str, rows: list[tuple[int, int, int]]
) -> None:
    """The tracked operators' kernels (compiled, or numpy for a backlog) against a plain
    loop: per slot, the XOR and count of the parents' ids (received) and of the
    children's ids (sent), and the children's tracking column (their parent's slot,
    child_ids)."""
    assert 12 * 20_000 > DENSE_SPAN > 12
    slots = np.array([NOW_SLOT + d * spread for d, _i, _k in rows], np.int64)
    packed = pack(slots, np.array([i for _d, i, _k in rows], np.uint64), NOW_SLOT)
    ids = ack_ids(packed).astype(np.uint32)
    if kind == "map":
        children, parents, index = None, list(range(len(rows))), [0] * len(rows)
    elif kind == "filter":
        children = np.array([k > 0 for _d, _i, k in rows], bool)
        parents = [r for r, (_d, _i, k) in enumerate(rows) if k > 0]
        index = [0] * len(parents)
    else:
        parents = [r for r, (_d, _i, k) in enumerate(rows) for _ in range(k)]
        index = [j for _d, _i, k in rows for j in range(k)]
        children = np.array(parents, np.int64)
    acc = AckAccumulator()
    out = track_children(acc, (0, 1), packed, NOW_SLOT, 77, children)
    want: dict[tuple[int, int], tuple[int, int]] = {}
    for s, i in zip(slots.tolist(), ids.tolist(), strict=True):
        x, c = want.get((0, s), (0, 0))
        want[(0, s)] = (x ^ i, c - 1)
    kids = [int(child_ids(np.array([ids[p]], np.uint32), 77, np.array([j]))[0])
            for p, j in zip(parents, index, strict=True)]
    for p, k in zip(parents, kids, strict=True):
        x, c = want.get((1, int(slots[p])), (0, 0))
        want[(1, int(slots[p]))] = (x ^ k, c + 1)
    got = acc.build(window_slots=1)
    assert {(int(g), int(t)): (int(x), int(c)) for g, t, x, c in
            zip(got.segment, got.time, got.xor, got.count, strict=True)} == want
    assert slots_of(out, NOW_SLOT).tolist() == [int(slots[p]) for p in parents]
    assert ack_ids(out).tolist() == kids
    assert acc.rows_received == len(rows) and acc.rows_sent == len(parents)


def test_the_compiled_path_refuses_arrays_of_other_lengths() -> None:
    """The kernels check no bounds, so their callers refuse what would read past an
    array: one ack per row, one mask entry per input row."""
    with pytest.raises(ValueError, match="one ack per row"):
        AckAccumulator().add(0, np.array([NOW_SLOT, NOW_SLOT]), np.array([1], np.uint64), +1)
    packed = pack(np.array([NOW_SLOT] * 3, np.int64), np.array([1, 2, 3], np.uint64), NOW_SLOT)
    with pytest.raises(ValueError, match="mask has 2 rows, its input 3"):
        track_children(AckAccumulator(), (0, 1), packed, NOW_SLOT, 7, np.array([True, False]))
