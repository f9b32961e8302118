"""Speculative session windows without Spark (rule 13): worked examples of a session's
versions, of two sessions merging (the tombstone of the one that disappears), of
``every`` and of retried calls; then a property over random rows, gaps and
micro-batches: the changelog folded after every call is the sessions so far, and at
the end exactly the batch sessions, all final."""

from __future__ import annotations

import pickle
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.spark.operators.sessions import SessionLogic, SessionSpec
from lowtide.spark.operators.slot_logic import AT_COL, CHILD_COL, GroupStep
from lowtide.spark.operators.speculative import EARLY_BASE
from lowtide.spark.operators.speculative_sessions import (
    ORIGIN_SHIFT,
    SpeculativeSessions,
    make_speculative_sessions,
)
from lowtide.spark.operators.windows import parse_aggs
from tests.spark.operators.groups import Group
from tests.spark.operators.session_rows import AGGS, DELTA_MS, batch_sessions, inputs, rows


def speculating(gap: int, every_ms: int = 0) -> Group:
    return Group(SpeculativeSessions(SessionLogic(gap, DELTA_MS, AGGS), every_ms))


def changes(step: GroupStep, which: str = "early") -> list[tuple[Any, ...]]:
    """(op, version, is_final, start, end, n, at) of a call's early or final rows."""
    got = step.early if which == "early" else step.out
    return [] if got is None else [
        (r["op"], r["version"], r["is_final"], r["session_window_start"].value // 10**7,
         r["session_window_end"].value // 10**7, r["n"], r[AT_COL])
        for r in got.to_dict("records")]


def test_a_session_shows_versions_as_it_grows_and_its_final_once_complete() -> None:
    g = speculating(5)
    step = g.call(rows([3]), done=2)
    assert changes(step) == [("insert", 1, False, 3, 8, 1, 8)] and step.opens.tolist() == [8]
    step = g.call(rows([6], ids=[2]), done=4)  # extends it: the hold moves to 11
    assert changes(step) == [("tombstone", 1, False, 3, 8, 1, 11),
                             ("insert", 2, False, 3, 11, 2, 11)]
    assert step.opens.tolist() == [11] and step.releases.tolist() == [8]
    assert g.call(None, done=9).early is None  # nothing changed: nothing shown
    step = g.call(None, done=12)
    assert changes(step, "out") == [("tombstone", 2, False, 3, 11, 2, 11),
                                    ("insert", 3, True, 3, 11, 2, 11)]
    assert step.releases.tolist() == [11] and not g.holds and pickle.loads(g.data) is None


def test_merged_sessions_cancel_the_versions_of_the_one_that_disappears() -> None:
    """The module docstring's example: [3, 8] and [12, 17] merge into [3, 17]; it goes
    on with the versions of the session from 3, the one from 12 is cancelled."""
    g = speculating(5)
    step = g.call(rows([3, 12]), done=2)
    assert changes(step) == [("insert", 1, False, 3, 8, 1, 8),
                             ("insert", 1, False, 12, 17, 1, 17)]
    step = g.call(rows([8], ids=[3]), done=8)
    assert changes(step) == [("tombstone", 1, False, 12, 17, 1, 17),
                             ("tombstone", 1, False, 3, 8, 1, 17),
                             ("insert", 2, False, 3, 17, 3, 17)]
    assert step.releases.tolist() == [8] and g.holds == {17}
    # at the hold at 17: the session from 12's version 1 (sent before) and its
    # tombstone, the session from 3's rows: each index once
    child = EARLY_BASE + 2 * 1
    assert step.early[CHILD_COL].tolist() == [child + 1 + (5 << ORIGIN_SHIFT),
                                              child + 1 + (14 << ORIGIN_SHIFT),
                                              child + 2 + (14 << ORIGIN_SHIFT)]
    step = g.call(None, done=18)
    assert changes(step, "out") == [("tombstone", 2, False, 3, 17, 3, 17),
                                    ("insert", 3, True, 3, 17, 3, 17)]


def test_a_merge_completed_in_its_call_cancels_both_before_the_final() -> None:
    g = speculating(5)
    g.call(rows([3, 12]), done=2)
    step = g.call(rows([8], ids=[3]), done=30)
    assert step.early is None
    assert changes(step, "out") == [("tombstone", 1, False, 12, 17, 1, 17),
                                    ("tombstone", 1, False, 3, 8, 1, 17),
                                    ("insert", 2, True, 3, 17, 3, 17)]


def test_every_holds_back_a_change_but_not_a_merge_nor_the_final() -> None:
    g = speculating(5, every_ms=2000)
    assert len(changes(g.call(rows([3, 12]), done=2, now_ms=1000))) == 2
    assert g.call(rows([4], ids=[3]), done=3, now_ms=1500).early is None  # too soon
    step = g.call(None, done=3, now_ms=3000)  # a poll: the held-back change shows
    assert changes(step) == [("tombstone", 1, False, 3, 8, 1, 9),
                             ("insert", 2, False, 3, 9, 2, 9)]
    step = g.call(rows([9], ids=[4]), done=4, now_ms=3100)  # a merge shows at once
    assert [c[:3] for c in changes(step)] == [("tombstone", 1, False), ("tombstone", 2, False),
                                              ("insert", 3, False)]
    step = g.call(None, done=30, now_ms=3200)  # the final never waits
    assert [c[:3] for c in changes(step, "out")] == [("tombstone", 3, False),
                                                     ("insert", 4, True)]


def test_a_retried_call_emits_the_same_rows() -> None:
    g = speculating(5)
    g.call(rows([3, 12]), done=2)
    again = g.retry(rows([8], ids=[3]), done=8)
    step = g.call(rows([8], ids=[3]), done=8)
    pd.testing.assert_frame_equal(again.early, step.early)


def test_speculative_sessions_are_checked_where_they_are_described() -> None:
    step = SessionSpec("s", ("k",), 100, None, parse_aggs({"n": "count"}))
    assert make_speculative_sessions(step, "2 seconds").every_ms == 2000
    with pytest.raises(ValueError, match="given once"):
        make_speculative_sessions(make_speculative_sessions(step, None), None)
    with pytest.raises(ValueError, match=r"every=-1\) must be >= 0"):
        make_speculative_sessions(step, -1)
    clash = SessionSpec("s", ("k",), 100, None, parse_aggs({"version": "count"}))
    with pytest.raises(ValueError, match="'version' is a changelog column"):
        make_speculative_sessions(clash, None)


class Folded:
    """A changelog folded as :func:`lowtide.apply_changelog` folds it (a tombstone
    cancels the live row it repeats), checking it on the way."""

    def __init__(self) -> None:
        self.live: list[tuple[Any, ...]] = []  # (start, end, n, sum, first, version, final)
        self.children: set[tuple[int, int]] = set()  # (slot, child index) of early rows

    def apply(self, out: pd.DataFrame | None, early: bool) -> None:
        for r in [] if out is None else out.to_dict("records"):
            row = (r["session_window_start"].value // 10**7,
                   r["session_window_end"].value // 10**7, r["n"], r["s"], r["f"],
                   r["version"])
            assert r[AT_COL] >= row[1], "a row above its session's hold"
            if early:
                assert (r[AT_COL], r[CHILD_COL]) not in self.children, "a child index twice"
                self.children.add((r[AT_COL], r[CHILD_COL]))
            if r["op"] == "tombstone":
                match = [x for x in self.live if x[:6] == row]
                assert match, "a tombstone of no live version"
                assert not match[0][6], "a final version cancelled"
                self.live.remove(match[0])
            else:
                self.live.append((*row, bool(r["is_final"])))


@settings(max_examples=150, deadline=None)
@given(inputs(), st.randoms(use_true_random=False), st.sampled_from([0, 30]))
def test_the_changelog_folds_into_the_exact_sessions(case: Any, rng: Any, every_ms: int
                                                     ) -> None:
    """Invariants: each tombstone cancels a live, not final, version it repeats; early
    child indices are distinct per hold slot; a retried call emits the same rows and
    keeps the same state; after every call (``every`` 0) the live versions are the
    sessions of the rows received so far, final exactly when complete; at the end
    every session is final and they are the batch sessions; no hold is left."""
    items, fixed, steps = case
    g = speculating(fixed, every_ms)
    folded = Folded()
    pending, done, now = list(items), 0, 0
    for advance in [*steps, 100]:
        nxt, now = done + advance, now + 10 * rng.randrange(5)
        batch = [r for r in pending if r[0] < nxt + rng.randrange(6)]
        pending = [r for r in pending if r not in batch]
        new = rows([s for s, _, _ in batch], [i for _, i, _ in batch],
                   None if fixed else [gap for *_, gap in batch]) if batch else None
        step = g.retried_call(new, nxt, now)
        folded.apply(step.out, False)
        folded.apply(step.early, True)
        if not every_ms:
            got = sorted(x[:5] for x in folded.live)
            assert got == sorted(batch_sessions([r for r in items if r not in pending]))
            assert all(x[6] == (x[1] < nxt) for x in folded.live)
        done = nxt
    assert sorted(x[:5] for x in folded.live) == sorted(batch_sessions(items))
    assert all(x[6] for x in folded.live)
    assert not g.holds and pickle.loads(g.data) is None
