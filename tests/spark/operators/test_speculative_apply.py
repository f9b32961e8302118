"""Speculative ``apply()`` windows without Spark (rule 13): ``fn`` called provisionally on
a pending window's rows so far, its versions (of one row or several, or none) and
their tombstones at the window's last slot under a hold that stays open, the final
version released with the hold, ``every``, retried calls; then a property over random
micro-batches: the changelog folded after every call is ``fn`` over each window's rows
so far, and at the end exactly the exact windows."""

from __future__ import annotations

import pickle
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.spark.operators.slot_logic import AT_COL, CHILD_COL, GroupStep
from lowtide.spark.operators.speculative import EARLY_BASE
from lowtide.spark.operators.speculative_apply import SpeculativeApply, make_speculative_apply
from lowtide.spark.operators.speculative_fold import ROW_BITS
from lowtide.spark.operators.window_state import WindowLogic
from lowtide.spark.operators.windows import WindowSpec
from tests.spark.operators.groups import Group, batch_windows, folding, inputs, rows

COLS = ("n", "s", "lo", "f", "l")


def count(window: pd.DataFrame) -> dict[str, Any]:
    return {"n": len(window)}


def each_value(window: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct value (several rows a version; none for no rows)."""
    return pd.DataFrame({"v": sorted(set(window["v"]))}, dtype="int64")


def speculating(fn: Any, cols: tuple[str, ...], size: int, slide: int | None = None,
                every_ms: int = 0) -> Group:
    window = WindowLogic(size, slide or size, 10, fn=fn, data_cols=("v",))
    return Group(SpeculativeApply("w", window, cols, every_ms))


def changes(step: GroupStep, which: str = "early") -> list[tuple[Any, ...]]:
    """(op, version, is_final, window start slot, first fn column) of a call's rows."""
    got = step.early if which == "early" else step.out
    return [] if got is None else [
        (r["op"], r["version"], r["is_final"], r["window_start"].value // 10**7,
         r[got.columns[2]]) for r in got.to_dict("records")]


def test_fn_runs_provisionally_on_the_rows_so_far_and_finally_once_complete() -> None:
    g = speculating(count, ("n",), 10)
    step = g.call(rows([3, 7]), done=2)
    assert changes(step) == [("insert", 1, False, 0, 2)] and step.early[AT_COL].tolist() == [9]
    assert step.opens.tolist() == [9] and step.out is None
    step = g.call(rows([8], ids=[3]), done=5)
    assert changes(step) == [("tombstone", 1, False, 0, 2), ("insert", 2, False, 0, 3)]
    assert g.call(None, done=7).early is None  # no rows: fn not called, nothing shown
    step = g.call(None, done=12)
    assert changes(step, "out") == [("tombstone", 2, False, 0, 3), ("insert", 3, True, 0, 3)]
    assert step.releases.tolist() == [9] and not g.holds and pickle.loads(g.data) is None


def test_a_version_of_several_rows_and_of_none() -> None:
    g = speculating(each_value, ("v",), 10)
    step = g.call(rows([3, 7], values=[1, 2]), done=2)
    assert changes(step) == [("insert", 1, False, 0, 1), ("insert", 1, False, 0, 2)]
    child = EARLY_BASE + (1 << (ROW_BITS + 1))
    assert step.early[CHILD_COL].tolist() == [child, child + 1]
    step = g.call(rows([8], ids=[3], values=[2]), done=5)  # same rows: nothing shown
    assert step.early is None
    step = g.call(rows([9], ids=[4], values=[5]), done=12)
    assert changes(step, "out") == [("tombstone", 1, False, 0, 1), ("tombstone", 1, False, 0, 2),
                                    ("insert", 2, True, 0, 1), ("insert", 2, True, 0, 2),
                                    ("insert", 2, True, 0, 5)]
    g = speculating(lambda w: w[w["v"] > 3][["v"]], ("v",), 10)
    assert g.call(rows([3], values=[1]), done=0).early is None  # a version of no rows
    assert changes(g.call(None, done=12), "out") == []  # nor a final one


def test_every_holds_back_a_change_until_a_poll_and_never_the_final() -> None:
    g = speculating(count, ("n",), 10, every_ms=2000)
    assert changes(g.call(rows([1]), done=0, now_ms=1000)) == [("insert", 1, False, 0, 1)]
    assert g.call(rows([2], ids=[2]), done=0, now_ms=2500).early is None  # too soon
    assert g.call(None, done=0, now_ms=2900).early is None  # still held back
    step = g.call(None, done=0, now_ms=3000)  # a poll: the held-back change shows
    assert changes(step) == [("tombstone", 1, False, 0, 1), ("insert", 2, False, 0, 2)]
    assert g.call(None, done=0, now_ms=9000).early is None  # nothing held back
    step = g.call(rows([3], ids=[3]), done=12, now_ms=9100)
    assert changes(step, "out") == [("tombstone", 2, False, 0, 2), ("insert", 3, True, 0, 3)]


def test_a_retried_call_emits_the_same_rows() -> None:
    g = speculating(count, ("n",), 10, slide=5)
    g.call(rows([3]), done=0)
    again = g.retry(rows([7], ids=[2]), done=1)
    step = g.call(rows([7], ids=[2]), done=1)
    pd.testing.assert_frame_equal(again.early, step.early)
    assert changes(step) == [("tombstone", 1, False, 0, 1), ("insert", 2, False, 0, 2),
                             ("insert", 1, False, 5, 1)]


def test_speculative_apply_is_checked_where_it_is_described() -> None:
    window = WindowSpec("w", ("k",), 100, 100, fn=count, fn_schema="n long")
    assert make_speculative_apply(window, "2 seconds").every_ms == 2000
    clash = WindowSpec("w", ("k",), 100, 100, fn=count, fn_schema="n long, `version` long")
    with pytest.raises(ValueError, match=r"^window 'w': column 'version' is a changelog"):
        make_speculative_apply(clash, None)


@settings(max_examples=40, deadline=None)
@given(inputs(), st.randoms(use_true_random=False), st.sampled_from([0, 30]))
def test_the_changelog_folds_into_the_exact_apply_windows(case: Any, rng: Any, every_ms: int
                                                          ) -> None:
    """Invariants: a tombstone cancels a live, not final, row of its window's version;
    a retried call emits the same rows and keeps the same state; after every call
    (``every`` 0) each window's live rows are ``fn`` over its rows so far, final
    exactly when complete; at the end the batch windows, all final; no hold left."""
    items, size, slide, steps = case
    g = speculating(folding, COLS, size, slide, every_ms)
    live: dict[int, tuple[int, list[Any], bool]] = {}
    pending, done, now = list(items), 0, 0
    for advance in [*steps, 100]:
        nxt, now = done + advance, now + 10 * rng.randrange(5)
        batch = [r for r in pending if r[0] < nxt + rng.randrange(6)]
        pending = [r for r in pending if r not in batch]
        new = rows(*(list(c) for c in zip(*batch, strict=True))) if batch else None
        step = g.retried_call(new, nxt, now)
        for got in (step.out, step.early):
            for r in [] if got is None else got.to_dict("records"):
                start = r["window_start"].value // 10**7
                assert r[AT_COL] == start + size - 1
                values = [None if pd.isna(r[c]) else r[c] for c in COLS]
                if r["op"] == "tombstone":
                    assert live[start][:2] == (r["version"], values) and not live[start][2]
                    del live[start]
                else:
                    assert start not in live, "an insert over a version not cancelled"
                    live[start] = (r["version"], values, bool(r["is_final"]))
        if not every_ms:
            seen = batch_windows([r for r in items if r not in pending], size, slide)
            assert {s: v for s, (_, v, _) in live.items()} == seen
            assert all(f == (s + size <= nxt) for s, (_, _, f) in live.items())
        done = nxt
    assert {s: v for s, (_, v, _) in live.items()} == batch_windows(items, size, slide)
    assert all(f for _, _, f in live.values())
    assert not g.holds and pickle.loads(g.data) is None
