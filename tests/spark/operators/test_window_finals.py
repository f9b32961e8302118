"""An exact window's results on the driver (no Spark): the latest values of each
(key, window), handed out once ``done`` passes its end, typed as the window's results,
in an order every attempt repeats; and, as a property, each window once with its
latest values and never before it is complete."""

from __future__ import annotations

import decimal
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.spark.operators.joins import KEY_COL
from lowtide.spark.operators.slot_logic import AT_COL, SLOT_COL, step_group
from lowtide.spark.operators.state_processor import NoParts
from lowtide.spark.operators.window_aggs import VALID_PREFIX, VALUE_PREFIX, bind_aggs
from lowtide.spark.operators.window_finals import WindowFinals
from lowtide.spark.operators.windows import Agg

COUNT, _ = bind_aggs("w", (Agg("n", "count", None),), {"k": "string"})


def changed(rows: list[tuple[str, int, int]]) -> pd.DataFrame:
    """Spark's changed rows: (key, window's last slot, count)."""
    k, last, n = (list(c) for c in zip(*rows, strict=True))
    return pd.DataFrame({"k": k, KEY_COL: [f'{{"k0":"{x}"}}' for x in k], SLOT_COL: last,
                         f"{VALUE_PREFIX}0": n, f"{VALID_PREFIX}0": [True] * len(k)})


def test_the_worked_example() -> None:
    logic = WindowFinals(COUNT, 10, 10, ("k",))
    first = logic.step((), None, changed([("a", 9, 2)]), 2, NoParts())
    assert first.out is None and first.wakes.tolist() == [9]
    then = logic.step((), first.state, changed([("a", 9, 3), ("b", 19, 1)]), 12, NoParts())
    assert then.out[["k", "n", AT_COL]].values.tolist() == [["a", 3, 9]]
    assert then.out["window_start"].tolist() == [pd.Timestamp(0, tz="UTC")]
    assert then.out["window_end"].tolist() == [pd.Timestamp("1970-01-01 00:00:00.1", tz="UTC")]
    assert then.wakes.tolist() == [19] and then.state["k"].tolist() == ["b"]
    assert logic.step((), then.state, None, 20, NoParts()).state is None
    with pytest.raises(ValueError, match="new checkpoint"):  # a dev build's state
        logic.step((), {'{"k0":"a"}': ((), None)}, None, 20, NoParts())


def test_results_at_a_slot_come_in_key_order_whatever_the_input_order() -> None:
    """Rules 5 and 6: a batch run again hands each result out as the same child of its
    slot's hold, so the order is the rows' (slot, key), not Spark's."""
    logic = WindowFinals(COUNT, 10, 10, ("k",))
    rows = changed([("c", 19, 1), ("a", 9, 1), ("b", 19, 1), ("a", 19, 1), ("b", 9, 1)])
    once = logic.step((), None, rows, 30, NoParts()).out
    again = logic.step((), None, rows.iloc[::-1], 30, NoParts()).out
    assert once[["k", AT_COL]].values.tolist() == [["a", 9], ["b", 9], ["a", 19], ["b", 19],
                                                    ["c", 19]]
    pd.testing.assert_frame_equal(once, again)


def test_results_are_typed_as_the_windows_with_nulls_kept() -> None:
    fields = {"k": "string", "x": "bigint", "d": "decimal(10,2)", "f": "double",
              "t": "timestamp"}
    aggs, _ = bind_aggs("w", (Agg("top", "max", "x"), Agg("s", "sum", "d"),
                              Agg("m", "mean", "f"), Agg("last", "max", "t")), fields)
    logic = WindowFinals(aggs, 10, 10, ("k",))
    big = 2**55 + 1
    rows = changed([("a", 9, 0), ("b", 9, 0)]).assign(**{
        f"{VALUE_PREFIX}0": [big, 0], f"{VALID_PREFIX}0": [True, False],
        f"{VALUE_PREFIX}1": [decimal.Decimal("1.25"), None], f"{VALID_PREFIX}1": [True, False],
        f"{VALUE_PREFIX}2": [0.5, 0.0], f"{VALID_PREFIX}2": [True, False],
        f"{VALUE_PREFIX}3": pd.to_datetime([5, 0], unit="ms"), f"{VALID_PREFIX}3": [True, False]})
    out = logic.step((), None, rows, 10, NoParts()).out
    assert out["top"].tolist() == [big, None]  # exact above 2**53, and null
    assert out["s"].tolist() == [decimal.Decimal("1.25"), None]
    assert out["m"].iloc[0] == 0.5 and np.isnan(out["m"].iloc[1])
    assert out["last"].iloc[0] == pd.Timestamp(5_000_000) and pd.isna(out["last"].iloc[1])
    whole = logic.step((), None, rows.iloc[:1], 10, NoParts()).out
    assert whole["top"].dtype == np.int64  # no null: a plain column


batches = st.lists(st.tuples(
    st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 5), st.integers(1, 9)),
             max_size=6),
    st.integers(0, 3)), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(batches)
def test_each_window_once_with_its_latest_values_never_early(script: list[Any]) -> None:
    """Safety: a window's result comes only once ``done`` passes its end, and never a
    second time; it carries the values of the last batch that changed it. Liveness:
    once ``done`` passes every window, all have come out. The holds (``step_group``)
    accept every step: no output at a slot no hold covered."""
    logic = WindowFinals(COUNT, 1, 10, ("k",))
    state, wakes, done, latest = None, np.zeros(0, np.int64), 0, {}
    seen: dict[tuple[str, int], int] = {}
    for rows, grow in [*script, ([], 100)]:
        # a batch's rows were in flight at the last step (at or above its ``done``);
        # its own ``done``, read after its tasks, may already pass their windows
        fresh = {(k, max(s, done)): n for k, s, n in rows}
        done += grow
        latest.update(fresh)
        new = changed([(k, s, n) for (k, s), n in fresh.items()]) if fresh else None
        step = step_group(logic, (), state, wakes, new, done, NoParts())
        state, wakes = step.state, step.wakes
        for k, at, n in ([] if step.out is None else
                         step.out[["k", AT_COL, "n"]].values.tolist()):
            assert at < done and (k, at) not in seen
            seen[(k, at)] = n
    assert seen == latest and state is None
