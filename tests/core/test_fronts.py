"""Front table: registration, heartbeats, unregistration and source bounds."""

from __future__ import annotations

import pytest

from lowtide.core.errors import (
    FrontBehind,
    FrontHeld,
    FrontOwned,
    NonMonotonicHeartbeat,
    ProtocolError,
    UnknownFront,
)
from lowtide.core.fronts import AT_START, NEVER, Declared, FrontTable, check_time
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
    with pytest.raises(FrontOwned):  # issue 29 point 4: a heartbeat moves the front too
        fronts.heartbeat(1, 500, owner=8)
    assert fronts.bound(0) == 10
    fronts.heartbeat(1, 12, owner=7)
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


# ------------------------------------------------ issue 29 point 1: declared fronts
def test_a_declared_front_holds_its_segment_until_it_registers() -> None:
    fronts = FrontTable(n_segments=2)
    fronts.register(1, 0, 100, floor=0)
    fronts.declare(4, 0, 50, floor=0)  # a gateway that uploads its first batch late
    fronts.heartbeat(1, 400)
    assert fronts.bound(0) == 50  # held: front 4 may still send items at 50
    assert fronts.bound(1) == 0  # other segments are not held
    with pytest.raises(UnknownFront, match="declared, not yet registered"):
        fronts.heartbeat(4, 60)
    fronts.register(4, 0, 70, floor=50, owner=9)  # whoever registers it owns it
    assert fronts.bound(0) == 70
    with pytest.raises(FrontOwned):
        fronts.heartbeat(4, 500)
    fronts.heartbeat(4, 500, owner=9)
    assert fronts.bound(0) == 400


def test_a_declaration_never_undercuts_the_floor_nor_revives_a_front() -> None:
    fronts = FrontTable(n_segments=1)
    fronts.declare(4, 0, 10, floor=30)
    assert fronts.bound(0) == 30 and fronts.declared()[4].time == 30
    fronts.declare(4, 0, 0, floor=0)  # declared already: unchanged
    assert fronts.bound(0) == 30
    fronts.register(4, 0, 40, floor=30)
    fronts.declare(4, 0, 35, floor=0)  # live: unchanged
    assert fronts.live() == {4: (0, 40)} and fronts.declared() == {}
    fronts.unregister(4)
    fronts.declare(4, 0, 35, floor=0)  # done: a pipeline restart declares it again
    assert fronts.declared() == {} and fronts.bound(0) == 40


def test_a_front_that_was_not_declared_and_registers_behind_is_refused() -> None:
    fronts = FrontTable(n_segments=1)
    with pytest.raises(FrontBehind, match="declare every front"):
        fronts.register(4, 0, 10, floor=30)
    assert issubclass(FrontBehind, ProtocolError)


def test_retire_by_hand_and_by_deadline() -> None:
    fronts = FrontTable(n_segments=1)
    fronts.register(1, 0, 100, floor=0)
    fronts.declare(4, 0, 50, floor=0, owner=3)
    fronts.declare(5, 0, 60, floor=0, retire_at_ms=1_000)
    with pytest.raises(FrontOwned):
        fronts.retire(4, owner=8)
    fronts.retire(4, owner=3)
    assert fronts.bound(0) == 60
    with pytest.raises(UnknownFront):
        fronts.retire(4, owner=3)
    assert fronts.expire(999) == [] and fronts.bound(0) == 60
    assert fronts.expire(1_000) == [Declared(5, 0, 60, 0, 1_000)]
    assert fronts.bound(0) == 100
    with pytest.raises(FrontBehind):  # retired, then late after all: refused, visibly
        fronts.register(5, 0, 70, floor=100)


def test_declared_fronts_survive_export_restore() -> None:
    fronts = FrontTable(n_segments=1)
    fronts.declare(4, 0, 50, floor=0, owner=3, retire_at_ms=NEVER)
    fronts.register(1, 0, 10, floor=0)
    fronts.unregister(1)
    copy = FrontTable(n_segments=1)
    copy.restore(*fronts.export(), *fronts.export_declared())
    assert copy.declared() == fronts.declared() and copy.bound(0) == 50
    copy.declare(1, 0, 60, floor=0)  # still known as done
    assert copy.declared().keys() == {4}


def test_a_front_declared_at_the_start_holds_where_its_segment_starts() -> None:
    fronts = FrontTable(n_segments=1)
    fronts.declare(4, 0, AT_START, floor=0)  # before any front: not known yet
    assert fronts.bound(0) == 0 and fronts.declared()[4].time == AT_START
    fronts.register(1, 0, 1_000, floor=0)  # the first registration says where it starts
    assert fronts.declared()[4].time == 1_000
    fronts.heartbeat(1, 5_000)
    assert fronts.bound(0) == 1_000  # held there, not at 0 (the table spans a window)
    fronts.declare(5, 0, AT_START, floor=900)  # declared later: where the fronts are now
    assert fronts.declared()[5].time == 1_000
    fronts.register(4, 0, 1_000, floor=900)
    fronts.register(5, 0, 1_200, floor=900)
    assert fronts.bound(0) == 1_000


# ---------------------- issue 29 point 2: one live producer per front (the holder)
def test_a_second_live_session_of_the_owner_is_refused() -> None:
    fronts = FrontTable(n_segments=1, lease_ms=1_000)
    fronts.register(1, 0, 10, floor=0, owner=7, session=100, now_ms=0)
    fronts.heartbeat(1, 20, owner=7, session=100, now_ms=800)  # the holder is live
    with pytest.raises(FrontHeld, match="Two producers configured with one front id"):
        fronts.register(1, 0, 500, floor=0, owner=7, session=200, now_ms=1_500)
    with pytest.raises(FrontHeld):
        fronts.unregister(1, owner=7, session=200, now_ms=1_500)
    with pytest.raises(FrontOwned, match="taken the front over"):  # its own heartbeats
        fronts.heartbeat(1, 500, owner=7, session=200, now_ms=1_500)
    fronts.heartbeat(1, 30, owner=7, session=None, now_ms=1_500)  # a keyed batch's
    assert fronts.bound(0) == 30 and fronts.holders.holder(1) == 100
    assert issubclass(FrontHeld, FrontOwned)


def test_a_successor_takes_over_once_the_holder_is_silent_and_fences_it() -> None:
    fronts = FrontTable(n_segments=1, lease_ms=1_000)
    fronts.register(1, 0, 10, floor=0, owner=7, session=100, now_ms=0)
    fronts.heartbeat(1, 20, owner=7, session=100, now_ms=500)
    fronts.register(1, 0, 40, floor=0, owner=7, session=200, now_ms=1_500)  # the successor
    assert fronts.holders.holder(1) == 200 and fronts.bound(0) == 40
    with pytest.raises(FrontOwned):  # the predecessor, alive after all, is fenced
        fronts.heartbeat(1, 50, owner=7, session=100, now_ms=1_600)
    live, done = fronts.export()
    copy = FrontTable(n_segments=1, lease_ms=1_000)
    copy.restore(live, done, *fronts.export_declared(), fronts.holders.export())
    with pytest.raises(FrontHeld):  # holders survive a snapshot
        copy.register(1, 0, 60, floor=0, owner=7, session=100, now_ms=2_000)
    copy.unregister(1, owner=7, session=200, now_ms=2_000)
    assert len(copy) == 0 and copy.holders.holder(1) is None
