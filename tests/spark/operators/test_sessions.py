"""Session windows without Spark: the slot logic fed by plain row batches. Worked
examples (merging, a row exactly a gap after the last, per-row gaps, the holds moving
with the session's end), then a property over random rows, gaps, micro-batches and
retried calls: the sessions emitted equal a batch sessionization, each once, when
final."""

from __future__ import annotations

import pickle
from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.spark.operators.sessions import SessionLogic, make_sessions
from lowtide.spark.operators.slot_logic import AT_COL
from tests.spark.operators.groups import Described, Group, batches
from tests.spark.operators.session_rows import AGGS, DELTA_MS, batch_sessions, inputs, rows


def sessions(gap: int) -> Group:
    return Group(SessionLogic(gap, DELTA_MS, AGGS))


def bounds(out: pd.DataFrame) -> list[list[int]]:
    """[start slot, end slot, n, sum, first, at] of each output row."""
    return [[r["session_window_start"].value // 10**7, r["session_window_end"].value // 10**7,
             r["n"], r["s"], r["f"], r[AT_COL]] for r in out.to_dict("records")]


def test_sessions_merge_and_emit_once_final() -> None:
    g = sessions(5)
    step = g.call(rows([3, 12]), done=2)
    assert step.out is None and step.wakes.tolist() == [8, 17]
    step = g.call(rows([8]), done=8)  # exactly a gap after 3: joins, and bridges to 12
    assert step.out is None and step.wakes.tolist() == [17]
    assert step.releases.tolist() == [8] and step.opens.size == 0  # 17 was open already
    step = g.call(None, done=17)  # a row at 17 could still join
    assert step.out is None
    step = g.call(None, done=18)
    assert bounds(step.out) == [[3, 17, 3, 23, 3, 17]]
    assert step.state is None and not g.holds


def test_a_row_more_than_a_gap_later_starts_a_new_session() -> None:
    g = sessions(5)
    g.call(rows([3]), done=0)
    step = g.call(rows([9]), done=9)  # 9 > 3 + 5: [3, 8] is final, [9, 14] opens
    assert bounds(step.out) == [[3, 8, 1, 3, 3, 8]] and step.wakes.tolist() == [14]


def test_per_row_gaps_and_rows_in_no_session() -> None:
    g = sessions(0)
    # 0: a 10-slot session; 4: gap 1, inside it; 20: gap 0 (null or not positive): in
    # no session; 30: gap 2
    step = g.call(rows([0, 4, 20, 30], gaps=[10, 1, 0, 2]), done=0)
    assert step.wakes.tolist() == [10, 32]
    step = g.call(rows([12], gaps=[3]), done=11)
    assert bounds(step.out) == [[0, 10, 2, 4, 0, 10]] and step.wakes.tolist() == [15, 32]
    # 13 extends [12, 15] to 17 (its hold moves); 25 + 5 touches the session at 30,
    # which now starts at 25
    step = g.call(rows([13, 25], gaps=[4, 5]), done=13)
    assert step.wakes.tolist() == [17, 32] and step.releases.tolist() == [15]
    step = g.call(None, done=33)
    assert bounds(step.out) == [[12, 17, 2, 25, 12, 17], [25, 32, 2, 55, 25, 32]]
    assert not g.holds


def test_session_descriptions_refuse_bad_gaps_and_names() -> None:
    with pytest.raises(ValueError, match="positive multiple of delta_ms=10"):
        make_sessions(Described(), "15 milliseconds", "user", "s", 100, 10)
    with pytest.raises(ValueError, match="give a duration"):
        make_sessions(Described(), 5.5, "user", "s", 100, 10)
    grouping = make_sessions(Described(), "5 seconds", ["user"], "s", 100, 10)
    spec = grouping.agg(n="count")
    assert (spec.gap_ms, spec.gap, spec.keys, spec.poll_ms) == (5000, None, ("user",), 100)
    with pytest.raises(ValueError, match="'session_window_end' is taken"):
        grouping.agg(session_window_end="count")


# ------------------------------------------------------------------ property


@settings(max_examples=200, deadline=None)
@given(inputs(), st.randoms(use_true_random=False))
def test_sessions_over_random_batches_equal_the_batch_sessions(case: Any, rng: Any) -> None:
    """Invariants: every session emitted equals the batch session over the whole input
    (no row that belongs to it came after it was emitted), at its end's slot, below
    ``done``; each once; a retried call returns the same rows and state; the holds
    open are the open sessions' ends; nothing is left at the end."""
    items, fixed, steps = case
    g = sessions(fixed)
    got = []
    for done, out in batches(g, items, steps, rng, lambda b: rows(
            [s for s, _, _ in b], [i for _, i, _ in b], None if fixed else [gap for *_, gap in b])):
        for start, end, n, total, first, at in bounds(out):
            assert at == end < done
            got.append((start, end, n, total, first))
    assert len(got) == len(set(got)), "a session emitted twice"
    assert set(got) == batch_sessions(items)
    assert not g.holds and pickle.loads(g.data) is None
