"""Speculative ``groupBy().agg()`` without Spark (rule 13): the module docstring's worked
example (a row in an earlier pending range changes every later one's result), the
re-emit bound, retried calls; then a property over random rows, ranges and
micro-batches: the changelog folded after every call is, for each (key, ``as_of``)
with rows, the aggregation of the rows so far below ``as_of``, and at the end exactly
the exact ``groupBy``'s rows, all final."""

from __future__ import annotations

import pickle
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.spark.operators.running import AS_OF, GroupedSpec, RunningLogic
from lowtide.spark.operators.slot_logic import AT_COL, GroupStep
from lowtide.spark.operators.speculative_running import (
    SpeculativeRunning,
    make_speculative_grouped,
)
from lowtide.spark.operators.windows import parse_aggs
from tests.spark.operators.groups import Group
from tests.spark.operators.running_rows import AGGS, DELTA_MS, rows


def speculating(every: int, every_ms: int = 0) -> Group:
    return Group(SpeculativeRunning(RunningLogic(every, DELTA_MS, AGGS), every_ms))


def changes(step: GroupStep, which: str = "early") -> list[tuple[Any, ...]]:
    """(op, version, is_final, as_of slot, n) of a call's rows."""
    got = step.early if which == "early" else step.out
    return [] if got is None else [
        (r["op"], r["version"], r["is_final"], r[AS_OF].value // 10**7, r["n"])
        for r in got.to_dict("records")]


def test_a_row_in_an_earlier_range_changes_every_later_one() -> None:
    g = speculating(10)
    step = g.call(rows([3, 12]), done=2)
    assert changes(step) == [("insert", 1, False, 10, 1), ("insert", 1, False, 20, 2)]
    assert step.early[AT_COL].tolist() == [9, 19] and step.opens.tolist() == [9, 19]
    step = g.call(rows([5], ids=[3]), done=4)
    assert changes(step) == [("tombstone", 1, False, 10, 1), ("insert", 2, False, 10, 2),
                             ("tombstone", 1, False, 20, 2), ("insert", 2, False, 20, 3)]
    assert g.call(None, done=6).early is None  # nothing changed: nothing shown
    step = g.call(None, done=10)
    assert changes(step, "out") == [("tombstone", 2, False, 10, 2), ("insert", 3, True, 10, 2)]
    assert step.early is None and step.releases.tolist() == [9]
    step = g.call(rows([25], ids=[4]), done=30)
    assert changes(step, "out") == [("tombstone", 2, False, 20, 3), ("insert", 3, True, 20, 3),
                                    ("insert", 1, True, 30, 4)]
    assert not g.holds and pickle.loads(g.data).running.total is not None  # kept for ever


def test_every_holds_back_a_change_and_never_the_final() -> None:
    g = speculating(10, every_ms=2000)
    assert len(changes(g.call(rows([3]), done=0, now_ms=1000))) == 1
    assert g.call(rows([4], ids=[2]), done=0, now_ms=2000).early is None  # too soon
    step = g.call(None, done=0, now_ms=3000)  # a poll: the held-back change shows
    assert changes(step) == [("tombstone", 1, False, 10, 1), ("insert", 2, False, 10, 2)]
    step = g.call(rows([5], ids=[3]), done=10, now_ms=3100)
    assert changes(step, "out") == [("tombstone", 2, False, 10, 2), ("insert", 3, True, 10, 3)]


def test_a_retried_call_emits_the_same_rows() -> None:
    g = speculating(10)
    g.call(rows([3, 12]), done=2)
    again = g.retry(rows([5], ids=[3]), done=4)
    step = g.call(rows([5], ids=[3]), done=4)
    pd.testing.assert_frame_equal(again.early, step.early)


def test_speculative_group_by_is_checked_where_it_is_described() -> None:
    step = GroupedSpec("g", ("k",), 10, parse_aggs({"n": "count"}))
    assert make_speculative_grouped(step, "2 seconds").changes_ms == 2000
    with pytest.raises(ValueError, match="given once"):
        make_speculative_grouped(make_speculative_grouped(step, None), None)
    clash = GroupedSpec("g", ("op",), 10, parse_aggs({"n": "count"}))
    with pytest.raises(ValueError, match="'op' is a changelog column"):
        make_speculative_grouped(clash, None)


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(-50, 50)), max_size=40),
       st.sampled_from([1, 3, 10]), st.lists(st.integers(0, 12), min_size=1, max_size=30),
       st.randoms(use_true_random=False), st.sampled_from([0, 30]))
def test_the_changelog_folds_into_the_exact_running_rows(
        items: list[tuple[int, int]], every: int, steps: list[int], rng: Any,
        every_ms: int) -> None:
    """Invariants: a tombstone cancels the live, not final, version it repeats; a
    retried call emits the same rows and keeps the same state; after every call
    (``every_ms`` 0) the live rows are each (key, ``as_of``) with rows so far and the
    aggregation of the rows so far below it, final exactly when complete; at the end
    the exact rows, all final; no hold left."""
    rows_in = [(s, i + 1, v) for i, (s, v) in enumerate(items)]
    g = speculating(every, every_ms)
    live: dict[int, tuple[int, list[Any], bool]] = {}
    pending, done, now = list(rows_in), 0, 0

    def expected(got: list[tuple[int, int, int]]) -> dict[int, list[Any]]:
        out = {}
        for end in sorted({s - s % every + every for s, _, _ in got}):
            below = sorted(r for r in got if r[0] < end)
            vals = [v for _, _, v in below]
            out[end] = [len(below), sum(vals), below[-1][2], len(set(vals))]
        return out

    for advance in [*steps, 100]:
        nxt, now = done + advance, now + 10 * rng.randrange(5)
        batch = [r for r in pending if r[0] < nxt + rng.randrange(6)]
        pending = [r for r in pending if r not in batch]
        new = rows(*(list(c) for c in zip(*batch, strict=True))) if batch else None
        step = g.retried_call(new, nxt, now)
        for got in (step.out, step.early):
            for r in [] if got is None else got.to_dict("records"):
                end = r[AS_OF].value // 10**7
                assert r[AT_COL] == end - 1
                values = [r["n"], r["s"], r["l"], r["d"]]
                if r["op"] == "tombstone":
                    assert live[end][:2] == (r["version"], values) and not live[end][2]
                    del live[end]
                else:
                    assert end not in live, "an insert over a version not cancelled"
                    live[end] = (r["version"], values, bool(r["is_final"]))
        if not every_ms:
            assert {e: v for e, (_, v, _) in live.items()} == expected(
                [r for r in rows_in if r not in pending])
            assert all(f == (e <= nxt) for e, (_, _, f) in live.items())
        done = nxt
    assert {e: v for e, (_, v, _) in live.items()} == expected(rows_in)
    assert all(f for _, _, f in live.values()) and not g.holds
