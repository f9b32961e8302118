"""Stuck windows (rule 9): lost and duplicated items are reported where they happened."""

from __future__ import annotations

import numpy as np
import pytest

from lowtide.core.diagnostics import StuckDetector, StuckWindow
from lowtide.core.graph import SegmentGraph
from lowtide.core.messages import Ack, AckBatch, Heartbeat, RegisterFront
from lowtide.core.time import TimeGrid
from lowtide.core.tracker import Tracker, TrackerConfig

SRC, MID, SINK = 0, 1, 2
A, A1, B, B1, B2, C, C1, D, D1, D2 = (0xA0, 0xA1, 0xB0, 0xB1, 0xB2, 0xC0, 0xC1, 0xD0, 0xD1, 0xD2)
THRESHOLD_MS = 1_000


def acks(*rows: tuple[int, int, int, int]) -> AckBatch:
    return AckBatch.of(Ack(*r) for r in rows)


def pipeline() -> Tracker:
    """src -> mid -> sink, windows of 4 slots; items A (slot 5), B (slot 9), D (slot 6)
    went through src; B's grandchild B2 went all the way; D's grandchild D2 sits in
    the sink (in flight, or lost: the sink cannot tell while its bound is behind)."""
    graph = SegmentGraph.of(("src", ()), ("mid", ("src",)), ("sink", ("mid",)))
    tr = TrackerConfig(
        graph, grid=TimeGrid(window_slots=4), stuck_after_ms=THRESHOLD_MS, stuck_check_ms=100
    ).build()
    tr.register_front(RegisterFront(1, "src", 0))
    tr.apply(acks((SRC, 5, A, 1), (SRC, 9, B, 1), (SRC, 6, D, 1)))
    tr.heartbeat(Heartbeat(1, 16))
    tr.apply(acks((MID, 5, A1, 1), (SRC, 5, A, -1)))
    tr.apply(acks((MID, 9, B1, 1), (SRC, 9, B, -1)))
    tr.apply(acks((MID, 6, D1, 1), (SRC, 6, D, -1)))
    tr.apply(acks((SINK, 9, B2, 1), (MID, 9, B1, -1)))
    tr.apply(acks((SINK, 9, B2, -1)))
    tr.apply(acks((SINK, 6, D2, 1), (MID, 6, D1, -1)))
    return tr


def run(tr: Tracker, start: int, end: int) -> list[tuple[int, StuckWindow]]:
    """Step every 100 ms; (now, window) for every fresh stuck report."""
    return [(now, s) for now in range(start, end, 100) for s in tr.step(now).stuck]


def test_a_lost_item_is_reported_once_after_the_threshold_in_its_segment() -> None:
    tr = pipeline()  # A1 is lost in mid: sent, never received
    reports = run(tr, 0, 5_000)
    assert reports == [(1_000, StuckWindow("mid", 4, 8, count=1, xor=A1, since_ms=0))]
    stuck = reports[0][1]
    assert (stuck.missing, stuck.extra) == (1, 0)
    assert stuck.describe() == "segment 'mid', slots [4, 8): 1 item(s) missing"
    assert tr.stuck() == [stuck]
    # the sink's bound stops at mid's min time: D2 (slot 6) is not blamed on the sink
    assert tr.min_times() == (16, 4, 4)
    assert tr.open_windows("sink")[0].tolist() == [1]


def test_two_items_lost_in_one_window_are_counted() -> None:
    tr = pipeline()
    tr.apply(acks((SRC, 7, C, 1)))
    tr.apply(acks((MID, 7, C1, 1), (SRC, 7, C, -1)))  # C1 lost too, same window as A1
    reports = run(tr, 0, 3_000)
    assert [(now, s.segment, s.window_start, s.window_end, s.count) for now, s in reports] == [
        (1_000, "mid", 4, 8, 2)
    ]
    assert reports[0][1].xor == A1 ^ C1
    assert reports[0][1].missing == 2


def test_a_duplicated_item_is_reported_as_extra() -> None:
    tr = pipeline()
    tr.apply(acks((MID, 5, A1, -1)))  # A1 arrives after all: nothing lost any more ...
    tr.apply(acks((SINK, 9, B2, 1), (MID, 9, B1, -1)))  # ... but B1 is processed twice
    tr.apply(acks((SINK, 9, B2, -1)))  # (its duplicate child, same ack value, arrives)
    tr.apply(acks((SINK, 6, D2, -1)))
    reports = run(tr, 0, 3_000)
    assert reports == [(1_000, StuckWindow("mid", 8, 12, count=-1, xor=B1, since_ms=0))]
    stuck = reports[0][1]
    assert (stuck.missing, stuck.extra) == (0, 1)
    assert stuck.describe() == "segment 'mid', slots [8, 12): 1 extra item(s) (duplicates)"
    assert tr.min_times() == (16, 8, 8)


def test_the_clock_starts_when_the_bound_passes() -> None:
    tr = pipeline()
    tr.apply(acks((SRC, 17, 0xE0, 1)))  # an item at slot 17, window [16, 20)
    tr.apply(acks((MID, 17, 0xE1, 1), (SRC, 17, 0xE0, -1)))  # E1 lost in mid too
    assert [(now, s.window_start) for now, s in run(tr, 0, 2_000)] == [(1_000, 4)]
    tr.heartbeat(Heartbeat(1, 20))  # now mid's bound (src's min time) passes [16, 20)
    reports = run(tr, 2_000, 6_000)
    assert [(now, s.segment, s.window_start, s.since_ms) for now, s in reports] == [
        (3_000, "mid", 16, 2_000)
    ]
    assert [(s.segment, s.window_start) for s in tr.stuck()] == [("mid", 4), ("mid", 16)]


def test_nothing_is_reported_before_the_bound_passes_however_long() -> None:
    tr = pipeline()
    tr.apply(acks((MID, 5, A1, -1)))  # nothing lost
    tr.apply(acks((SINK, 6, D2, -1)))
    tr.apply(acks((SRC, 20, 0xF0, 1)))  # an item beyond every bound: in progress
    assert run(tr, 0, 100_000) == []
    assert tr.stuck() == []


def test_a_stuck_window_that_completes_is_forgotten() -> None:
    tr = pipeline()
    run(tr, 0, 1_100)
    assert [s.segment for s in tr.stuck()] == ["mid"]
    tr.apply(acks((MID, 5, A1, -1)))  # the late item arrives
    tr.step(1_200)
    assert tr.stuck() == []
    assert tr.min_time("mid") == 16
    assert tr.min_time("sink") == 4  # D2 is still in the sink (and will be stuck there)


def test_detector_reports_once_and_again_after_reopening() -> None:
    d = StuckDetector(threshold_ms=100)
    w, x, c = np.array([7]), np.array([5], np.uint64), np.array([2])
    none = (np.array([], np.int64), np.array([], np.uint64), np.array([], np.int64))
    assert d.observe(1_000, {"parse": (w, x, c)}, window_slots=10) == []
    fresh = d.observe(1_100, {"parse": (w, x, c)}, window_slots=10)
    assert fresh == [StuckWindow("parse", 70, 80, count=2, xor=5, since_ms=1_000)]
    assert d.observe(1_200, {"parse": (w, x, c)}, window_slots=10) == []
    assert d.current() == fresh
    assert d.observe(1_300, {"parse": none}, window_slots=10) == []
    assert d.current() == []
    assert d.observe(1_400, {"parse": (w, x, c)}, window_slots=10) == []  # the clock restarts
    assert d.observe(1_500, {"parse": (w, x, c)}, window_slots=10)[0].since_ms == 1_400


def test_detector_threshold_zero_and_sorting() -> None:
    d = StuckDetector(threshold_ms=0)
    open_ = {
        "b": (np.array([3, 1]), np.array([1, 2], np.uint64), np.array([0, -1])),
        "a": (np.array([3]), np.array([4], np.uint64), np.array([1])),
    }
    fresh = d.observe(5, open_, window_slots=1)
    assert len(fresh) == 3
    assert [(s.segment, s.window_start) for s in d.current()] == [("b", 1), ("a", 3), ("b", 3)]
    disagree = next(s for s in fresh if s.count == 0)
    assert (disagree.missing, disagree.extra) == (0, 0)
    assert disagree.describe().endswith("acks disagree (same count, different values)")
    with pytest.raises(ValueError):
        StuckDetector(threshold_ms=-1)
