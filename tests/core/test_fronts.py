"""Front table: registration, heartbeats, unregistration and source bounds."""

from __future__ import annotations

import pytest

from lowtide.core.errors import FrontOwned, NonMonotonicHeartbeat, ProtocolError, UnknownFront
from lowtide.core.fronts import FrontTable, check_time
from lowtide.core.time import TIME_LIMIT


def test_bound_is_the_minimum_heartbeat_over_live_fronts() -> None:
    fronts = FrontTable(n_segments=2)
    assert fronts.bound(0) == 0  # no front ever: nothing promised
    fronts.register(1, 0, 100, floor=0)
    fronts.register(2, 0, 90, floor=0)
    fronts.register(3, 1, 5, floor=0)
    assert (fronts.bound(0), fronts.bound(1)) == (90, 5)
    fronts.heartbeat(2, 120)
    assert fronts.bound(0) == 100
    assert len(fronts) == 3
    assert fronts.live() == {1: (0, 100), 2: (0, 120), 3: (1, 5)}
    assert fronts.time_of(2) == 120 and fronts.time_of(9) is None


def test_register_below_floor_is_refused() -> None:
    fronts = FrontTable(n_segments=1)
    with pytest.raises(ProtocolError, match="below"):
        fronts.register(1, 0, 49, floor=50)
    assert len(fronts) == 0
    fronts.register(1, 0, 50, floor=50)  # at the floor is fine
    assert fronts.bound(0) == 50


def test_reregister_on_the_same_segment_is_a_heartbeat() -> None:
    fronts = FrontTable(n_segments=2)
    fronts.register(1, 0, 10, floor=0)
    fronts.register(1, 0, 30, floor=0)
    assert fronts.live() == {1: (0, 30)}
    fronts.register(1, 0, 30, floor=0)  # same time: fine
    # a re-register is checked like a heartbeat (monotonic), not against the floor
    fronts.register(1, 0, 35, floor=1_000)
    assert fronts.time_of(1) == 35
    with pytest.raises(NonMonotonicHeartbeat):
        fronts.register(1, 0, 20, floor=0)
    with pytest.raises(ProtocolError, match="another segment"):
        fronts.register(1, 1, 40, floor=0)
    assert fronts.live() == {1: (0, 35)}


def test_heartbeats_must_not_go_back() -> None:
    fronts = FrontTable(n_segments=1)
    fronts.register(1, 0, 10, floor=0)
    fronts.heartbeat(1, 10)
    fronts.heartbeat(1, 12)
    with pytest.raises(NonMonotonicHeartbeat, match="12 to 11"):
        fronts.heartbeat(1, 11)
    assert fronts.time_of(1) == 12
    assert issubclass(NonMonotonicHeartbeat, ProtocolError)


def test_unknown_fronts() -> None:
    fronts = FrontTable(n_segments=1)
    with pytest.raises(UnknownFront):
        fronts.heartbeat(7, 1)
    with pytest.raises(UnknownFront):
        fronts.unregister(7)
    assert issubclass(UnknownFront, ProtocolError)


def test_unregister_releases_the_bound() -> None:
    fronts = FrontTable(n_segments=1)
    fronts.register(1, 0, 100, floor=0)
    fronts.register(2, 0, 90, floor=0)
    fronts.unregister(2)
    assert fronts.bound(0) == 100  # the slow front no longer holds the segment back
    assert fronts.live() == {1: (0, 100)}
    with pytest.raises(UnknownFront):
        fronts.heartbeat(2, 95)
    with pytest.raises(UnknownFront):
        fronts.unregister(2)


def test_last_unregister_keeps_the_latest_heartbeat_reached() -> None:
    fronts = FrontTable(n_segments=2)
    fronts.register(1, 0, 100, floor=0)
    fronts.register(2, 0, 90, floor=0)
    fronts.heartbeat(2, 120)
    fronts.unregister(1)
    fronts.unregister(2)
    assert fronts.bound(0) == 120
    assert fronts.bound(1) == 0  # other segments are unaffected
    # a front may join again: its own time is the bound while it is live
    fronts.register(1, 0, 130, floor=120)
    assert fronts.bound(0) == 130
    fronts.unregister(1)
    assert fronts.bound(0) == 130


def test_done_bound_is_the_maximum_over_unregistered_fronts() -> None:
    fronts = FrontTable(n_segments=1)
    fronts.register(1, 0, 200, floor=0)
    fronts.unregister(1)
    fronts.register(2, 0, 50, floor=0)
    assert fronts.bound(0) == 50
    fronts.unregister(2)
    assert fronts.bound(0) == 200


@pytest.mark.parametrize("time", [-1, TIME_LIMIT, TIME_LIMIT + 5])
def test_times_outside_the_range_are_refused(time: int) -> None:
    fronts = FrontTable(n_segments=1)
    with pytest.raises(ProtocolError):
        fronts.register(1, 0, time, floor=0)
    fronts.register(1, 0, 0, floor=0)
    with pytest.raises(ProtocolError):
        fronts.heartbeat(1, time)
    with pytest.raises(ProtocolError, match="hb"):
        check_time(time, "hb")
    assert fronts.time_of(1) == 0
    check_time(TIME_LIMIT - 1, "max")


def test_export_restore_round_trip() -> None:
    fronts = FrontTable(n_segments=2)
    fronts.register(1, 0, 10, floor=0)
    fronts.register(2, 1, 20, floor=0)
    fronts.register(3, 0, 30, floor=0)
    fronts.unregister(3)
    live, done = fronts.export()
    assert live == ((1, 0, 10, 0), (2, 1, 20, 0))
    assert done == (30, 0)
    copy = FrontTable(n_segments=2)
    copy.register(9, 1, 1, floor=0)  # replaced by restore
    copy.restore(live, done)
    assert copy.export() == (live, done)
    assert copy.live() == fronts.live()
    assert [copy.bound(s) for s in (0, 1)] == [fronts.bound(s) for s in (0, 1)]
    copy.unregister(1)
    assert copy.bound(0) == 30


def test_only_the_owner_may_move_or_unregister_a_front() -> None:
    fronts = FrontTable(n_segments=1)
    fronts.register(1, 0, 10, floor=0, owner=7)
    with pytest.raises(FrontOwned):
        fronts.register(1, 0, 500, floor=0, owner=8)  # would pass the owner's items
    with pytest.raises(FrontOwned):
        fronts.unregister(1, owner=8)
    fronts.heartbeat(1, 12)  # heartbeats are not ownership
    assert fronts.bound(0) == 12
    fronts.register(1, 0, 20, floor=0, owner=7)  # the owner (or its successor) may
    assert fronts.bound(0) == 20
    live, done = fronts.export()
    copy = FrontTable(n_segments=1)
    copy.restore(live, done)  # owners survive a snapshot
    with pytest.raises(FrontOwned):
        copy.unregister(1, owner=8)
    copy.unregister(1, owner=7)
    assert len(copy) == 0
