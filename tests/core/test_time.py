"""Time grid: clock ms -> slots -> tracking windows, and the injected clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowtide.core.time import TIME_LIMIT, GlobalTime, ManualClock, TimeGrid


def test_slots_and_windows_worked_example() -> None:
    grid = TimeGrid(delta_ms=10, window_slots=4)
    assert grid.slot_of(0) == 0
    assert grid.slot_of(9) == 0
    assert grid.slot_of(10) == 1
    assert grid.slot_of(1_234) == 123
    # slots 120..123 form window 30; window 30 starts at slot 120
    assert [grid.window_of(s) for s in (119, 120, 123, 124)] == [29, 30, 30, 31]
    assert grid.window_start(30) == 120
    assert grid.slot_start_ms(123) == 1_230
    assert grid.label(1_234, front=7) == GlobalTime(slot=123, front=7)


def test_default_grid_is_10ms_slots_one_slot_windows() -> None:
    grid = TimeGrid()
    assert (grid.delta_ms, grid.window_slots) == (10, 1)
    assert grid.window_of(57) == 57 and grid.window_start(57) == 57


def test_global_time_orders_by_slot_then_front() -> None:
    assert GlobalTime(1, 9) < GlobalTime(2, 0)
    assert GlobalTime(2, 0) < GlobalTime(2, 1)
    assert sorted([GlobalTime(3, 1), GlobalTime(1, 5), GlobalTime(3, 0)]) == [
        GlobalTime(1, 5),
        GlobalTime(3, 0),
        GlobalTime(3, 1),
    ]


@pytest.mark.parametrize(("delta_ms", "window_slots"), [(0, 1), (-10, 1), (10, 0), (10, -1)])
def test_grid_rejects_non_positive_sizes(delta_ms: int, window_slots: int) -> None:
    with pytest.raises(ValueError):
        TimeGrid(delta_ms=delta_ms, window_slots=window_slots)


def test_time_limit_leaves_int64_headroom() -> None:
    assert TIME_LIMIT == 1 << 62
    assert TIME_LIMIT * 2 - 1 <= (1 << 63) - 1


@settings(max_examples=200, deadline=None)
@given(
    slot=st.integers(0, TIME_LIMIT - 1),
    window_slots=st.integers(1, 1_000),
)
def test_a_slot_lies_in_its_window(slot: int, window_slots: int) -> None:
    grid = TimeGrid(window_slots=window_slots)
    w = grid.window_of(slot)
    assert grid.window_start(w) <= slot < grid.window_start(w + 1)
    assert grid.window_of(grid.window_start(w)) == w


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(100)
    assert clock.now_ms() == 100
    assert clock.now_ms() == 100
    assert clock.advance(5) == 105
    assert clock.advance(0) == 105
    with pytest.raises(ValueError):
        clock.advance(-1)
    assert clock.now_ms() == 105
    assert ManualClock().now_ms() == 0
