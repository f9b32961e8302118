"""Windows with key ranges (rule 15) on a bucket of keys, without Spark: each range's
keys are stepped with that range's min time and keep holds of their own
(:func:`.slot_logic.step_ranges`, :class:`.window_state.BucketWindows`), so that a
range still open keeps its windows' holds whatever the bucket's other ranges emit."""

from __future__ import annotations

import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.spark.operators.slot_logic import (
    AT_COL,
    GroupStep,
    Ranges,
    key_in_two_ranges,
    step_ranges,
)
from lowtide.spark.operators.state_clock import holds_under, key_hash, range_parent
from lowtide.spark.operators.window_state import BucketWindows, WindowLogic, check_layout
from tests.spark.operators.groups import AGGS, Parts, rows

OP = 7
PARENT = key_hash((0,))  # the bucket's (its Spark key, a label)


class Bucket:
    """A bucket driven as the processor drives it: its ranges pickled between calls,
    each range's open holds tracked from its steps' opens and releases."""

    def __init__(self, logic: Any) -> None:
        self.logic = logic
        self.data = pickle.dumps({})
        self.holds: dict[int, set[int]] = {}  # range -> its open holds' slots
        self.parts = Parts()

    def retry(self, new: dict[int, pd.DataFrame], done: dict[int, int]
              ) -> tuple[Ranges, list[tuple[int, GroupStep]]]:
        return step_ranges(self.logic, (0,), pickle.loads(self.data), new, done, self.parts)

    def call(self, new: dict[int, pd.DataFrame], done: dict[int, int]) -> dict[int, GroupStep]:
        again = self.retry(new, done)
        ranges, steps = self.retry(new, done)
        assert pickle.dumps(again) == pickle.dumps((ranges, steps)), "a retry differs"
        for r, step in steps:
            self.parts.write(step)
            held = self.holds.get(r, set())
            opens, releases = set(step.opens.tolist()), set(step.releases.tolist())
            assert not opens & held and releases <= held | opens
            self.holds[r] = (held | opens) - releases
            if step.out is not None:
                assert set(step.out[AT_COL].tolist()) <= releases
        for r, held in self.holds.items():
            assert held == set(ranges.get(r, (np.zeros(0),))[0].tolist()), \
                "a range's holds are not its wakes"
        self.data = pickle.dumps(ranges)
        return dict(steps)


def keyed(key: str, slots: list[int], first_id: int = 1) -> pd.DataFrame:
    """New rows of ``key`` as the runtime hands them over (count + sum of ``v``)."""
    return rows(slots, list(range(first_id, first_id + len(slots)))).assign(k=key)


def counting(size: int) -> BucketWindows:
    return BucketWindows(WindowLogic(size, size, 10, AGGS), ("k",))


def test_a_bucket_emits_a_complete_range_and_keeps_the_other_range_s_hold() -> None:
    # keys "a" (range 0) and "b" (range 1) share a bucket and the window [0, 10)
    b = Bucket(counting(10))
    first = b.call({0: keyed("a", [3, 7]), 1: keyed("b", [5], 3)}, {0: 2, 1: 2})
    assert all(s.out is None for s in first.values())
    assert b.holds == {0: {9}, 1: {9}}  # a hold at slot 9 per range
    # range 0 is complete below 12, range 1 only below 5 (its front lags)
    second = b.call({}, {0: 12, 1: 5})
    assert set(second) == {0}, "only the complete range is stepped"
    out = second[0].out
    assert out is not None
    assert out[["k", "n"]].values.tolist() == [["a", 2]] and out[AT_COL].tolist() == [9]
    assert second[0].releases.tolist() == [9]
    assert b.holds == {0: set(), 1: {9}}, "range 1's hold at 9 stays open"
    # the two ranges' holds at slot 9 are distinct acks: releasing range 0's leaves
    # range 1's open in the state segment
    at9 = np.array([9], np.int64)
    assert holds_under(OP, range_parent(PARENT, 0), at9)[0] != \
        holds_under(OP, range_parent(PARENT, 1), at9)[0]
    third = b.call({}, {0: 12, 1: 10})
    out = third[1].out
    assert out is not None and out[["k", "n"]].values.tolist() == [["b", 1]]
    assert b.holds == {0: set(), 1: set()} and pickle.loads(b.data) == {}


def test_a_bucket_s_keys_keep_their_own_apply_rows() -> None:
    def total(df: pd.DataFrame) -> dict[str, Any]:
        return {"total": int(df["v"].sum()), "n": len(df)}

    logic = BucketWindows(WindowLogic(10, 10, 10, fn=total, data_cols=("v",)), ("k",))
    b = Bucket(logic)
    b.call({0: pd.concat([keyed("a", [1, 2]), keyed("c", [3], 5)], ignore_index=True)},
           {0: 0})
    b.call({0: pd.concat([keyed("a", [4], 8), keyed("c", [6], 9)], ignore_index=True)},
           {0: 1})
    out = b.call({}, {0: 10})[0].out
    assert out is not None
    got = {r.k: (r.total, r.n) for r in out.itertuples()}
    assert got == {"a": (7, 3), "c": (9, 2)}
    assert not b.parts.stored, "every part was dropped once its window came out"


def test_a_key_with_rows_of_two_ranges_is_found_after_the_step() -> None:
    # the runtime groups a bucket's rows by key once (in the logic) and checks the
    # ranges' kept keys after the step: "a" with rows of ranges 0 and 1 in one batch ...
    b = Bucket(counting(10))
    ranges, _ = b.retry({0: keyed("a", [3]), 1: keyed("a", [5], 2)}, {0: 2, 1: 2})
    assert key_in_two_ranges(ranges) == (("a",), [0, 1])
    # ... or in range 1 now and kept by range 0 from an earlier batch
    b.call({0: keyed("a", [3]), 1: keyed("b", [4], 2)}, {0: 2, 1: 2})
    ranges, _ = b.retry({1: keyed("a", [6], 3)}, {0: 2, 1: 2})
    assert key_in_two_ranges(ranges) == (("a",), [0, 1])
    assert key_in_two_ranges(pickle.loads(b.data)) is None


def test_a_group_without_ranges_is_range_none_and_eager_steps_an_open_wake() -> None:
    b = Bucket(counting(10))
    b.call({None: keyed("a", [3])}, {None: 2})
    assert b.holds == {None: {9}}
    kept = pickle.loads(b.data)
    # nothing new, nothing complete: not stepped; eager (rule 13): stepped all the same
    assert step_ranges(b.logic, (0,), kept, {}, {None: 5}, b.parts)[1] == []
    _, steps = step_ranges(b.logic, (0,), kept, {}, {None: 5}, b.parts, eager=True)
    assert [r for r, _ in steps] == [None] and steps[0][1].out is None
    out = b.call({}, {None: 10})[None].out
    assert out is not None and out[["k", "n"]].values.tolist() == [["a", 1]]


# ------------------------------------------------------------------ properties


@st.composite
def ranged_inputs(draw: Any) -> tuple[dict[str, int], list[tuple[str, int]], list[list[int]],
                                      int]:
    n_ranges = draw(st.integers(1, 3))
    keys = {f"k{i}": draw(st.integers(0, n_ranges - 1)) for i in range(draw(st.integers(1, 5)))}
    items = draw(st.lists(st.tuples(st.sampled_from(sorted(keys)), st.integers(0, 40)),
                          max_size=40))
    steps = draw(st.lists(st.lists(st.integers(0, 12), min_size=n_ranges, max_size=n_ranges),
                          min_size=1, max_size=15))
    return keys, items, steps, draw(st.sampled_from([1, 3, 5, 10]))


@settings(max_examples=60, deadline=None)
@given(ranged_inputs(), st.randoms(use_true_random=False))
def test_each_range_s_windows_come_out_once_complete_and_equal_batch(
        case: tuple[dict[str, int], list[tuple[str, int]], list[list[int]], int],
        rng: random.Random) -> None:
    """Invariants: per-range safety (a window comes out only once ITS range's min
    time passed its end; the other ranges' do not matter), its range's hold at its
    last slot stays open until then, liveness (every window comes out once all ranges
    are complete), and each window once, equal to the batch count."""
    keys, items, steps, size = case
    ranges = sorted(set(keys.values()))
    b = Bucket(counting(size))
    all_rows = [(k, s, i + 1) for i, (k, s) in enumerate(items)]
    pending = list(all_rows)
    done = dict.fromkeys(ranges, 0)
    got: dict[tuple[str, int], int] = {}
    for advance in [*steps, [100] * len(ranges)]:
        nxt = {r: done[r] + a for r, a in zip(ranges, advance, strict=False)}
        nxt = {r: nxt.get(r, done[r]) for r in ranges}
        batch = [p for p in pending if p[1] < nxt[keys[p[0]]] + rng.randrange(6)]
        pending = [p for p in pending if p not in batch]
        new = {}
        for r in ranges:
            mine = [p for p in batch if keys[p[0]] == r]
            if mine:
                new[r] = pd.concat([keyed(k, [s], i) for k, s, i in mine], ignore_index=True)
        for r, step in b.call(new, nxt).items():
            if step.out is None:
                continue
            for row in step.out.itertuples():
                end = row.window_end.value // 10**6 // 10
                assert keys[row.k] == r and end <= nxt[r], "a window before its range"
                assert (row.k, end) not in got, "a window emitted twice"
                got[(row.k, end)] = row.n
        arrived = [(k, s) for k, s, i in (set(all_rows) - set(pending))]
        for r in ranges:  # every window of the range with rows in keeps its hold
            mine = windows_of([(k, s) for k, s in arrived if keys[k] == r], size)
            assert {e - 1 for k, e in mine if (k, e) not in got} <= b.holds.get(r, set()), \
                "an open window without its range's hold"
        done = nxt
    expected: dict[tuple[str, int], int] = {}
    for k, s in items:
        end = s - s % size + size
        expected[(k, end)] = expected.get((k, end), 0) + 1
    assert got == expected


def windows_of(items: list[tuple[str, int]], size: int) -> set[tuple[str, int]]:
    return {(k, s - s % size + size) for k, s in items}


def test_a_checkpoint_of_per_key_range_windows_is_refused_in_one_line(tmp_path: Path) -> None:
    # what Spark's schema file of such a window names (its "key_range" value state)
    old = tmp_path / "old" / "state" / "0" / "_stateSchema" / "default"
    old.mkdir(parents=True)
    (old / "0_1").write_bytes(b"\x00\x05group\x00\x09key_range\x00{\"type\":\"struct\"}")
    with pytest.raises(ValueError, match=r"^window 'w': checkpoint .* keeps key-range "
                                         r"windows per key .*start from a new checkpoint$"):
        check_layout("w", str(tmp_path / "old"))
    new = tmp_path / "new" / "state" / "0" / "_stateSchema" / "default"
    new.mkdir(parents=True)
    (new / "0_1").write_bytes(b"\x00\x05group\x00\x05parts")
    check_layout("w", str(tmp_path / "new"))
    check_layout("w", str(tmp_path / "none"))
    check_layout("w", None)
