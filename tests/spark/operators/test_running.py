"""``groupBy(k).agg(...)`` without Spark: the running aggregation's slot logic fed by
plain row batches. A worked example, then a property over random rows, ranges,
micro-batches and retried calls: each output is the batch aggregation of the key's
rows below its ``as_of``, one per range with rows, each once."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.spark.operators.running import AS_OF, RunningLogic, make_grouped
from lowtide.spark.operators.slot_logic import AT_COL
from tests.spark.operators.groups import Described, Group, batches
from tests.spark.operators.running_rows import AGGS, DELTA_MS, rows


def outputs(out: pd.DataFrame) -> list[list[int]]:
    """[as_of slot, n, sum, last, distinct, at] of each output row."""
    return [[r[AS_OF].value // 10**7, r["n"], r["s"], r["l"], r["d"], r[AT_COL]]
            for r in out.to_dict("records")]


def test_the_running_result_per_completed_range() -> None:
    g = Group(RunningLogic(10, DELTA_MS, AGGS))
    step = g.call(rows([3, 7, 12]), done=2)
    assert step.out is None and step.wakes.tolist() == [9, 19]
    step = g.call(rows([15], values=[3]), done=12)  # [0, 10) is complete
    assert outputs(step.out) == [[10, 2, 10, 7, 2, 9]] and step.wakes.tolist() == [19]
    step = g.call(None, done=40)  # [10, 20): every row below 200 ms
    assert outputs(step.out) == [[20, 4, 25, 3, 3, 19]]
    assert step.wakes.size == 0 and not g.holds
    step = g.call(rows([41]), done=40)  # the running total goes on for ever
    step = g.call(None, done=50)
    assert outputs(step.out) == [[50, 5, 66, 41, 4, 49]]


def test_group_by_descriptions() -> None:
    grouping = make_grouped(Described(), (["word", "lang"],), None, "g", 100, 10)
    spec = grouping.agg(n="count")
    assert spec.keys == ("word", "lang") and spec.every_ms == 10
    assert make_grouped(Described(), ("w",), "1 second", "g", 100, 10).agg(
        n="count").every_ms == 1000
    with pytest.raises(ValueError, match="give the key columns"):
        make_grouped(Described(), (), None, "g", 100, 10)
    with pytest.raises(ValueError, match="every='15 ms' must be a positive multiple"):
        make_grouped(Described(), ("w",), "15 ms", "g", 100, 10)
    with pytest.raises(ValueError, match="aggregate name 'as_of' is taken"):
        grouping.agg(as_of="count")


# ------------------------------------------------------------------ property


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(-50, 50)), max_size=40),
       st.sampled_from([1, 3, 10]), st.lists(st.integers(0, 12), min_size=1, max_size=30),
       st.randoms(use_true_random=False))
def test_running_results_equal_the_batch_aggregation_below_each_as_of(
        items: list[tuple[int, int]], every: int, steps: list[int], rng: Any) -> None:
    """Invariants: one row per range with rows, each once, at the range's last slot,
    below ``done``; each equals the aggregation of every row below its ``as_of`` (so
    no row below it came later); a retried call returns the same rows and state; the
    holds open are the pending ranges' last slots."""
    rows_in = [(s, i + 1, v) for i, (s, v) in enumerate(items)]
    g = Group(RunningLogic(every, DELTA_MS, AGGS))
    got = [r for _, out in batches(g, rows_in, steps, rng, lambda b: rows(
        *(list(c) for c in zip(*b, strict=True)))) for r in outputs(out)]
    expected = []
    for end in sorted({s - s % every + every for s, _, _ in rows_in}):
        below = sorted((s, i, v) for s, i, v in rows_in if s < end)
        vals = [v for _, _, v in below]
        expected.append([end, len(below), sum(vals), below[-1][2], len(set(vals)), end - 1])
    assert got == expected and not g.holds
