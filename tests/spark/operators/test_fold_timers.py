"""Timers in a user's fold (``stateful(..., on_timer=)``), without Spark: event-time
timers fire when the min time passes them, after their slot's rows, with their output
at that slot; processing-time timers fire in the first call at or past their expiry,
waiting (a hold) at the min time until then. Worked examples, then a property: a
session closed by its gap with a timer, over random rows, micro-batches and retried
calls, equals a batch sessionization."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.spark.operators.fold import FoldLogic, Timers, time_mode_of
from lowtide.spark.operators.slot_logic import AT_COL, ID_COL, SLOT_COL, KeptRows
from tests.spark.operators.groups import Group, batches

DELTA_MS = 10
GAP = 5  # slots
GAP_MS = GAP * DELTA_MS


def rows(slots: list[int], ids: list[int] | None = None) -> pd.DataFrame:
    ids = ids if ids is not None else list(range(1, len(slots) + 1))
    return pd.DataFrame({"v": slots, SLOT_COL: np.array(slots, np.int64),
                         ID_COL: np.array(ids, np.int64)})


def visits(key: Any, new: pd.DataFrame, state: Any, timers: Timers) -> tuple[Any, Any]:
    """A session per key: opened by its first row, closed GAP after its last."""
    start, n = state or (timers.event_time_ms(), 0)
    for t in timers.list_timers():
        timers.delete_timer(t)
    timers.register_timer(timers.event_time_ms() + GAP_MS)
    return (start, n + len(new)), None


def closed(key: Any, expiry_ms: int, state: Any, timers: Timers) -> tuple[Any, Any]:
    start, n = state
    return None, pd.DataFrame({"start": [start], "end": [expiry_ms], "n": [n]})


def sessions(mode: str = "EventTime") -> Group:
    return Group(KeptRows(FoldLogic(visits, "s", closed, mode, DELTA_MS)))


# ------------------------------------------------------------------ worked examples


def test_an_event_time_timer_fires_when_the_min_time_passes_it() -> None:
    g = sessions()
    step = g.call(rows([4]), done=3)
    assert step.out is None and step.wakes.tolist() == [4]
    step = g.call(None, done=5)  # slot 4 runs: its timer at 90 ms (slot 9) moves the hold
    assert step.out is None and step.releases.tolist() == [4] and step.wakes.tolist() == [9]
    step = g.call(rows([9]), done=9)  # a row at the timer's own slot: not yet complete
    assert step.out is None and step.wakes.tolist() == [9]
    step = g.call(None, done=10)  # slot 9's row first (the session goes on), then no timer
    assert step.out is None and step.wakes.tolist() == [14]
    step = g.call(None, done=15)
    assert step.out[["start", "end", "n", AT_COL]].values.tolist() == [[40, 140, 2, 14]]
    assert step.state is None and not g.holds


def test_a_timer_in_the_past_fires_after_the_call_that_set_it() -> None:
    fired: list[tuple[int, int]] = []

    def fn(key: Any, new: Any, state: Any, timers: Timers) -> tuple[Any, Any]:
        timers.register_timer(0)  # long past
        return state, None

    def on_timer(key: Any, expiry: int, state: Any, timers: Timers) -> tuple[Any, Any]:
        fired.append((expiry, timers.event_time_ms()))
        timers.register_timer(0)  # again: at the next slot, not in a loop in this one
        return state, pd.DataFrame({"x": [expiry]})

    g = Group(KeptRows(FoldLogic(fn, "p", on_timer, "EventTime", DELTA_MS)))
    step = g.call(rows([6]), done=8)
    assert fired == [(0, 60), (0, 70)] and step.out[AT_COL].tolist() == [6, 7]
    assert step.wakes.tolist() == [8]  # the third time waits for slot 8


def test_timers_of_one_slot_fire_in_expiry_order_and_can_be_deleted() -> None:
    order: list[int] = []

    def fn(key: Any, new: Any, state: Any, timers: Timers) -> tuple[Any, Any]:
        for t in (57, 51, 55, 200):
            timers.registerTimer(t)
        timers.deleteTimer(55)
        assert timers.listTimers() == [51, 57, 200]
        return state, None

    def on_timer(key: Any, expiry: int, state: Any, timers: Timers) -> tuple[Any, Any]:
        order.append(expiry)
        return state, None

    g = Group(KeptRows(FoldLogic(fn, "o", on_timer, "EventTime", DELTA_MS)))
    step = g.call(rows([2]), done=6)
    assert order == [51, 57] and step.wakes.tolist() == [20]


def test_a_processing_time_timer_waits_at_the_min_time_until_it_is_due() -> None:
    def fn(key: Any, new: Any, state: Any, timers: Timers) -> tuple[Any, Any]:
        timers.register_timer(timers.processing_time_ms() + 1000)
        return len(new), None

    def on_timer(key: Any, expiry: int, state: Any, timers: Timers) -> tuple[Any, Any]:
        return None, pd.DataFrame({"n": [state], "at_ms": [timers.processing_time_ms()]})

    g = Group(KeptRows(FoldLogic(fn, "p", on_timer, "ProcessingTime", DELTA_MS)))
    step = g.call(rows([3, 3]), done=4, now_ms=5_000)  # due at 6000 ms; waits at 4
    assert step.out is None and step.wakes.tolist() == [4]
    step = g.call(None, done=7, now_ms=5_500)  # not due: the hold moves to 7
    assert step.opens.tolist() == [7] and step.releases.tolist() == [4]
    step = g.call(None, done=7, now_ms=6_000)  # due, but the input has not moved on
    assert step.out is None and step.wakes.tolist() == [7]
    step = g.call(None, done=9, now_ms=6_100)  # fires at the slot it waited at
    assert step.out[["n", "at_ms", AT_COL]].values.tolist() == [[2, 6_100, 7]]
    assert step.state is None and not g.holds


def test_a_fold_without_on_timer_keeps_its_three_arguments() -> None:
    g = Group(KeptRows(FoldLogic(lambda k, r, s: ((s or 0) + len(r), None), "n")))
    step = g.call(rows([1, 2]), done=3)
    assert step.state.user == 2 and step.state.timers is None and not g.holds


def test_a_fold_that_returns_no_pair_names_the_step() -> None:
    g = sessions()
    g.logic = KeptRows(FoldLogic(visits, "s", lambda *a: None, "EventTime", DELTA_MS))
    with pytest.raises(ValueError, match=r"^stateful 's': on_timer must return"):
        g.call(rows([1]), done=100)


def test_time_modes_take_sparks_names() -> None:
    assert time_mode_of("EventTime", "x") == time_mode_of("event", "x") == "EventTime"
    assert time_mode_of("processing_time", "x") == "ProcessingTime"
    with pytest.raises(ValueError, match="time_mode='None'"):
        time_mode_of("None", "stateful 'x'")


# ------------------------------------------------------------------ property


def batch_sessions(items: list[tuple[int, int]]) -> set[tuple[int, int, int]]:
    """(start ms, end ms, rows) of each session of the whole input: rows at most GAP
    slots apart are one session, which ends GAP after its last row."""
    out, run = set(), []
    for s in sorted(s for s, _ in items):
        if run and s - run[-1] > GAP:
            out.add((run[0] * DELTA_MS, (run[-1] + GAP) * DELTA_MS, len(run)))
            run = []
        run.append(s)
    if run:
        out.add((run[0] * DELTA_MS, (run[-1] + GAP) * DELTA_MS, len(run)))
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 60), max_size=40), st.lists(st.integers(0, 9), min_size=1,
                                                            max_size=30),
       st.randoms(use_true_random=False))
def test_sessions_closed_by_timers_equal_the_batch_sessions(slots: list[int],
                                                            steps: list[int],
                                                            rng: Any) -> None:
    """Invariants: every session emitted equals the batch session (no row came after
    its timer fired), each once, at its end's slot; a retried call returns the same
    rows and state; the holds open are the wakes; nothing is left at the end."""
    items = list(zip(slots, range(1, len(slots) + 1), strict=True))
    g = sessions()
    got = []
    for done, out in batches(g, items, steps, rng, lambda b: rows(
            [s for s, _ in b], [i for _, i in b])):
        for r in out.to_dict("records"):
            assert r[AT_COL] * DELTA_MS == r["end"] and r[AT_COL] < done
            got.append((r["start"], r["end"], r["n"]))
    assert len(got) == len(set(got)) and set(got) == batch_sessions(items)
    assert not g.holds and pickle.loads(g.data) is None
