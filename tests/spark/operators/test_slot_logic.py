"""The stateful runtime without Spark: the group step (holds derived from wakes), the
window as a slot logic fed by plain row batches, a user's fold through KeptRows, and
the group's record. Worked examples first, then a property over random micro-batches,
retried calls and restarts (the state pickled between calls, as the store keeps it):
the window's outputs equal a batch recomputation, each once, and the open holds are
exactly the pending windows' last slots."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.spark.operators.fold import FoldLogic
from lowtide.spark.operators.slot_logic import (
    AT_COL,
    ID_COL,
    SLOT_COL,
    KeptRows,
    LogicStep,
    step_group,
)
from lowtide.spark.operators.window_state import Pane, WindowLogic
from tests.spark.operators.groups import (
    Group,
    Parts,
    batch_windows,
    batches,
    counting,
    folding,
    inputs,
    rows,
)


def applying(size: int, slide: int | None = None) -> WindowLogic:
    return WindowLogic(size, slide or size, 10, fn=folding, data_cols=("v",))


def window_ms(out: pd.DataFrame, col: str) -> list[int]:
    return [t.value // 1_000_000 for t in out[col]]


# ------------------------------------------------------------------ worked examples


def test_a_tumbling_window_holds_at_its_last_slot_until_done_passes_its_end() -> None:
    g = Group(counting(10))
    step = g.call(rows([3, 7, 12], values=[1, 2, 4]), done=2)
    assert step.out is None and step.opens.tolist() == [9, 19] and step.wakes.tolist() == [9, 19]
    step = g.call(None, done=15)  # a timer call: [0, 10) is complete
    assert step.releases.tolist() == [9] and step.counts.tolist() == [1]
    assert window_ms(step.out, "window_start") == [0] and window_ms(step.out, "window_end") == [100]
    assert step.out[["n", "s", "lo", "f", "l", AT_COL]].values.tolist() == [[2, 3, 1, 1, 2, 9]]
    step = g.call(rows([16], values=[None]), done=15)  # a null: counted by n only
    assert step.out is None and step.opens.size == 0 and step.wakes.tolist() == [19]
    step = g.call(None, done=20)
    assert step.out[["n", "s", "lo", AT_COL]].values.tolist() == [[2, 4, 4, 19]]
    assert step.state is None and not g.holds


def test_a_sliding_row_opens_a_hold_per_window() -> None:
    g = Group(counting(10, 5))
    step = g.call(rows([7]), done=0)
    assert step.wakes.tolist() == [9, 14]
    assert sorted(pickle.loads(g.data)) == [0, 5]
    step = g.call(None, done=14)  # [0, 10) complete, [5, 15) not yet
    assert window_ms(step.out, "window_start") == [0] and step.wakes.tolist() == [14]


def test_apply_sees_its_window_rows_in_slot_then_ack_order() -> None:
    seen: list[list[int]] = []

    def fn(window: pd.DataFrame) -> dict[str, Any]:
        seen.append(window["v"].tolist())
        assert SLOT_COL not in window.columns and ID_COL not in window.columns
        return {"rows": len(window)}

    g = Group(WindowLogic(10, 10, 10, fn=fn, data_cols=("v",)))
    step = g.call(pd.DataFrame({"v": [8, 5], SLOT_COL: [8, 5], ID_COL: [1, 9]}), done=0)
    assert [(tag, i) for tag, i, _ in step.appends] == [(0, 0)]  # stored, not in the state
    g.call(pd.DataFrame({"v": [51, 52], SLOT_COL: [5, 5], ID_COL: [4, 2]}), done=5)
    assert sorted(g.parts.stored) == [(0, 0), (0, 1)] and pickle.loads(g.data)[0].parts == 2
    step = g.call(None, done=10)
    assert seen == [[52, 51, 5, 8]] and step.out["rows"].tolist() == [4]
    assert step.drops == ((0, 2),) and not g.parts.stored


def test_a_fold_runs_each_complete_slot_once_with_the_state_carried() -> None:
    def running(key: Any, slot_rows: pd.DataFrame, total: Any) -> tuple[Any, Any]:
        total = (total or 0) + len(slot_rows)
        return total, pd.DataFrame({"n": [total]})

    g = Group(KeptRows(FoldLogic(running, "f")))
    step = g.call(rows([4, 6]), done=3)
    assert step.out is None and step.wakes.tolist() == [4, 6]
    step = g.call(rows([4]), done=4)  # slot 4's second row, before 4 is complete
    assert step.out is None and step.opens.size == 0
    step = g.call(None, done=7)
    assert step.out[["n", AT_COL]].values.tolist() == [[2, 4], [3, 6]]
    assert step.releases.tolist() == [4, 6] and step.counts.tolist() == [1, 1]
    assert step.state.rows is None and step.state.user == 3  # the user's value stays
    assert not g.holds


# ------------------------------------------------------------------ the contract


class Broken:
    def __init__(self, out_at: list[int], wakes: list[int]) -> None:
        self.out_at, self.wakes = out_at, wakes

    def step(self, key: Any, state: Any, new: Any, done: int, parts: Any,
             now_ms: int) -> LogicStep:
        out = pd.DataFrame({AT_COL: self.out_at}) if self.out_at else None
        return LogicStep("s", out, np.array(self.wakes, np.int64))


@pytest.mark.parametrize(("logic", "wakes", "message"), [
    (Broken([10], []), [5], "an output at slot 10 >= 10"),
    (Broken([], [7]), [7], "a wake at slot 7 below 10 left unresolved"),
    (Broken([3], []), [5], "an output at slot 3 that no hold covered"),
])
def test_a_logic_that_breaks_its_contract_fails_the_call(logic: Any, wakes: list[int],
                                                         message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        step_group(logic, ("k",), None, np.array(wakes, np.int64), None, 10, Parts())


def test_a_step_moves_a_hold_when_a_wake_moves() -> None:
    """A session's end moving later (issue 33's shape): its hold moves in one call."""
    step = step_group(Broken([], [30]), ("k",), "s", np.array([20], np.int64), None, 10,
                      Parts())
    assert step.opens.tolist() == [30] and step.releases.tolist() == [20]
    assert step.counts.tolist() == [0]


def test_the_group_record_keeps_what_it_was_given() -> None:
    from lowtide.spark.operators.state_processor import GroupRecord

    rec = GroupRecord(2**64 - 3, ("u", None), np.array([9, 19], np.int64), 1200,
                      pickle.dumps({0: Pane(0, 10, [2])}))
    back = GroupRecord.of_row(rec.to_row())
    assert (back.parent, back.key, back.wakes.tolist(), back.timer_ms) == (
        2**64 - 3, ("u", None), [9, 19], 1200)
    assert pickle.loads(back.data) == {0: Pane(0, 10, [2])}


# ------------------------------------------------------------------ property


@settings(max_examples=150, deadline=None)
@given(inputs(), st.randoms(use_true_random=False), st.sampled_from([counting, applying]))
def test_windows_over_random_batches_equal_the_batch_windows(case: Any, rng: Any,
                                                             kind: Any) -> None:
    """Invariants, for agg and apply windows: every output equals the batch
    recomputation of its window (nothing came after it was emitted); each window once;
    a retried call returns the same rows and state; the holds open are the pending
    windows' last slots; no hold and no stored row left at the end."""
    items, size, slide, steps = case
    g = Group(kind(size, slide))
    got: dict[int, list[Any]] = {}
    for done, out in batches(g, items, steps, rng,
                             lambda b: rows(*(list(c) for c in zip(*b, strict=True)))):
        for r in out.to_dict("records"):
            start = r["window_start"].value // 10_000_000
            assert start not in got, "a window twice"
            got[start] = [r["n"], *(None if pd.isna(r[c]) else r[c]
                                    for c in ("s", "lo", "f", "l"))]
            assert r[AT_COL] == start + size - 1 < done
    assert got == batch_windows(items, size, slide)
    assert not g.holds and pickle.loads(g.data) is None and not g.parts.stored
